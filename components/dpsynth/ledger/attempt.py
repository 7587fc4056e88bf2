"""One attempt at a private stage, charged to the ledger: open before the first private step, closed after.

It holds :func:`open_attempt` and :class:`Attempt` (adopting a resumed checkpoint's reservation, committing
the ε of the steps it added, :meth:`Attempt.limit` for ``as_published`` runs). What an attempt is charged in
every ending, and why: docs/privacy.md, "Charging an attempt".
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from dpsynth.errors import PrivacyError
from dpsynth.privacy.registry import get_accountant
from dpsynth.privacy.events import MechanismTrace

log = logging.getLogger(__name__)


@dataclass
class Attempt:
    """An open reservation held by this process."""

    ledger: Any  # dpsynth.ledger.store.Ledger
    reservation_id: int
    attempt_id: str
    resumes_id: int | None  # the reservation whose checkpoint this attempt resumes
    prefix: MechanismTrace  # that checkpoint's trace (empty when the attempt starts afresh)
    epsilon_reserved: float
    delta: float
    settled: list[dict] = field(default_factory=list)  # stale reservations settled when this one opened
    bound: float = 0.0  # the sound ε its steps may reach beyond the reservation (no guard: as_published)
    closed: bool = False

    @property
    def lineage(self) -> dict:
        return {"reservation_id": self.reservation_id, "attempt_id": self.attempt_id}

    def heartbeat(self, steps: int) -> None:
        self.ledger.heartbeat(self.reservation_id, steps=steps)

    def check_restored(self, restored: MechanismTrace) -> None:
        """After the trainer restored the checkpoint this attempt adopted: its trace must be that checkpoint's
        (:attr:`prefix`), or the ε this attempt commits, for the steps it adds to the prefix, would not be that of
        the steps the trainer runs. PrivacyError otherwise."""
        if restored.to_dict() != self.prefix.to_dict():
            raise PrivacyError(
                f"checkpoint: this attempt adopted the {self.prefix.steps} private steps of reservation "
                f"{self.resumes_id}'s checkpoint, but the trainer's restored trace holds {restored.steps}; "
                "refusing to train on a state the ledger does not account for")

    def added(self, trace: MechanismTrace) -> MechanismTrace:
        return trace.after(self.prefix)

    def commit(self, trace: MechanismTrace, *, accountant: str, why: str = "") -> float:
        """Charge the ε of the steps ``trace`` adds to the resumed checkpoint, composed alone."""
        added = self.added(trace)
        eps = get_accountant(accountant).epsilon(added, delta=self.delta) if added.steps else 0.0
        resumed = (f"{added.steps} private steps added to the {self.prefix.steps} of reservation "
                   f"{self.resumes_id}'s checkpoint" if self.resumes_id else f"{added.steps} private steps")
        self._close(lambda: self.ledger.commit(self.reservation_id, epsilon_spent=eps,
                                               note=f"{why}{resumed}, ε by {accountant}"))
        return eps

    def limit(self, trainer) -> None:
        """Before the first private step: when no guard holds ``trainer`` to the reservation (an ``as_published``
        run: no guard, or one on the paper's account), record in the ledger the sound ε of every step its
        plan may add — what the attempt is charged at least if it dies without committing."""
        plan = getattr(trainer, "plan", None)
        if plan is None or (plan.guard is not None and plan.published_event is None):
            return  # the guard stops every sound trace at the reservation's ε
        may_add = plan.trace.after(self.prefix)
        self.bound = trainer.accountant.epsilon(may_add, delta=self.delta) if may_add.steps else 0.0
        self.ledger.raise_bound(self.reservation_id, epsilon=self.bound,
                                why=f"no guard holds this {plan.steps}-step plan to its reservation")

    def charge_in_full(self, why: str) -> None:
        whole = max(self.epsilon_reserved, self.bound)
        self._close(lambda: self.ledger.commit(self.reservation_id, epsilon_spent=whole,
                                               note=f"charged its whole reservation: {why}"))

    def release(self, why: str) -> None:
        self._close(lambda: self.ledger.release(self.reservation_id, note=why))

    def _close(self, fn: Callable[[], None]) -> None:
        if self.closed:
            raise PrivacyError(f"reservation {self.reservation_id}: this attempt already closed it")
        fn()
        self.closed = True


def open_attempt(ledger, *, population_id: str, epsilon: float, delta: float, dataset_version: str,
                 pipeline_run_id: str, stage: str, records: int, accountant: str, lineage: dict | None,
                 stale_after_s: float | None, content_sha256: str | None = None,
                 blocks: list[int] | None = None, block_series: str | None = None) -> Attempt:
    """Adopt the checkpoint whose ``lineage`` (its reservation and trace, None: none to resume) is given, and
    open this attempt's reservation on every one of ``blocks`` (None: the population as one block), numbered by
    ``block_series`` (:meth:`dpsynth.ledger.store.Ledger.open_attempt`)."""
    found = lineage
    resumes, prefix = None, MechanismTrace()
    if found is not None:
        resumes = found["reservation_id"]
        if resumes is None:
            raise PrivacyError(
                "checkpoint: the run's checkpoint was written outside any ledger attempt, so no "
                "reservation accounts for its steps; remove it (or run with --force) to start afresh")
        prefix = MechanismTrace.from_dict(found["trace"]) if found["trace"] else MechanismTrace()
    attempt_id = uuid.uuid4().hex
    rid, settled = ledger.open_attempt(
        population_id, epsilon=epsilon, delta=delta, dataset_sha256=dataset_version, pipeline_run_id=pipeline_run_id,
        accountant=accountant, records=records, stage=stage, attempt_id=attempt_id, resumes_id=resumes,
        stale_after_s=stale_after_s, resumed_steps=prefix.steps, content_sha256=content_sha256, blocks=blocks,
        block_series=block_series)
    for r in settled:
        log.warning("ledger: stale reservation %s (run %s) settled at its whole ε=%.4g: %s",
                    r["id"], r["pipeline_run_id"], r["epsilon_reserved"], r["note"])
    log.info("ledger: attempt %s holds reservation %s (ε=%.4g, δ=%g of population %r%s)%s", attempt_id, rid,
             epsilon, delta, population_id, "" if blocks is None else f", on each of blocks {sorted(blocks)}",
             f", resuming reservation {resumes}'s checkpoint" if resumes else "")
    return Attempt(ledger=ledger, reservation_id=rid, attempt_id=attempt_id, resumes_id=resumes, prefix=prefix,
                   epsilon_reserved=epsilon, delta=delta, settled=settled)
