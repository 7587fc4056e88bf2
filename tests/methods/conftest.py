"""Fixtures shared by the trainer tests (``small_mnist`` is in tests/conftest.py; helpers of the
GS-WGAN family's tests in tests/methods/gswgan_helpers.py)."""

import numpy as np
import pytest

from tests.methods.gswgan_helpers import K


@pytest.fixture(scope="session")
def shards(small_mnist):
    """``small_mnist`` in K shards by the partition stage's keyed hash (read-only)."""
    from dpsynth.stages.partition import assign

    where = assign(small_mnist.record_ids, key="test", heldout_fraction=0.0, num_shards=K)
    return [small_mnist.subset(np.flatnonzero(where == k)) for k in range(K)]


@pytest.fixture
def stage_ledger(tmp_path, monkeypatch):
    """The stage helpers' population (tests.stages.helpers.TINY: mnist600) with a budget, in the test's own
    ledger ($DPSYNTH_LEDGER_URL): the ledger gives no budget by default."""
    from tests.ledger_fixtures import budgeted_ledger

    return budgeted_ledger(tmp_path, monkeypatch, "mnist600", records=None)
