"""Fixtures of the evaluation tests: the bundled MNIST test set (real data), one torch thread."""

from pathlib import Path

import pytest

from dpsynth.data import import_source

MNIST = Path(__file__).resolve().parents[2] / "data" / "mnist"


@pytest.fixture(scope="session")
def mnist():
    return import_source(MNIST)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Small models: one torch and one BLAS thread avoid oversubscription when other processes share
    the CPU (a 2-thread OpenBLAS under load made a 600-record logistic regression 40× slower)."""
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1):
        yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def reference_classifier(mnist):
    """The reference CNN trained on 1000 real MNIST records (records 0..999)."""
    import numpy as np
    import torch

    from dpsynth.evaluation.classifiers import ReferenceClassifier

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    clf = ReferenceClassifier(mnist.subset(np.arange(1000)), steps=150, seed=0)
    torch.set_num_threads(before)
    return clf


@pytest.fixture(scope="session")
def noise(mnist):
    """1000 images of uniform noise, labelled like MNIST records 2000..2999."""
    import dataclasses

    import numpy as np

    real = mnist.subset(np.arange(2000, 3000))
    pixels = np.random.default_rng(0).integers(0, 256, real.images.shape, dtype=np.uint8)
    return dataclasses.replace(real, images=pixels)
