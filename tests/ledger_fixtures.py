"""A test's own privacy ledger, with an explicit budget (the ledger gives none by default).

``budgeted_ledger`` points ``$DPSYNTH_LEDGER_URL`` (read by every `dpsynth` process the test starts,
subprocesses included) at a fresh SQLite ledger under the test's tmp_path, so no test charges the
repository's ``outputs/ledger.db``, and sets the population's budget as an operator would.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsynth.ledger.store import Ledger

LEDGER_ENV = "DPSYNTH_LEDGER_URL"


def budgeted_ledger(directory: Path, monkeypatch, population: str = "mnist600", *, epsilon: float = 1000.0,
                    delta: float = 1e-3, records: int | None = 600) -> Ledger:
    url = f"sqlite:///{Path(directory) / 'ledger.db'}"
    monkeypatch.setenv(LEDGER_ENV, url)
    ledger = Ledger(url)
    ledger.set_budget(population, epsilon=epsilon, delta=delta, records=records, reason="test budget")
    return ledger


def assert_charged_once(ledger: Ledger, trained: dict, population: str = "mnist600") -> None:
    """The train stage's one attempt was charged to ``population`` what its manifest says it spent."""
    (charged,) = ledger.history(population)
    assert charged["stage"] == "train" and charged["status"] == "committed"
    assert charged["epsilon_spent"] == pytest.approx(trained["privacy"]["epsilon"], rel=1e-6)


def kill_after_first_checkpoint(args, out: Path, *, timeout: float = 120) -> Path:
    """Start ``dpsynth train`` (``args``: its command line, or the process already started, e.g. forked:
    tests/methods/distributed_workers.py's ``start_process``), SIGKILL it once its first checkpoint exists (after
    its reservation and some steps, at no particular point); returns the checkpoint's path."""
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if isinstance(args, list) \
        else args
    ckpt = Path(out) / "checkpoints" / "last.pt"
    deadline = time.monotonic() + timeout
    while not ckpt.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert ckpt.exists(), "no checkpoint appeared"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return ckpt
