"""Package attributes imported on first use (PEP 562), so the CLI can build its parser without torch."""

from __future__ import annotations

import importlib
import sys


def attributes(package: str, where: dict[str, str]):
    """A module ``__getattr__`` for ``package`` that imports each name of ``where`` (name → submodule)
    from its submodule the first time it is asked for, and keeps it."""

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
