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


# The quick tier's longest modules (a minute or more of one worker each on two busy cores, measured with
# --durations), longest first. `make test` hands whole modules to its two workers in collection order
# (--dist loadscope --no-loadscope-reorder); these go first so that the run does not end on one of them alone on
# one worker while the other has nothing left (xdist's own order, by number of tests, put them last).
LONGEST_FIRST = [
    "tests/methods/test_gswgan_federated.py",
    "tests/methods/test_distributed.py",
    "tests/stages/test_train_torchrun.py",
    "tests/methods/test_contract.py",
    "tests/stages/test_train_attempts.py",
    "tests/pipelines/test_kfp.py",
    "tests/methods/test_warmup.py",
    "tests/audit/test_empirical.py",
    "tests/stages/test_audit_empirical.py",
    "tests/stages/test_pipeline.py",
    "tests/ledger/test_attempt.py",
    "tests/pipelines/test_airflow.py",
    "tests/stages/test_logged_keys.py",
    "tests/stages/test_egress.py",
]


def pytest_collection_modifyitems(config, items):
    """Modules in LONGEST_FIRST before the rest (a stable sort: every module's tests stay together, in order)."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    root = Path(config.rootpath)
    items.sort(key=lambda item: rank.get(Path(item.path).relative_to(root).as_posix(), len(rank)))
