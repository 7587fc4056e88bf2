"""The train stage across attempts: a killed attempt's leftovers are never released (#33 item 6) and a re-run of a
killed run resumes its checkpoint under the killed attempt's reservation (#34 item 3). The killed attempt is a real
process (forked by a fork server that imported torch and dpsynth once: tests/stages/helpers.py's start), SIGKILLed;
the re-run is the same command line, through the CLI's ``main`` in this process (starting a
Python process that imports torch costs more than the rest of a re-run)."""

import os
import signal
import sys
import time

import torch

from dpsynth import storage
from tests.stages.helpers import dpsynth, manifest, settings, stages, start

# Long enough that a process killed at its first checkpoint (step 20) still had 20 steps to go (about a CPU-second,
# far more than the 0.05 s between two looks for the checkpoint), short enough that the re-run finishing them is cheap.
STEPS = 40
LONG = (f"train.steps={STEPS}", "output.checkpoint_every=20")


def cli(*argv):
    return [sys.executable, "-m", "dpsynth.cli", *map(str, argv)]


def rerun(args, capsys) -> None:
    """The command line ``args`` (``cli(...)``) again, in this process; it succeeds."""
    capsys.readouterr()
    code = dpsynth(*args[3:])
    assert code == 0, capsys.readouterr().err[-3000:]


def kill_once(args, path, *, timeout=300):
    """Start ``args`` (a process forked by the fork server, helpers.start: the same command line, without a new
    interpreter's imports), SIGKILL it once ``path`` (a file or an S3 object) exists."""
    proc = start(*args[3:])
    deadline = time.monotonic() + timeout
    while not storage.exists(path) and time.monotonic() < deadline and proc.is_alive():
        time.sleep(0.05)
    assert storage.exists(path), f"{path} never appeared"
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert proc.exitcode == -signal.SIGKILL


def killed_then_resumed(ledger, *, adopted_steps: int) -> None:
    """The ledger after a killed attempt and the re-run that resumed its checkpoint: two reservations, the second
    adopting the first (settled at its whole ε = 10) and charged only for the steps it added."""
    first, second = ledger.history("mnist600")
    assert first["status"] == "committed" and first["epsilon_spent"] == 10 and "adopted" in first["note"]
    assert second["status"] == "committed" and second["resumes_id"] == first["id"]
    assert f"added to the {adopted_steps} of reservation {first['id']}" in second["note"]
    assert second["epsilon_spent"] < 9.8  # the steps it added: not the ≈ 9.9 of all STEPS steps again


def test_snapshots_of_an_earlier_attempt_are_not_listed(tmp_path, source, ledger_with_budget, capsys):
    run = tmp_path / "run"
    stages(run, source, "partition", "pretrain", overrides=LONG)
    train_dir = run / "sensitive" / "train"
    first = train_dir / "checkpoints" / "snapshots" / "generator-0000020.pt"
    kill_once(cli("train", "--run-dir", run, *settings(source, *LONG)), first)
    stale = sorted((train_dir / "checkpoints" / "snapshots").glob("generator-*.pt"))
    assert stale  # the killed attempt's generator snapshots (every 20 steps)
    # a restart that does not resume, checkpointing every 15 steps (30 steps are enough: the killed attempt's
    # snapshots, every 20 steps from 20 on, are no multiple of 15)
    again = settings(source, "train.steps=30", "output.checkpoint_every=15", "output.resume=false")
    rerun(cli("train", "--run-dir", run, *again), capsys)
    listed = manifest(run, "sensitive", "train")["outputs"]
    snaps = [o["uri"] for o in listed if o["role"] == "generator_snapshot"]
    steps = sorted(int(u.rsplit("generator-", 1)[1][:-3]) for u in snaps)
    assert steps == [15, 30], steps  # this run's only: none of the killed attempt's
    for uri in snaps:  # each bound to this run's trace, at its own step
        privacy = torch.load(storage.local_path(uri), weights_only=False)["privacy"]
        assert privacy["step"] % 15 == 0
    assert not [p for p in stale if p.exists() and int(p.stem.split("-")[1]) % 15]


def test_a_rerun_of_a_killed_pipeline_resumes_its_checkpoint(tmp_path, source, ledger_with_budget, capsys):
    run = tmp_path / "run"
    args = cli("pipeline", "run", "--run-dir", run, *settings(source, *LONG, "evaluate.curve_samples=0"))
    ckpt = run / "sensitive" / "train" / "checkpoints" / "last.pt"
    kill_once(args, ckpt)  # past its first checkpoint
    at = torch.load(ckpt, weights_only=False)["step"]
    rerun(args, capsys)  # the same command again
    killed_then_resumed(ledger_with_budget, adopted_steps=at)
    assert manifest(run, "sensitive", "train")["details"]["steps"] == STEPS


def test_a_retry_of_a_killed_train_stage_on_s3_resumes_its_checkpoint(s3_bucket, tmp_path, source, ledger_with_budget,
                                                                      capsys):
    run = f"s3://{s3_bucket}/runs/r1"
    stages(run, source, "partition", "pretrain", overrides=LONG)
    args = cli("train", "--run-dir", run, *settings(source, *LONG))
    mirrored = f"{run}/sensitive/train/checkpoints/last.pt"
    kill_once(args, mirrored)  # the stage trains in a temporary directory, which dies with it
    local = tmp_path / "last.pt"
    storage.copy(mirrored, local)
    at = torch.load(local, weights_only=False)["step"]
    assert 0 < at < STEPS
    rerun(args, capsys)  # the orchestrator's retry
    killed_then_resumed(ledger_with_budget, adopted_steps=at)
    trained = manifest(run, "sensitive", "train")
    assert trained["details"]["steps"] == STEPS
    snaps = sorted(o["uri"].rsplit("-", 1)[1] for o in trained["outputs"] if o["role"] == "generator_snapshot")
    assert snaps == [f"{s:07d}.pt" for s in range(20, STEPS + 1, 20)]  # the killed attempt's kept: same lineage
