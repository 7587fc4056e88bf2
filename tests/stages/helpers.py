"""Shared by the stage tests: a tiny, fast configuration and a way to call the CLI in-process."""

from __future__ import annotations

import json
import os
from pathlib import Path
import shutil
import sys

from dpsynth import storage
from dpsynth.cli import main

MNIST = Path(__file__).resolve().parents[2] / "data" / "mnist"
KEY = "dpsynth-partition-v1"  # the shipped configs' partition key (the demo's, public; partition.key has no default)
# DPGAN at CPU-test size: 12 private steps at (ε, δ) = (10, 1e-4) on ~550 records; evaluate at its smallest
# (its defaults, a reference CNN of 150 batches and 5 epochs per classifier, made it most of a pipeline's time).
TINY = (
    "train.d_width=4", "train.g_width=4", "train.latent_dim=12", "train.batch_size=32", "train.steps=12",
    "train.n_d=2", "privacy.epsilon=10", "privacy.delta=1e-4", "sample.num_samples=200",
    "evaluate.epochs=1", "evaluate.feature_steps=5", "evaluate.mia_generated=200",
    "output.log_every=0", "output.sample_every=0", "output.checkpoint_every=0", "tracking.enabled=false",
    # the empirical audit is on by default (audit.empirical=auto); its own tests (tests/audit/test_empirical_stage.py)
    # run it, and the other stage tests, which name the checks that fail, keep their runs short without it
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


def pristine_run(tmp_path_factory, source: str, *names: str, overrides=()):
    """Run the stages ``names`` once, in a run directory of their own with a ledger of their own, and keep a
    copy; returns ``restore()``, which puts that copy back in place and returns the run directory.

    A test gets a run directory byte for byte as the stages left it, at the path the stages wrote into its
    manifests (manifests hold absolute URIs and each other's sha256, so a copy elsewhere would be another
    run), without training again; what one test changes in it, the next one does not see (tests run one at
    a time in a session)."""
    import pytest

    from dpsynth.ledger.store import Ledger

    home = tmp_path_factory.mktemp("pristine-" + "-".join(names))
    run, kept = home / "run", home / "kept"
    url = f"sqlite:///{home / 'ledger.db'}"  # set up before conftest's per-test ledger
    Ledger(url).set_budget("mnist600", epsilon=1000.0, delta=1e-3, reason="tests/stages/helpers.py")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPSYNTH_LEDGER_URL", url)
        stages(run, source, *names, overrides=overrides)
    shutil.copytree(run, kept, symlinks=True)

    def restore():
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(kept, run, symlinks=True)
        return run

    return restore


def start(*argv, stderr=None):
    """``dpsynth ARGV`` in a new OS process, forked by the tests' one fork server
    (tests/methods/distributed_workers.py's ``start_process``: torch and dpsynth imported once per test process):
    a real process to kill or signal, without the several CPU-seconds a new interpreter takes to import them. It
    gets this process's environment as it is now, writes its stdout to /dev/null and its stderr to the file
    ``stderr`` (/dev/null when None); ``.exitcode`` is ``main``'s return value. Returns the started
    ``multiprocessing.Process``."""
    from tests.methods import distributed_workers as workers

    (process,) = workers.start_process(_main_in_child, [str(a) for a in argv], str(stderr or os.devnull)).processes
    return process


def _main_in_child(argv: list[str], stderr: str) -> None:
    out, err = os.open(os.devnull, os.O_WRONLY), os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(err, 2)
    sys.exit(main(argv))
