"""How much of a run's utility is the generator's fit, not the release? (CPU, one thread; not a test)

Makes the default recipe's warm-up releases once (``dpsynth.warmup.fit.release``, fresh secret noise:
a measurement, nothing is released or logged) on the training shard of a finished ``utility.py`` run
directory, then fits ``fits`` generators to that same release (``warmup.fit_generator``, post-processing;
generator seeds 0 … K − 1) and scores each, and the mixture that draws record i from generator
⌊i / 10⌋ mod K (10,000 records, classes balanced), as the evaluate stage scores a release: the CNN trained
on the synthetic records (epoch chosen on synthetic validation), tested on the held-out half of the
partition's hold-out. No private GAN step is taken: these are warm-up generators.

    .venv/stage/bin/python benchmarks/run.py warmup-refits   # the suite in benchmarks/suites.toml; arguments: measure()

RUN_DIR is a ``utility.py --out`` run directory (…/dpgan-mnist-cpu-eps10): its
``sensitive/partition/{shard-*,heldout}.parquet`` are read. Results (2026-11-26) are in
``benchmarks/README.md`` and ``benchmarks/results/utility-refits-mnist-cpu.md``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from dpsynth.config import load_config
from dpsynth.data.dataset import ImageDataset, read_parquet
from dpsynth.evaluation import accuracy
from dpsynth.warmup import fit as warmup
from dpsynth.models.dcgan import Generator
from dpsynth.privacy import MechanismTrace
from dpsynth.mechanisms.randomness import MechanismRandomness
from dpsynth.stages.evaluate import _split
from dpsynth.stages.sample import synthesize
from utility import ROOT, heldout_split  # the evaluate stage's halves of a run's hold-out


def measure(*, run_dir: str, fits: int = 4, config: str = "configs/dpgan-mnist-cpu.yaml") -> list[dict]:
    """The warm-up release of ``config`` on a utility run's training records (``run_dir``), ``fits`` generators
    fitted to it, and a mixture of their samples, each scored on the run's held-out records."""
    a = SimpleNamespace(run_dir=Path(run_dir), fits=fits, config=ROOT / config)
    rows = []
    torch.set_num_threads(1)
    cfg = load_config(a.config)
    t, w = cfg.train, cfg.warmup
    x, y = read_parquet(next((a.run_dir / "sensitive/partition").glob("shard-*.parquet"))).to_tensors()
    slots, directions, _ = warmup.release(cfg, x, y, num_classes=10, randomness=MechanismRandomness(),
                                       trace=MechanismTrace())
    fit_real, test_real = heldout_split(a.run_dir, cfg)

    def score(synthetic: ImageDataset) -> float:
        e = dataclasses.replace(cfg.evaluate, max_train_records=None)
        val_idx, train_idx = _split(len(synthetic), fraction=e.validation_fraction, seed=e.seed)
        return accuracy.evaluate("cnn", dataclasses.replace(cfg, evaluate=e), synthetic=synthetic.subset(train_idx),
                                 validation=synthetic.subset(val_idx), fit_real=fit_real, test_real=test_real)["gen2real"]

    def emit(row: dict) -> None:
        row = {"run_dir": str(a.run_dir), **row}
        print(json.dumps(row), flush=True)
        rows.append(row)

    sets = []
    for k in range(a.fits):
        start = time.process_time()
        torch.manual_seed(k)
        G = Generator(num_classes=10, channels=1, image_size=28, width=t.g_width, latent_dim=t.latent_dim,
                      styles=warmup.style_slots(cfg), warp=t.g_warp, contrast=t.g_contrast)
        warmup.fit_generator(G, slots, steps=w.steps, batch_size=w.batch_size, lr=w.lr,
                             generator=torch.Generator().manual_seed(k), directions=directions)
        sets.append(synthesize(G.eval(), num_samples=10000, seed=k))
        emit({"fit": k, "cnn_gen2real": score(sets[-1]), "cpu_s": round(time.process_time() - start, 1)})
    pick = (np.arange(10000) // 10) % a.fits
    images = np.stack([sets[p].images[i] for i, p in enumerate(pick)])
    mixture = ImageDataset(record_ids=[f"mixture:{i:07d}" for i in range(10000)], labels=sets[0].labels,
                           images=images, splits=None, num_classes=10, source=f"a mixture of {a.fits} warm-up fits")
    emit({"mixture": a.fits, "cnn_gen2real": score(mixture)})
    return rows
