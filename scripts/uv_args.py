"""Print pip's configured package sources as arguments for ``uv pip install`` (the Makefile's set-up uses uv).

uv reads no pip configuration. A machine whose pip is pointed at local indexes, wheel folders or a constraints
file (pip.conf, ``PIP_*`` variables: ``pip config list`` shows both) must give uv the same sources, or uv would
resolve from PyPI alone: here, for instance, the CPU build of torch in the lock lies only in a local wheel folder.
Usage: ``python scripts/uv_args.py`` with any Python that has pip; prints nothing when pip has no such settings.
"""

from __future__ import annotations

import subprocess
import sys

# pip's option -> uv's option of the same meaning (values are space-separated lists in pip's configuration)
OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
           "constraint": "--constraint"}


def uv_args(pip_config: str) -> list[str]:
    """uv arguments from the lines of ``pip config list`` (``section.key='value'``), each value once."""
    args: list[str] = []
    seen: set[tuple[str, str]] = set()
    for line in pip_config.splitlines():
        name, _, value = line.partition("=")
        option = OPTIONS.get(name.rpartition(".")[2])
        if option is None:
            continue
        for item in value.strip().strip("'\"").split():
            if (option, item) not in seen:
                seen.add((option, item))
                args += [option, item]
    return args


if __name__ == "__main__":
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            check=True).stdout
    print(" ".join(uv_args(listed)))
