"""Where a run's ledger is, which population it charges, and the charged training attempt of ``train``
(:func:`attempt`, a context manager around building and training the trainer).

See :mod:`dpsynth.ledger.attempt` for what an attempt is charged and :mod:`dpsynth.ledger.store`
for the ledger itself.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from dpsynth import storage, termination
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


def window(cfg: RunConfig, ledger, ds):
    """``(ds restricted to the blocks this run reads, those blocks)`` (:func:`dpsynth.ledger.schedule.plan`: the
    last ``ledger.window`` blocks less those without budget left, by public rules only), or ``(ds, None)`` when
    ``data.uri`` keeps no blocks (the population is one block). A PrivacyError names a block the schedule would
    over-spend."""
    import numpy as np

    from dpsynth.data import blocks
    from dpsynth.ledger import schedule

    of = blocks.of_records(cfg.data.uri, ds.record_ids)
    if of is None:
        return ds, None
    arrived = [b["block"] for b in blocks.arrivals(cfg.data.uri)]  # every block, as the forecast counts them
    read = schedule.plan(ledger.balance(population_id(cfg)), arrived, epsilon=cfg.privacy.epsilon,
                         delta=cfg.privacy.delta, last=cfg.ledger.window)
    return ds.subset(np.isin(np.asarray(of), read)), read


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


@contextlib.contextmanager
def attempt(cfg: RunConfig, *, ledger, dataset_version: str, pipeline_run_id: str, records: int, workdir: str,
            content_sha256: str | None = None, blocks: list[int] | None = None,
            block_series: str | None = None) -> Iterator[Charge]:
    """One charged training attempt around its body (:func:`charged`), adopting the checkpoint in
    ``workdir/checkpoints``, reserving on each of ``blocks`` (the partition's window; None: the population as one
    block) numbered by ``block_series`` (:func:`dpsynth.data.blocks.series`). ``content_sha256``: the dataset's
    content hash, which ties the population to its data in the ledger (kept there keyed only)::

        with charging.attempt(cfg, ledger=…, …) as charge:
            trainer = charge.admit(make_trainer())
            charge.result = loop.train(trainer)
    """
    from dpsynth.ledger.attempt import open_attempt
    from dpsynth.training import checkpoint

    with contextlib.ExitStack() as stack:
        with termination.deferred():  # a SIGTERM while the reservation opens waits until charged() holds it
            opened = open_attempt(
                ledger, population_id=population_id(cfg), epsilon=cfg.privacy.epsilon, delta=cfg.privacy.delta,
                dataset_version=dataset_version, pipeline_run_id=pipeline_run_id, stage="train", records=records,
                accountant=cfg.privacy.accountant,
                lineage=checkpoint.lineage(Path(workdir) / "checkpoints") if cfg.output.resume else None,
                stale_after_s=cfg.ledger.stale_after_hours * 3600, content_sha256=content_sha256, blocks=blocks,
                block_series=block_series)
            charge = stack.enter_context(charged(opened))
        yield charge


@dataclass
class Charge:
    """What the body of :func:`charged` tells it: the trainer it admitted, and the trainer's result."""

    attempt: Attempt
    trainer: Any = None  # admitted: it may take private steps
    result: Any = None  # the finished run's TrainResult (its trace file is what the attempt commits)

    def admit(self, trainer):
        """Before ``trainer``'s first private step (:meth:`Attempt.limit`); returns it."""
        self.attempt.limit(trainer)
        self.trainer = trainer
        return trainer


@contextlib.contextmanager
def charged(attempt: Attempt) -> Iterator[Charge]:
    """Run the body — build the trainer, :meth:`Charge.admit` it, train it, set ``charge.result`` — under
    ``attempt`` (its checkpoints carry the attempt's lineage: :func:`dpsynth.training.checkpoint.charging`), and
    close the attempt: released when the body failed before admitting a trainer; when it failed after, committed
    at the ε of the trace the trainer recorded; when it finished, at the ε of the trace file of its result;
    charged its whole reservation when that trace cannot be accounted."""
    from dpsynth.training import checkpoint

    charge = Charge(attempt)
    try:
        with checkpoint.charging(attempt):
            yield charge
    except BaseException as exc:  # a SIGTERM too (dpsynth.termination): the steps it ran are charged
        with termination.deferred():  # the reservation closes whole, whatever signal comes meanwhile
            if charge.trainer is None:
                attempt.release(f"failed before its first private step: {str(exc) or repr(exc)}")
            else:
                _charge_failure(attempt, charge.trainer, exc)
        raise
    result = charge.result
    try:
        with termination.deferred():
            attempt.commit(MechanismTrace.from_json(storage.read_bytes(result.trace_path).decode()),
                           accountant=result.accountant)
    except BaseException as exc:
        if not attempt.closed:
            attempt.charge_in_full(f"its trace could not be accounted ({str(exc) or repr(exc)})")
        raise


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
