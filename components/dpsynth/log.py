"""Status messages: the ``dpsynth`` logger, on stderr.

What a command *answers* (a table, a summary line, ``--json``) goes to stdout with ``print``, so it
can be piped; what it says *while working* (a stage started or finished, where its outputs went)
goes through ``logging.getLogger("dpsynth...")`` to stderr. The training loops draw their own tqdm
progress bars on stderr.

``dpsynth -v`` shows debug messages, ``-q`` only warnings and errors (and hides the progress bars),
``-qq`` only errors.
"""

from __future__ import annotations

import logging
import os
import sys

LOGGER = "dpsynth"
FORMAT = "%(asctime)s dpsynth %(levelname)s %(message)s"
DATEFMT = "%H:%M:%S"


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the message (pytest and Airflow replace it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def level_for(verbosity: int) -> int:
    """``-v`` count minus ``-q`` count → a logging level."""
    if verbosity >= 1:
        return logging.DEBUG
    return {0: logging.INFO, -1: logging.WARNING}.get(verbosity, logging.ERROR)


def configure(verbosity: int = 0) -> None:
    """Send the ``dpsynth`` logger to stderr at the level of ``verbosity``; replaces an earlier call's handler."""
    logger = logging.getLogger(LOGGER)
    for handler in [h for h in logger.handlers if isinstance(h, _Stderr)]:
        logger.removeHandler(handler)
    handler = _Stderr()
    handler.setFormatter(logging.Formatter(FORMAT, DATEFMT))
    logger.addHandler(handler)
    logger.setLevel(level_for(verbosity))
    logger.propagate = False
    if verbosity < 0:
        os.environ["TQDM_DISABLE"] = "1"  # tqdm reads its defaults from TQDM_* variables
