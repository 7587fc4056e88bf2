"""Cost of ``privacy.secure_mode`` (dpsynth.mechanisms.randomness) against the default mechanism coins.

Two measurements, each default vs secure, interleaved round-robin in one process (the order
alternates every round, so background load hits both alike); reported are the median seconds
and the median over rounds of (secure time / default time in the same round):

* ``noise``: ``GradientSanitizer.finalize()`` alone with zero sums, i.e. the Gaussian noise of one
  step for the paper's DCGAN discriminator (width 128, 1.72M parameters): default 1 draw per
  coordinate; secure 4 draws / 2 plus an ``os.urandom`` reseed per parameter tensor.
* ``step``: one whole DPGAN discriminator step (``methods/dpgan.d_step``: Poisson mask,
  B fakes, per-example clipping, noise, Adam) on 600 MNIST records at the given width and batch.

    .venv/stage/bin/python benchmarks/run.py secure-noise   # the suite in benchmarks/suites.toml; arguments: measure()
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from dpsynth.config import load_config
from dpsynth.data import import_source
from dpsynth.methods.dpgan import DPGANTrainer, d_step
from dpsynth.models.dcgan import Discriminator, count_parameters
from dpsynth.mechanisms.dpsgd import GradientSanitizer
from dpsynth.mechanisms.randomness import MechanismRandomness

MNIST = Path(__file__).resolve().parents[1] / "data" / "mnist"


def interleaved(fns: dict, *, repeats: int, warmup: int) -> dict:
    times = {k: [] for k in fns}
    names = list(fns)
    for r in range(warmup + repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            started = time.perf_counter()
            fns[name]()
            if r >= warmup:
                times[name].append(time.perf_counter() - started)
    ratios = [s / d for s, d in zip(times["secure"], times["default"])]
    return {"median_seconds": {k: statistics.median(v) for k, v in times.items()},
            "secure_over_default": statistics.median(ratios), "repeats": repeats}


def measure(*, width: int = 128, batch_size: int = 64, repeats: int = 7, warmup: int = 2, threads: int = 2) -> dict:
    """The noise draw and one D step with default and with secure randomness, interleaved."""
    args = SimpleNamespace(width=width, batch_size=batch_size, repeats=repeats, warmup=warmup, threads=threads)
    torch.set_num_threads(args.threads)

    D = Discriminator(num_classes=10, width=128)
    sanitizers = {mode: GradientSanitizer(list(D.parameters()), max_grad_norm=1.0, noise_multiplier=1.0,
                                          expected_batch_size=128.0,
                                          randomness=MechanismRandomness(secure_mode=mode == "secure"))
                  for mode in ("default", "secure")}
    noise = interleaved({m: s.finalize for m, s in sanitizers.items()}, repeats=args.repeats * 3, warmup=args.warmup)
    noise["parameters"] = count_parameters(D)

    data = import_source(str(MNIST)).subset(np.arange(600))
    trainers = {}
    for mode in ("default", "secure"):
        cfg = load_config(overrides=[
            "tracking.enabled=false", f"train.d_width={args.width}", f"train.g_width={args.width}",
            f"train.batch_size={args.batch_size}", "train.steps=1000", "privacy.epsilon=1000", "privacy.delta=1e-4",
            "privacy.noise_multiplier=1.0", "train.device=cpu", f"privacy.secure_mode={str(mode == 'secure').lower()}"])
        trainers[mode] = DPGANTrainer(cfg, data)
    step = interleaved({m: lambda t=t: d_step(t.state, t.draw(), t.sanitizer) for m, t in trainers.items()}, repeats=args.repeats,
                       warmup=args.warmup)
    step.update(width=args.width, batch_size=args.batch_size)

    report = {"noise": noise, "step": step, "threads": args.threads, "torch": torch.__version__}
    print(json.dumps(report, indent=2))
    return report
