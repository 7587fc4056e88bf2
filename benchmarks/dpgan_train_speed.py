"""DPGAN training speed of the `make run` recipe, one grad_sample_mode against another (CPU).

Two trainers of ``configs/dpgan-mnist-cpu.yaml`` on the bundled MNIST, identical but for
``train.grad_sample_mode``, take turns: one round is ``n_d`` discriminator steps (Poisson batch,
fakes from G, the private step) and one generator step per trainer, the order alternating. The
warm-up is skipped (it does not depend on the mode). Reported: discriminator steps per second
(median over rounds) and the median over rounds of the time ratio.

    python benchmarks/dpgan_train_speed.py [--modes ew ghost] [--rounds 12] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from dpsynth.config import load_config
from dpsynth.data import import_source
from dpsynth.methods.dpgan import DPGANTrainer

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", nargs=2, default=["ew", "ghost"], help="the two train.grad_sample_mode values")
    ap.add_argument("--rounds", type=int, default=12, help="timed rounds (one untimed first)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    data = import_source(str(ROOT / "data" / "mnist"))
    trainers = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes:
            cfg = load_config(ROOT / "configs" / "dpgan-mnist-cpu.yaml", overrides=[
                f"output.dir={tmp}/{mode}", "tracking.enabled=false", f"train.grad_sample_mode={mode}"])
            trainers[mode] = DPGANTrainer(cfg, data)
        n_d = int(cfg.train.n_d)
        times = {m: [] for m in trainers}
        for k in range(args.rounds + 1):
            for mode in (args.modes if k % 2 == 0 else args.modes[::-1]):
                t0 = time.perf_counter()
                for _ in range(n_d):
                    trainers[mode].discriminator_step()
                trainers[mode].generator_step()
                if k:
                    times[mode].append(time.perf_counter() - t0)
    for mode, t in times.items():
        print(f"{mode}: {n_d / statistics.median(t):.2f} discriminator steps/s")
    a, b = args.modes
    print(f"time {a} / {b}, median over {args.rounds} rounds: "
          f"{statistics.median(x / y for x, y in zip(times[a], times[b])):.2f}")


if __name__ == "__main__":
    main()
