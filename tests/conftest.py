"""Fixtures shared across test folders."""

import sys
from pathlib import Path

import numpy as np
import pytest

MNIST = Path(__file__).resolve().parents[1] / "data" / "mnist"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Once a test process has imported MLflow's store, its new SQLite stores start from one migrated schema
    (tests/mlflow_template.py: MLflow's migrations run once per process instead of once per store)."""
    if "mlflow.store.db.utils" in sys.modules:
        from tests import mlflow_template

        mlflow_template.install()


@pytest.fixture(scope="session")
def small_mnist():
    """The first 600 bundled MNIST images: enough for a few tiny private steps (read-only: subset it, never
    modify it)."""
    from dpsynth.data import import_source

    return import_source(str(MNIST)).subset(np.arange(600))


# The quick tier's longest modules (half a minute or more of CPU each, counting every process a module starts:
# tests/methods/distributed_workers.py forks its ranks, torchrun and the Airflow CLI start their own), longest
# first, as measured with --durations and a CPU count per module on the busy 2-core machine (#53). `make test`
# hands whole modules to its two workers in collection order (--dist loadscope --no-loadscope-reorder); these go
# first so that the run does not end on one of them alone on one worker while the other has nothing left
# (xdist's own order, by number of tests, put them last).
LONGEST_FIRST = [
    "tests/methods/test_gswgan_federated.py",
    "tests/methods/test_distributed.py",
    "tests/pipelines/test_airflow.py",
    "tests/stages/test_train_torchrun.py",
    "tests/stages/test_train_attempts.py",
    "tests/audit/test_empirical.py",
    "tests/methods/test_contract.py",
    "tests/methods/test_warmup.py",
    "tests/stages/test_audit_empirical.py",
    "tests/stages/test_pipeline.py",
    "tests/stages/test_logged_keys.py",
    "tests/stages/test_egress.py",
    "tests/ledger/test_attempt.py",
]


def pytest_collection_modifyitems(config, items):
    """Modules in LONGEST_FIRST before the rest (a stable sort: every module's tests stay together, in order)."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    root = Path(config.rootpath)
    items.sort(key=lambda item: rank.get(Path(item.path).relative_to(root).as_posix(), len(rank)))
