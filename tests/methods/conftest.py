"""Fixtures shared by the trainer tests."""

from pathlib import Path

import numpy as np
import pytest

from dpsynth.data import import_source

MNIST = Path(__file__).resolve().parents[2] / "data" / "mnist"


@pytest.fixture(scope="session")
def small_mnist():
    """The first 600 bundled MNIST images: enough for a few tiny private steps."""
    return import_source(str(MNIST)).subset(np.arange(600))
