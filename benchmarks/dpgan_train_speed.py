"""DPGAN training speed of the `make run` recipe, one grad_sample_mode against another (CPU).

Two trainers of ``configs/dpgan-mnist-cpu.yaml`` on the bundled MNIST, identical but for
``train.grad_sample_mode``, take turns: one round is ``n_d`` discriminator steps (Poisson batch,
fakes from G, the private step) and one generator step per trainer, the order alternating. The
warm-up is skipped (it does not depend on the mode). Reported: discriminator steps per second
(median over rounds, by wall time and by the process's CPU time) and the median over rounds of the
time ratios.

A mode ``ghost@REV`` is ``ghost`` with ``mechanisms/ghost.py`` as it was at git revision REV (before/after
in one process: ``modes=ghost@736ab55 ghost``).

    .venv/stage/bin/python benchmarks/run.py train-speed   # the suite in benchmarks/suites.toml; arguments: measure()
"""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch

from dpsynth.config import load_config
from dpsynth.data import import_source
from dpsynth.methods.dpgan import DPGANTrainer, d_step, g_step
from dpsynth.mechanisms import dpsgd

ROOT = Path(__file__).resolve().parents[1]


def ghost_at(rev: str, tmp: str):
    """``mechanisms/ghost.py`` from git revision ``rev``, imported as its own module."""
    text = subprocess.run(["git", "show", f"{rev}:components/dpsynth/mechanisms/ghost.py"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout
    path = Path(tmp) / f"ghost_{rev}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"ghost_{rev}", path)
    engine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engine)
    return engine


def measure(*, modes: tuple[str, str] = ("ew", "ghost"), rounds: int = 12, threads: int = 1) -> dict:
    """Discriminator steps/s of the two train.grad_sample_mode values ``modes`` (``ghost@REV``: the ghost engine of
    that git revision), ``rounds`` timed rounds after one untimed, alternating."""
    args = SimpleNamespace(modes=list(modes), rounds=rounds, threads=threads)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    data = import_source(str(ROOT / "data" / "mnist"))
    trainers, engines = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for i, mode in enumerate(args.modes):
            base, _, rev = mode.partition("@")
            cfg = load_config(ROOT / "configs" / "dpgan-mnist-cpu.yaml", overrides=[
                f"output.dir={tmp}/{i}", "tracking.enabled=false", f"train.grad_sample_mode={'ew' if rev else base}"])
            if rev and base != "ghost":
                raise SystemExit(f"--modes: only ghost@REV has a revision, got {mode!r}")
            trainer = DPGANTrainer(cfg, data)
            if rev:  # built with 'ew' (no hooks on D), then D wrapped by the ghost engine of that revision
                engines.append(ghost_at(rev, tmp).GhostClipping)
                trainer.state.D_private = engines[-1](trainer.state.D)
                trainer.sanitizer.module = trainer.state.D_private
            trainers[mode] = trainer
        if engines:  # the sanitizer is told to accept those engines too (in this process only)
            dpsgd.GhostClipping = (dpsgd.GhostClipping, *engines)
        n_d = int(cfg.train.n_d)
        times = {m: [] for m in trainers}
        cpu = {m: [] for m in trainers}
        for k in range(args.rounds + 1):
            for mode in (args.modes if k % 2 == 0 else args.modes[::-1]):
                t0, c0 = time.perf_counter(), time.process_time()
                t = trainers[mode]
                for _ in range(n_d):
                    d_step(t.state, t.draw(), t.sanitizer, chunk=t.cfg.train.physical_batch_size)
                g_step(t.state, t.cfg.train.batch_size)
                if k:
                    times[mode].append(time.perf_counter() - t0)
                    cpu[mode].append(time.process_time() - c0)
    for mode in trainers:
        print(f"{mode}: {n_d / statistics.median(times[mode]):.2f} discriminator steps/s "
              f"({n_d / statistics.median(cpu[mode]):.2f} per CPU second)")
    a, b = args.modes
    for label, t in (("wall", times), ("CPU", cpu)):
        print(f"{label} time {a} / {b}, median over {args.rounds} rounds: "
              f"{statistics.median(x / y for x, y in zip(t[a], t[b])):.2f}")
    return {"discriminator_steps_per_s": {m: n_d / statistics.median(times[m]) for m in trainers},
            "per_cpu_s": {m: n_d / statistics.median(cpu[m]) for m in trainers},
            "wall_ratio": statistics.median(x / y for x, y in zip(times[a], times[b])),
            "cpu_ratio": statistics.median(x / y for x, y in zip(cpu[a], cpu[b]))}

