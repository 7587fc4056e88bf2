"""Shared fixtures: the bundled MNIST test set and a tiny hand-made dataset."""

from pathlib import Path

import numpy as np
import pytest

from dpsynth.data import ImageDataset, import_source

MNIST_DIR = Path(__file__).resolve().parents[2] / "data" / "mnist"


@pytest.fixture(scope="session")
def mnist() -> ImageDataset:
    return import_source(MNIST_DIR)


@pytest.fixture
def tiny() -> ImageDataset:
    """Four 2×3 RGB images, labels 0..2, mixed splits."""
    images = np.arange(4 * 2 * 3 * 3, dtype=np.uint8).reshape(4, 2, 3, 3)
    return ImageDataset(
        record_ids=["d", "a", "c", "b"],
        labels=np.array([0, 2, 1, 2], dtype=np.int64),
        images=images,
        splits=["train", "test", None, "public"],
        num_classes=3,
        source="tiny test fixture",
    )
