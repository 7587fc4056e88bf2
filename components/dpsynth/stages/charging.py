"""Where a run's ledger is, which population it charges, and the charged training attempt of ``train``.

See :mod:`dpsynth.privacy.attempt` for what an attempt is charged and :mod:`dpsynth.privacy.ledger`
for the ledger itself.
"""

from __future__ import annotations

import os
from pathlib import Path

from dpsynth import storage
from dpsynth.config import RunConfig
from dpsynth.errors import ConfigError

LEDGER_ENV = "DPSYNTH_LEDGER_URL"
STANDALONE_URL = "sqlite:///outputs/ledger.db"  # standalone `dpsynth train` (and the `dpsynth ledger` default)


def population_id(cfg: RunConfig) -> str:
    """``ledger.population_id``; ConfigError when unset (never a file name: a rename would reset the budget)."""
    pid = (cfg.ledger.population_id or "").strip()
    if not pid:
        raise ConfigError(
            "ledger.population_id: required: name the population whose records the dataset holds (its lifetime "
            "budget is charged for every training attempt), e.g. --set ledger.population_id=mnist; it is not "
            "derived from the file name, which a rename would change")
    return pid


def ledger_url(cfg: RunConfig, *, run_dir: str | None, tracking_uri: str | None) -> str:
    """``ledger.url``, else $DPSYNTH_LEDGER_URL, else SQLite ``ledger.db`` beside the run's SQLite MLflow
    store (``make run``: outputs/ledger.db, the CLI's default), else beside a local run directory, else
    (no run directory: standalone ``dpsynth train``) outputs/ledger.db."""
    if cfg.ledger.url:
        return cfg.ledger.url
    if os.environ.get(LEDGER_ENV):
        return os.environ[LEDGER_ENV]
    if tracking_uri and tracking_uri.startswith("sqlite:///"):
        return f"sqlite:///{Path(tracking_uri[len('sqlite:///'):]).resolve().parent / 'ledger.db'}"
    if run_dir is None:
        return STANDALONE_URL
    if storage.is_remote(run_dir):
        raise ConfigError(f"ledger.url: required (or ${LEDGER_ENV}) when pipeline.run_dir is remote")
    return f"sqlite:///{Path(storage.local_path(run_dir)).resolve().parent / 'ledger.db'}"


def open_ledger(url: str):
    from dpsynth.privacy.ledger import Ledger

    return Ledger(url)


def train_charged(cfg: RunConfig, make_trainer, *, ledger, dataset_version: str, pipeline_run_id: str,
                  records: int, workdir: str, content_sha256: str | None = None):
    """Run ``make_trainer().train()`` as one charged attempt (:func:`dpsynth.privacy.attempt.run_charged`),
    adopting the checkpoint in ``workdir/checkpoints``; returns the result. ``content_sha256``: the dataset's
    content hash, which ties the population to its data in the ledger (kept there keyed only)."""
    from dpsynth.privacy.attempt import open_attempt, run_charged
    from dpsynth.privacy.events import MechanismTrace

    attempt = open_attempt(
        ledger, population_id=population_id(cfg), epsilon=cfg.privacy.epsilon, delta=cfg.privacy.delta,
        dataset_version=dataset_version, pipeline_run_id=pipeline_run_id, stage="train", records=records,
        accountant=cfg.privacy.accountant, checkpoint_dir=Path(workdir) / "checkpoints",
        resume=cfg.output.resume, stale_after_s=cfg.ledger.stale_after_hours * 3600, content_sha256=content_sha256)
    return run_charged(attempt, make_trainer,
                       read_trace=lambda result: MechanismTrace.from_json(storage.read_bytes(result.trace_path).decode()))
