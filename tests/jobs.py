"""Kill a training job mid-run, for the resume tests: every process below a launcher (torchrun starts each rank
in a session of its own, so killing the launcher's process group would leave the ranks running)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, read from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            children.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_at_checkpoint(argv: list[str], checkpoint: Path, *, env: dict, timeout_s: float, **popen) -> None:
    """Start ``argv``; once ``checkpoint`` exists, SIGKILL it and every process below it at once."""
    job = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, **popen)
    deadline = time.monotonic() + timeout_s
    while not checkpoint.exists() and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.1)
    assert checkpoint.exists(), "no checkpoint appeared"
    for pid in [*descendants(job.pid), job.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    job.wait()
