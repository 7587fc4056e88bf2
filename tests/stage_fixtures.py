"""The stage tests' data and runs, for every folder's tests: 600 bundled MNIST records (``mnist600``) as a canonical
Parquet source (``source``), and a run in which partition, pretrain and train have run (``trained``, a fresh copy for
each test of one run a test process makes once, ``trained_once``). A plugin of the test session
(tests/conftest.py's ``pytest_plugins``): a test names them, never imports them."""

import numpy as np
import pytest

from tests.stages.helpers import MNIST, pristine_run


@pytest.fixture(scope="session")
def mnist600():
    from dpsynth.data import import_source

    return import_source(MNIST).subset(np.arange(600))


@pytest.fixture(scope="session")
def source(tmp_path_factory, mnist600) -> str:
    from dpsynth.data import write_parquet

    path = tmp_path_factory.mktemp("source") / "mnist600.parquet"
    write_parquet(mnist600, path)
    return str(path)


@pytest.fixture(scope="session")
def trained_once(tmp_path_factory, source):
    """``restore()`` of one run in which partition, pretrain and train have run (MLflow off)."""
    return pristine_run(tmp_path_factory, source, "partition", "pretrain", "train")


@pytest.fixture
def trained(trained_once):
    """A run directory in which partition, pretrain and train have run (MLflow off), the test's to change:
    a fresh copy of one session-wide run (training it per test cost most of this folder's time)."""
    return trained_once()
