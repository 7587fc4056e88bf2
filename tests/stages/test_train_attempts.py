"""The train stage across attempts, as real processes: a killed attempt's leftovers are never released (#33 item 6)
and a re-run of a killed run resumes its checkpoint under the killed attempt's reservation (#34 item 3)."""

import signal
import subprocess
import sys
import time

import torch

from dpsynth import storage
from tests.stages.helpers import manifest, settings, stages

LONG = ("train.steps=300", "output.checkpoint_every=20")


def cli(*argv):
    return [sys.executable, "-m", "dpsynth.cli", *map(str, argv)]


def kill_once(args, path, *, timeout=300):
    """Start ``args``, SIGKILL it once ``path`` exists."""
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert path.exists(), f"{path} never appeared"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_snapshots_of_an_earlier_attempt_are_not_listed(tmp_path, source, ledger_with_budget):
    run = tmp_path / "run"
    stages(run, source, "partition", "warmstart", overrides=LONG)
    train_dir = run / "sensitive" / "train"
    first = train_dir / "checkpoints" / "snapshots" / "generator-0000020.pt"
    kill_once(cli("train", "--run-dir", run, *settings(source, *LONG)), first)
    stale = sorted((train_dir / "checkpoints" / "snapshots").glob("generator-*.pt"))
    assert stale  # the killed attempt's generator snapshots (every 20 steps)
    # a restart that does not resume, checkpointing every 50 steps
    again = settings(source, "train.steps=300", "output.checkpoint_every=50", "output.resume=false")
    done = subprocess.run(cli("train", "--run-dir", run, *again), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    listed = manifest(run, "sensitive", "train")["outputs"]
    snaps = [o["uri"] for o in listed if o["role"] == "generator_snapshot"]
    steps = sorted(int(u.rsplit("generator-", 1)[1][:-3]) for u in snaps)
    assert steps == list(range(50, 301, 50)), steps  # this run's only: none of the killed attempt's
    for uri in snaps:  # each bound to this run's trace, at its own step
        privacy = torch.load(storage.local_path(uri), weights_only=False)["privacy"]
        assert privacy["step"] % 50 == 0
    assert not [p for p in stale if p.exists() and int(p.stem.split("-")[1]) % 50]
