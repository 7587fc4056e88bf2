"""How to write a ``dpsynth`` command for the user to run from where they are."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def dpsynth(*args: str) -> str:
    """``dpsynth ARGS`` when the ``dpsynth`` on PATH is this installation's, else its script's absolute path
    (a venv nobody activated: the command still runs as printed)."""
    mine = Path(sys.executable).with_name("dpsynth")
    found = shutil.which("dpsynth")
    program = "dpsynth" if found and Path(found).resolve() == mine.resolve() else str(mine)
    return " ".join([program, *args])
