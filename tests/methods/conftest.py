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


@pytest.fixture
def stage_ledger(tmp_path, monkeypatch):
    """The stage helpers' population (tests.stages.helpers.TINY: mnist600) with a budget, in the test's own
    ledger ($DPSYNTH_LEDGER_URL): the ledger gives no budget by default."""
    from tests.ledger_fixtures import budgeted_ledger

    return budgeted_ledger(tmp_path, monkeypatch, "mnist600", records=None)

