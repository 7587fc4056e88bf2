"""Fixtures shared across test folders."""

from pathlib import Path

import numpy as np
import pytest

MNIST = Path(__file__).resolve().parents[1] / "data" / "mnist"


@pytest.fixture(scope="session")
def small_mnist():
    """The first 600 bundled MNIST images: enough for a few tiny private steps (read-only: subset it, never
    modify it)."""
    from dpsynth.data import import_source

    return import_source(str(MNIST)).subset(np.arange(600))
