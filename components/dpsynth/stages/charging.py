"""Where a run's ledger is, which population it charges, and the charged training attempt of ``train``.

See :mod:`dpsynth.ledger.attempt` for what an attempt is charged and :mod:`dpsynth.ledger.store`
for the ledger itself.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from dpsynth import storage
from dpsynth.config import RunConfig
from dpsynth.errors import ConfigError
from dpsynth.ledger.attempt import Attempt
from dpsynth.privacy.events import MechanismTrace

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
    from dpsynth.ledger.store import Ledger

    return Ledger(url)


def quietly(fn: Callable, *args):
    """``fn(*args)``, or None when it fails with a user-facing or database error (a tracking store or a ledger
    that cannot be read: a summary still shows the stages, a ledger URL falls back to its default)."""
    from sqlalchemy.exc import SQLAlchemyError

    from dpsynth.errors import DpsynthError

    try:
        return fn(*args)
    except (DpsynthError, SQLAlchemyError):
        return None


def run_ledger_url(ctx) -> str:
    """The ledger of the pipeline run ``ctx`` (a :class:`dpsynth.stages.protocol.StageContext`): :func:`ledger_url`
    of its settings, its run directory and its tracking store (None when that cannot be read)."""
    tracking_uri = quietly(lambda: ctx.tracking_uri) if ctx.cfg.tracking.enabled else None
    return ledger_url(ctx.cfg, run_dir=ctx.run_dir, tracking_uri=tracking_uri)


def run_ledger(ctx):
    """The opened ledger of the pipeline run ``ctx`` (:func:`run_ledger_url`)."""
    return open_ledger(run_ledger_url(ctx))


def train_charged(cfg: RunConfig, make_trainer, *, ledger, dataset_version: str, pipeline_run_id: str,
                  records: int, workdir: str, content_sha256: str | None = None):
    """Run ``make_trainer().train()`` as one charged attempt (:func:`run_charged`),
    adopting the checkpoint in ``workdir/checkpoints``; returns the result. ``content_sha256``: the dataset's
    content hash, which ties the population to its data in the ledger (kept there keyed only)."""
    from dpsynth.ledger.attempt import open_attempt
    from dpsynth.training import checkpoint

    attempt = open_attempt(
        ledger, population_id=population_id(cfg), epsilon=cfg.privacy.epsilon, delta=cfg.privacy.delta,
        dataset_version=dataset_version, pipeline_run_id=pipeline_run_id, stage="train", records=records,
        accountant=cfg.privacy.accountant,
        lineage=checkpoint.lineage(Path(workdir) / "checkpoints") if cfg.output.resume else None, stale_after_s=cfg.ledger.stale_after_hours * 3600, content_sha256=content_sha256)
    return run_charged(attempt, make_trainer,
                       read_trace=lambda result: MechanismTrace.from_json(storage.read_bytes(result.trace_path).decode()))


def run_charged(attempt: Attempt, make_trainer: Callable[[], Any], *, read_trace: Callable[[Any], MechanismTrace]):
    """Build the trainer, train it under ``attempt``, close the attempt; returns the trainer's result.

    ``read_trace(result)``: the final trace of a finished run.
    """
    from dpsynth.training import checkpoint

    try:
        trainer = make_trainer()
        attempt.limit(trainer)
    except BaseException as exc:
        attempt.release(f"failed before its first private step: {str(exc) or repr(exc)}")
        raise
    try:
        with checkpoint.charging(attempt):
            result = trainer.train()
    except BaseException as exc:
        _charge_failure(attempt, trainer, exc)
        raise
    try:
        attempt.commit(read_trace(result), accountant=result.accountant)
    except BaseException as exc:
        if not attempt.closed:
            attempt.charge_in_full(f"its trace could not be accounted ({str(exc) or repr(exc)})")
        raise
    return result


def _charge_failure(attempt: Attempt, trainer, exc: BaseException) -> None:
    why = f"failed: {str(exc) or repr(exc)}; "
    trace = getattr(trainer, "trace", None)
    accountant = getattr(trainer, "accountant", None)  # the sound accountant of its trace, guarded or not
    if isinstance(trace, MechanismTrace) and accountant is not None:
        try:
            attempt.commit(trace, accountant=accountant.name, why=why)
            return
        except Exception as inner:  # noqa: BLE001 (whatever it is, charge the whole reservation)
            why += f"its trace could not be accounted ({inner}); "
    if not attempt.closed:
        attempt.charge_in_full(f"{why}the steps it ran are unknown")
