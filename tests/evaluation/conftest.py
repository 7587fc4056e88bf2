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
