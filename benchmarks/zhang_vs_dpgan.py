"""CPU benchmark: dp-GAN (Zhang et al.) against DPGAN (Bie et al.) at equal (ε, δ) on the bundled MNIST.

The 10,000 bundled images are split by the partition stage's keyed hash: 10% held out (the test
set of every classifier here), 2% public (the paper's 2:98 ratio), the rest private. Both methods
train on the same private records with the same expected batch B, the same number T of private
discriminator/critic steps and noise calibrated so that T steps spend exactly ≤ (ε, δ); dp-GAN
may also use the public records (pre-training, clipping bounds), which DPGAN cannot.

Utility: sample N labelled images (classes balanced) from each generator, fit a logistic
regression on them, report its accuracy on the held-out real images. Two references put the
numbers in context: the same classifier fit on the public records alone (what the public data
give without any private training) and on the private records themselves (no privacy).
Time: wall-clock seconds of each training (pre-training reported separately), in one process.

    .venv/stage/bin/python benchmarks/run.py zhang-vs-dpgan   # the suite in benchmarks/suites.toml; arguments: measure()
"""

from __future__ import annotations

import json
import platform
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression

from dpsynth.config import load_config
from dpsynth.data import import_source
from dpsynth.stages.partition import HELDOUT, PUBLIC, assign

MNIST = Path(__file__).resolve().parents[1] / "data" / "mnist"
KEY = "dpsynth-benchmark"

VARIANTS = {
    "dpgan": ["train.method=dpgan"],
    # Algorithm 3 as in the paper: pre-training, adaptive bounds every step, clustering into k = 5
    "zhang": ["train.method=zhang"],
    "zhang-no-warm": ["train.method=zhang", "zhang.pretrain_iterations=0"],
    "zhang-global": ["train.method=zhang", "zhang.grouping=global"],
}


def split(ds, *, heldout: float, public: float):
    where = assign(ds.record_ids, key=KEY, heldout_fraction=heldout, num_shards=1, public_fraction=public)
    return ds.subset(where >= 0), ds.subset(where == PUBLIC), ds.subset(where == HELDOUT)


def flat(images: np.ndarray) -> np.ndarray:
    return images.reshape(len(images), -1).astype(np.float32) / 255.0


def accuracy(train_x, train_y, test) -> float:
    clf = LogisticRegression(max_iter=300)
    clf.fit(train_x, train_y)
    return float((clf.predict(flat(test.images)) == test.labels).mean())


@torch.no_grad()
def synthetic(generator_path: str, n: int, *, num_classes: int, seed: int):
    from dpsynth.models.dcgan import Generator

    saved = torch.load(generator_path, map_location="cpu", weights_only=False)
    kwargs = {k: v for k, v in saved["model"].items() if k != "class"}
    G = Generator(**kwargs)
    G.load_state_dict(saved["state_dict"])
    G.eval()
    labels = torch.arange(n) % num_classes
    x, _ = G.sample(n, labels=labels, generator=torch.Generator().manual_seed(seed))
    images = ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return images, labels.numpy()


def run_variant(name: str, args, private, public, workdir: Path) -> dict:
    from dpsynth.methods.dpgan import DPGANTrainer
    from dpsynth.methods.pretraining import pretrain
    from dpsynth.methods.networks import load_pretrained
    from dpsynth.methods.zhang import ZhangTrainer

    overrides = [
        f"privacy.epsilon={args.epsilon}", f"privacy.delta={args.delta}", f"train.steps={args.steps}",
        f"train.batch_size={args.batch_size}", f"train.d_width={args.width}", f"train.g_width={args.width}",
        "data.heldout_fraction=0.1", "data.public_fraction=0.02", f"partition.key={KEY}",
        f"output.dir={workdir / name}", "output.checkpoint_every=0", "output.sample_every=0", "output.log_every=0",
        "tracking.enabled=false", f"train.seed={args.seed}", *VARIANTS[name],
    ]
    cfg = load_config(overrides=overrides)
    out = {"variant": name, "pretrain_seconds": 0.0}
    torch.manual_seed(args.seed)
    if cfg.train.method == "dpgan":
        trainer = DPGANTrainer(cfg, private)
    else:
        state = None
        if cfg.zhang.pretrain_iterations:
            started = time.monotonic()
            path = workdir / f"{name}-warm.pt"
            pretrain(cfg, public, out_path=str(path))
            out["pretrain_seconds"] = time.monotonic() - started
            state = load_pretrained(path.read_bytes())
        trainer = ZhangTrainer(cfg, private, public=public, pretrained_state=state)
    started = time.monotonic()
    result = trainer.train()
    out.update(train_seconds=time.monotonic() - started, epsilon=result.epsilon, steps=result.steps,
               generator_steps=result.generator_steps, noise_multiplier=result.noise_multiplier,
               sample_rate=result.sample_rate, generator_path=result.generator_path)
    return out


def measure(*, epsilon: float = 4.0, delta: float = 1e-5, steps: int = 600, batch_size: int = 64, width: int = 32,
            samples: int = 5000, variants: str = "dpgan,zhang,zhang-no-warm", threads: int = 2, seed: int = 0) -> dict:
    """Each of ``variants`` at (``epsilon``, ``delta``) for ``steps`` private steps; logistic regression on
    ``samples`` synthetic images, tested on held-out real images."""
    args = SimpleNamespace(epsilon=epsilon, delta=delta, steps=steps, batch_size=batch_size, width=width,
                           samples=samples, variants=variants, threads=threads, seed=seed)
    torch.set_num_threads(args.threads)
    started = time.monotonic()

    ds = import_source(str(MNIST))
    private, public, heldout = split(ds, heldout=0.1, public=0.02)
    print(f"records: private {len(private)}, public {len(public)}, held-out {len(heldout)}", flush=True)
    rows = [
        {"variant": "real private data (no privacy)", "accuracy": accuracy(flat(private.images), private.labels, heldout)},
        {"variant": "real public data only", "accuracy": accuracy(flat(public.images), public.labels, heldout)},
    ]
    with tempfile.TemporaryDirectory(prefix="zhang-bench-") as tmp:
        for name in args.variants.split(","):
            r = run_variant(name, args, private, public, Path(tmp))
            x, y = synthetic(r.pop("generator_path"), args.samples, num_classes=ds.num_classes, seed=args.seed)
            r["accuracy"] = accuracy(flat(x), y, heldout)
            rows.append(r)
            print(json.dumps(r), flush=True)
    print(f"\n(ε, δ) = ({args.epsilon}, {args.delta}); T = {args.steps} private steps, B = {args.batch_size}, "
          f"width {args.width}; logistic regression on {args.samples} synthetic images, tested on "
          f"{len(heldout)} held-out real images")
    print(f"{'variant':34s} {'accuracy':>8s} {'ε spent':>8s} {'σ/step':>7s} {'G steps':>7s} {'warm s':>7s} {'train s':>8s}")
    for r in rows:
        if "epsilon" in r:
            print(f"{r['variant']:34s} {r['accuracy']:8.3f} {r['epsilon']:8.3f} {r['noise_multiplier']:7.3f} "
                  f"{r['generator_steps']:7d} {r['pretrain_seconds']:7.1f} {r['train_seconds']:8.1f}")
        else:
            print(f"{r['variant']:34s} {r['accuracy']:8.3f}")
    wall = time.monotonic() - started
    print(f"wall time {wall:.0f} s")
    return {"rows": rows, "wall_seconds": wall, "torch": torch.__version__, "python": platform.python_version()}
