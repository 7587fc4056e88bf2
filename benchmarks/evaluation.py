"""CPU benchmark: the cost of each evaluation metric for N generated 28×28 samples (default 60k).

The generated records come from a label-conditioned DCGAN generator (``generator_width``,
128 as the paper's by default; untrained — content does not change the cost of a metric much, except
for the iterative classifiers, which stop when they converge). The real reference data is the
bundled MNIST test set (10,000 records), split in halves as ``dpsynth evaluate`` splits it.
The membership-inference members and non-members are 500 records each of that set (the
numbers are meaningless here; only the time is measured).

Each metric is timed once, in one process, with ``time.process_time`` (CPU seconds of every
thread of the process) and wall time; ``threads`` sets torch's threads. The gen2real row of
a classifier includes training it on the generated data (capped at ``max_train_records``,
as ``evaluate.max_train_records`` caps it), its real baseline and real2gen.

    .venv/stage/bin/python benchmarks/run.py evaluation-cost   # the suite in benchmarks/suites.toml; arguments: measure()
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from dpsynth.config import load_config
from dpsynth.data import import_source
from dpsynth.evaluation import accuracy, fid, mia, scores
from dpsynth.evaluation.classifiers import ReferenceClassifier
from dpsynth.models.dcgan import Generator
from dpsynth.stages.evaluate import _cap, _split
from dpsynth.stages.sample import synthesize

MNIST = Path(__file__).resolve().parents[1] / "data" / "mnist"


def timed(results: list, name: str, fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    results.append({"metric": name, "cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - t0})
    print(f"{name:<34} cpu {results[-1]['cpu_s']:9.1f} s   wall {results[-1]['wall_s']:8.1f} s", flush=True)
    return out


def measure(*, num_samples: int = 60000, classifiers: str = "logreg,cnn,mlp", max_train_records: int = 20000,
            feature_steps: int = 150, threads: int = 2, generator_width: int = 128) -> dict:
    """CPU seconds of each metric of the evaluate stage on ``num_samples`` generated images (``classifiers``:
    comma-separated names, or 'full'; ``generator_width``: only the generation row depends on it)."""
    a = SimpleNamespace(num_samples=num_samples, classifiers=classifiers, max_train_records=max_train_records,
                        feature_steps=feature_steps, threads=threads, generator_width=generator_width)
    torch.set_num_threads(a.threads)
    names = accuracy.FULL_SUITE if a.classifiers == "full" else tuple(a.classifiers.split(","))
    cfg = load_config(overrides=[f"evaluate.max_train_records={a.max_train_records}",
                                 f"evaluate.feature_steps={a.feature_steps}"])
    e = cfg.evaluate
    real = import_source(MNIST)
    results: list[dict] = []
    torch.manual_seed(0)
    generator = Generator(num_classes=10, width=a.generator_width, latent_dim=100).eval()
    synthetic = timed(results, f"generate {a.num_samples} samples", lambda: synthesize(
        generator, num_samples=a.num_samples, seed=0))
    fit_idx, test_idx = _split(len(real), fraction=0.5, seed=e.seed)
    fit_real, test_real = real.subset(fit_idx), real.subset(test_idx)
    val_idx, train_idx = _split(len(synthetic), fraction=e.validation_fraction, seed=e.seed)
    train, validation = _cap(synthetic.subset(train_idx), e.max_train_records, seed=e.seed), synthetic.subset(val_idx)

    clf = timed(results, "reference CNN (train on 5k real)", lambda: ReferenceClassifier(
        fit_real, steps=e.feature_steps, seed=e.seed))
    space = fid.feature_space(None, clf)
    timed(results, "fid_classifier", lambda: fid.distance(space.features(test_real), space.features(synthetic)))
    timed(results, "inception score", lambda: scores.inception_score(clf.probabilities(synthetic)))
    timed(results, "js score", lambda: scores.js_score(clf.features(test_real), clf.features(synthetic), seed=e.seed))
    rows = {}
    for name in names:
        rows[name] = timed(results, f"gen2real+real+real2gen {name}", lambda: accuracy.evaluate(
            name, cfg, synthetic=train, validation=validation, fit_real=fit_real, test_real=test_real))
    timed(results, f"membership inference ({a.num_samples} gen.)", lambda: mia.attack(
        synthetic, members=real.subset(np.arange(500)), nonmembers=real.subset(np.arange(500, 1000))))
    total = sum(r["cpu_s"] for r in results)
    print(f"{'total':<34} cpu {total:9.1f} s")
    return {"results": results, "skipped": [n for n, r in rows.items() if "skipped" in r],
            "torch": torch.__version__, "machine": platform.processor() or platform.machine()}
