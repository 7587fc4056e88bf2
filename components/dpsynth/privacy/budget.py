"""The budget guard: training asks it before every step and never exceeds the target ε.

>>> from dpsynth.privacy import BudgetGuard, MechanismEvent, MechanismTrace
>>> event = MechanismEvent(sampling="full_batch", sample_rate=1.0, noise_multiplier=10.0, sensitivity="add_remove")
>>> guard = BudgetGuard(target_epsilon=3.0, delta=1e-5, accountant="rdp", event=event)
>>> trace = MechanismTrace()
>>> while guard.can_step(trace):
...     trace.record(event)
>>> trace.steps == guard.max_steps, guard.spent(trace) <= 3.0
(True, True)
"""

from __future__ import annotations

from typing import Any

from dpsynth.errors import PrivacyError
from dpsynth.privacy.accountants import Accountant
from dpsynth.privacy.registry import get_accountant
from dpsynth.privacy.calibration import max_additional_steps
from dpsynth.privacy.events import MechanismEvent, MechanismTrace
from dpsynth.privacy.checks import as_count, check_delta_range, check_epsilon


def check_delta(delta: float, n: int) -> float:
    """δ must lie in (0, 1) and below 1/n for a dataset of n records, or one record may leak outright."""
    delta = check_delta_range(delta)
    n = as_count(n, "n")
    if n < 1:
        raise PrivacyError(f"n: the dataset must have at least one record, got {n}")
    if not delta < 1 / n:
        raise PrivacyError(f"delta: must be < 1/n = {1 / n:.6g} for n = {n} records, got {delta}")
    return delta


class BudgetGuard:
    """Allows a step only when the trace plus that step stays within (target_epsilon, delta).

    ``event`` is the mechanism of one training step (its ``count`` is ignored). The number of
    steps the budget allows is computed once, on first use; a trace made only of that event
    is then checked by counting. A trace with other events is accounted in full.
    """

    def __init__(
        self,
        *,
        target_epsilon: float,
        delta: float,
        accountant: str | Accountant = "rdp",
        event: MechanismEvent,
    ) -> None:
        self.target_epsilon = check_epsilon(target_epsilon, "target_epsilon")
        self.delta = check_delta_range(delta)
        self.accountant = get_accountant(accountant)
        if not isinstance(event, MechanismEvent):
            raise PrivacyError(f"event: must be a MechanismEvent, got {type(event).__name__}")
        self.event = event.with_count(1)
        self.accountant.check(MechanismTrace([self.event]))
        self._max_steps: int | None = None
        self._other: tuple[tuple[MechanismEvent, ...], int] | None = None  # (trace events, remaining)

    @property
    def max_steps(self) -> int:
        """The largest number of ``event`` steps within the budget (ε(T) ≤ target < ε(T + 1))."""
        if self._max_steps is None:
            self._max_steps = self._additional(MechanismTrace())
        return self._max_steps

    def _additional(self, trace: MechanismTrace) -> int:
        return max_additional_steps(
            trace=trace,
            event=self.event,
            target_epsilon=self.target_epsilon,
            delta=self.delta,
            accountant=self.accountant,
        )

    def remaining(self, trace: MechanismTrace) -> int:
        """How many more ``event`` steps ``trace`` may take.

        The trailing run of ``event`` steps is counted; what comes before it (a warm-up release,
        say) is accounted in full once and cached, so a training loop asks at no cost.
        """
        events, tail = trace.events, 0
        if events and events[-1].same_mechanism(self.event):  # the trace merges a run into one event
            tail, events = events[-1].count, events[:-1]
        if not events:
            return max(0, self.max_steps - tail)
        if self._other is None or self._other[0] != events:
            self._other = (events, self._additional(MechanismTrace(events)))
        return max(0, self._other[1] - tail)

    def can_step(self, trace: MechanismTrace, n: int = 1) -> bool:
        """False when the next ``n`` steps would take ``trace`` over the budget."""
        return self.remaining(trace) >= as_count(n, "n")

    def spent(self, trace: MechanismTrace) -> float:
        """Upper bound on the ε that ``trace`` has spent, at this guard's δ."""
        return self.accountant.epsilon(trace, delta=self.delta)

    def state_dict(self) -> dict[str, Any]:
        return {**self._config(), "max_steps": self.max_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``max_steps`` from a checkpoint of a guard with the same budget and event.

        The restored value is re-checked with one accountant evaluation: a checkpoint can
        never widen the budget.
        """
        mine = self._config()
        for field in mine:
            if state.get(field) != mine[field]:
                raise PrivacyError(f"{field}: checkpoint has {state.get(field)!r}, this run has {mine[field]!r}")
        steps = as_count(state.get("max_steps"), "max_steps")
        trace = MechanismTrace([self.event.with_count(steps)])
        if steps and self.accountant.epsilon(trace, delta=self.delta) > self.target_epsilon:
            raise PrivacyError(f"max_steps: {steps} steps exceed target_epsilon {self.target_epsilon}")
        self._max_steps = steps

    def _config(self) -> dict[str, Any]:
        return {
            "target_epsilon": self.target_epsilon,
            "delta": self.delta,
            "accountant": self.accountant.name,
            "event": self.event.to_dict(),
        }

    def __repr__(self) -> str:
        return (
            f"BudgetGuard(target_epsilon={self.target_epsilon}, delta={self.delta}, "
            f"accountant={self.accountant.name!r}, event={self.event!r})"
        )
