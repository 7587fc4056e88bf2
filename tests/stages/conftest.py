"""The stage tests' autouse fixtures: each test's own ledger with a budget, release cards without their PDF, one torch
thread (600 bundled MNIST records as a Parquet source, ``source``, and a trained run, ``trained``: tests/stage_fixtures.py)."""

import pytest

from tests.torch_threads import one_torch_thread  # noqa: F401 (autouse fixture)


@pytest.fixture(autouse=True)
def ledger_with_budget(tmp_path, monkeypatch):
    """Every stage test's own ledger ($DPSYNTH_LEDGER_URL), with a budget for the TINY population."""
    from dpsynth.ledger.store import Ledger

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv("DPSYNTH_LEDGER_URL", url)
    ledger = Ledger(url)
    ledger.set_budget("mnist600", epsilon=1000.0, delta=1e-3, reason="stage tests")
    return ledger


@pytest.fixture(autouse=True)
def card_without_pdf(monkeypatch):
    """A stage test's release card is the one a machine without Chromium writes (``card.chromium()`` is None: a
    logged line, no card.pdf, the card's facts, HTML and checksums the same): printing the PDF starts a headless
    Chromium, about 3 s of wall per card, and no stage test reads the PDF. The PDF itself is checked by
    tests/release/test_release_card.py (and the Airflow run's card by tests/pipelines/test_airflow.py). Runs made
    in a module or session fixture (the egress walk) start before this fixture and keep their PDF."""
    from dpsynth.release import card

    monkeypatch.setattr(card, "chromium", lambda: None)
