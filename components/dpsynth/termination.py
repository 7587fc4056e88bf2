"""SIGTERM ends a ``dpsynth`` command cleanly: the attempt it runs is checkpointed, charged and closed.

Kubernetes (a deleted pod, a preempted node, a task's time limit) and Airflow send SIGTERM, then SIGKILL after a
grace period (30 s by default). Python's default for SIGTERM is to die on the spot, which left a train stage's
ledger reservation open: the next run was refused until an operator ran ``dpsynth ledger settle``. So
:func:`install` (called by the ``dpsynth`` command at start) turns SIGTERM into :class:`Terminated`, a
``SystemExit`` with status 143 raised in the main thread, which unwinds like any failure: the training attempt
commits the ε of the steps its trace holds and closes its reservation (``dpsynth.ledger.charging``).

Some blocks must not be cut in two: a private step and its event in the trace, a checkpoint, a ledger
transaction. Inside :func:`deferred` a SIGTERM waits for the block to end and is raised then; the training
loop writes a checkpoint first (:func:`requested` tells it to). A second SIGTERM while the first is ending the
process changes nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


class Terminated(SystemExit):
    """The process got SIGTERM: raised in its main thread; the exit status is 128 + the signal's number."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(128 + int(signum))
        self.signum = int(signum)

    def __str__(self) -> str:
        return f"stopped by {signal.Signals(self.signum).name}"


_pending: int | None = None  # the signal received, once
_raised = False
_depth = 0  # how many deferred() blocks the main thread is in


def _handle(signum: int, frame) -> None:
    global _pending
    if _pending is not None:  # already ending
        return
    _pending = signum
    if _depth == 0:
        _raise()


def _raise() -> None:
    global _raised
    _raised = True
    raise Terminated(_pending)


def install() -> None:
    """Turn SIGTERM into :class:`Terminated` (from the main thread only, where Python runs signal handlers)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _handle)


def requested() -> bool:
    """Whether a SIGTERM has come (inside :func:`deferred`: it will be raised when the block ends)."""
    return _pending is not None


def request(signum: int = signal.SIGTERM) -> None:
    """End as if ``signum`` had come to this process (another rank of its job got it): raised when the outermost
    :func:`deferred` block ends."""
    global _pending
    if _pending is None:
        _pending = int(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A block a SIGTERM must not cut: the signal, if it comes, is raised when the outermost such block ends."""
    global _depth
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
    if _depth == 0 and _pending is not None and not _raised:
        _raise()
