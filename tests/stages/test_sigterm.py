"""SIGTERM (what Kubernetes sends before it kills a pod) ends a training attempt cleanly (#55 item 10): a real
``dpsynth train`` process stopped mid-training writes a checkpoint, commits the ε of the steps it ran, closes its
reservation and exits 143; the next run is not refused and resumes that checkpoint. A refusal that names open
reservations says how to settle a stuck one. The stopped process is forked by a fork server that imported torch and
dpsynth once (tests/stages/helpers.py's start); under torchrun (the slow tier) it is a new interpreter."""

import os
import re
import signal
import subprocess
import time

import pytest
import torch

from dpsynth.errors import PrivacyError
from dpsynth.ledger.store import Ledger
from tests.stages.helpers import manifest, settings, stages, start
from tests.stages.test_train_attempts import LONG, STEPS, cli, rerun


def test_sigterm_mid_training_checkpoints_charges_and_closes_the_reservation(tmp_path, source, ledger_with_budget,
                                                                             capsys):
    run = tmp_path / "run"
    stages(run, source, "partition", "pretrain", overrides=LONG)
    args = cli("train", "--run-dir", run, *settings(source, *LONG))
    ckpt = run / "sensitive" / "train" / "checkpoints" / "last.pt"
    log = tmp_path / "stderr.log"
    proc = start(*args[3:], stderr=log)  # a process forked by the fork server (the same command line)
    deadline = time.monotonic() + 300
    while not ckpt.exists() and time.monotonic() < deadline and proc.is_alive():
        time.sleep(0.05)
    assert ckpt.exists(), "no checkpoint appeared"
    os.kill(proc.pid, signal.SIGTERM)  # past the first checkpoint, mid-training
    proc.join(timeout=120)
    stderr = log.read_text()
    assert proc.exitcode == 143, stderr[-3000:]  # 128 + SIGTERM, not killed by the signal

    found = re.search(r"stopped by SIGTERM after step (\d+), checkpoint written", stderr)
    assert found, stderr[-3000:]
    stopped_at = int(found[1])
    assert 20 <= stopped_at < STEPS
    assert torch.load(ckpt, weights_only=False)["step"] == stopped_at  # the checkpoint of the last step run
    (first,) = ledger_with_budget.history("mnist600")
    assert first["status"] == "committed", first  # closed: nothing left reserved
    assert "stopped by SIGTERM" in first["note"] and f"{stopped_at} private steps" in first["note"]
    assert 0 < first["epsilon_spent"] < 9.8  # what its steps spent, not the whole reservation (10)
    assert ledger_with_budget.balance("mnist600")["reserved"] == 0

    rerun(args, capsys)  # the orchestrator's retry: the same command line (in this process: test_train_attempts)
    first_again, second = ledger_with_budget.history("mnist600")
    assert first_again == first  # charged once, by itself: not settled again at its whole reservation
    assert second["status"] == "committed" and second["resumes_id"] == first["id"]
    assert f"added to the {stopped_at} of reservation {first['id']}" in second["note"]
    assert manifest(run, "sensitive", "train")["details"]["steps"] == STEPS


def test_a_refusal_naming_open_reservations_says_how_to_settle_them(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.set_budget("pop", epsilon=10.0, delta=1e-3, reason="test")
    kwargs = dict(delta=1e-5, dataset_sha256="0" * 64, accountant="rdp", records=100)
    ledger.reserve("pop", epsilon=8.0, pipeline_run_id="killed", **kwargs)  # its process is gone: stays open
    with pytest.raises(PrivacyError) as refused:
        ledger.reserve("pop", epsilon=5.0, pipeline_run_id="next", **kwargs)
    message = str(refused.value)
    assert "reserved by attempts in progress 8" in message
    assert "ledger history pop" in message and "ledger settle ID --reason TEXT" in message
    ledger.set_budget("other", epsilon=10.0, delta=1e-3, reason="test")
    with pytest.raises(PrivacyError) as refused:  # nothing open: no word about settling
        ledger.reserve("other", epsilon=11.0, pipeline_run_id="next", **kwargs)
    assert "settle" not in str(refused.value)


@pytest.mark.slow
def test_sigterm_under_torchrun_ends_every_rank_cleanly(tmp_path, source, ledger_with_budget):
    """#55 item 10 under torchrun (2 gloo ranks on CPU, `dpsynth train --launch torchrun`): SIGTERM to the launcher
    (what the pod's main process gets) reaches torchrun, which passes it to the ranks; rank 0 checkpoints, commits
    what its steps spent and closes the reservation; the launcher exits 143; the retry resumes."""
    run = tmp_path / "run"
    ranks = ("train.gpus_per_node=2", "train.device=cpu")
    long = ("train.steps=300", "output.checkpoint_every=20")  # 2 ranks: a wider window for the signal
    stages(run, source, "partition", "pretrain", overrides=long)
    args = cli("train", "--launch", "torchrun", "--run-dir", run, *settings(source, *long, *ranks))
    ckpt = run / "sensitive" / "train" / "checkpoints" / "last.pt"
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600

    def private_steps_checkpointed() -> bool:  # the warm-up writes one at step 0; wait for one of the loop's
        try:
            return ckpt.exists() and torch.load(ckpt, weights_only=False)["step"] > 0
        except Exception:  # being replaced
            return False

    while not private_steps_checkpointed() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert ckpt.exists(), "no checkpoint appeared"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 143, stderr[-3000:]
    found = re.search(r"stopped by SIGTERM after step (\d+), checkpoint written", stderr)
    assert found, "\n".join(l for l in stderr.splitlines() if re.search("(?i)sig|stop|error|warn|exit", l))[-3000:]
    stopped_at = int(found[1])
    assert torch.load(ckpt, weights_only=False)["step"] == stopped_at
    (first,) = ledger_with_budget.history("mnist600")
    assert first["status"] == "committed" and f"{stopped_at} private steps" in first["note"], first
    assert 0 < first["epsilon_spent"] < 9.8 and ledger_with_budget.balance("mnist600")["reserved"] == 0

    done = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    _, second = ledger_with_budget.history("mnist600")
    assert second["status"] == "committed" and second["resumes_id"] == first["id"]
    assert manifest(run, "sensitive", "train")["details"]["steps"] == 300
