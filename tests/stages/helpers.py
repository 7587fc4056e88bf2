"""Shared by the stage tests: a tiny, fast configuration and a way to call the CLI in-process."""

from __future__ import annotations

import json
from pathlib import Path

from dpsynth import storage
from dpsynth.cli import main

MNIST = Path(__file__).resolve().parents[2] / "data" / "mnist"
KEY = "dpsynth-partition-v1"  # the shipped configs' partition key (the demo's, public; partition.key has no default)
# DPGAN at CPU-test size: 12 private steps at (ε, δ) = (10, 1e-4) on ~550 records.
TINY = (
    "train.d_width=4", "train.g_width=4", "train.latent_dim=12", "train.batch_size=32", "train.steps=12",
    "train.n_d=2", "privacy.epsilon=10", "privacy.delta=1e-4", "sample.num_samples=200",
    "output.log_every=0", "output.sample_every=0", "output.checkpoint_every=0", "tracking.enabled=false",
    # the empirical audit is on by default (audit.empirical=auto); its own tests (test_audit_empirical.py) run
    # it, and the other stage tests, which name the checks that fail, keep their runs short without it
    "audit.empirical=off",
    f"partition.key={KEY}", "data.num_classes=10",  # no defaults: the demo's public key, MNIST's classes
    "ledger.population_id=mnist600",  # last (a test drops it)
)


def settings(source: str, *overrides: str) -> list[str]:
    return [arg for item in (f"data.uri={source}", *TINY, *overrides) for arg in ("--set", item)]


def dpsynth(*argv) -> int:
    return main([str(a) for a in argv])


def stage(name: str, run_dir, source: str, *overrides: str, flags=()) -> int:
    """``dpsynth NAME --run-dir RUN_DIR --set ...``; returns the exit code."""
    return dpsynth(name, "--run-dir", run_dir, *settings(source, *overrides), *flags)


def stages(run_dir, source: str, *names: str, overrides=()) -> None:
    for name in names:
        assert stage(name, run_dir, source, *overrides) == 0, name


def manifest(run_dir, zone: str, name: str) -> dict:
    return json.loads(storage.read_bytes(storage.join(str(run_dir), zone, name, "manifest.json")))


def release_files(run_dir) -> list[str]:
    """Paths under the release zone, relative to it ([] when it does not exist)."""
    root = storage.join(str(run_dir), "release")
    if not storage.is_remote(root) and not Path(root).exists():
        return []
    return [u[len(root) + 1:] for u in storage.list_uris(root)]
