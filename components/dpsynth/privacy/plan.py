"""A mechanism's privacy plan: everything about its privacy fixed before the first step, in one frozen record.

Every method plans the same way — which Gaussian event one step is (after folding its releases),
how many steps the budget allows, and the guard each step asks — and records the plan's ``event``
in its mechanism trace once per step, after the plan's ``prefix`` (DPGAN's warm-up release).
:attr:`PrivacyPlan.trace` is therefore the whole trace training must write; the audit recomputes
the plan from the configuration and n and requires the trace to equal it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpsynth.privacy.budget import BudgetGuard
from dpsynth.privacy.events import MechanismEvent, MechanismTrace


@dataclass(frozen=True)
class PrivacyPlan:
    event: MechanismEvent  # the sound per-step event the trace records (its releases folded: σ/√releases)
    steps: int  # the steps training will take: train.steps, or fewer where the next would exceed ε
    guard: BudgetGuard | None  # what every step asks; None only where the sound ε is reported, not enforced
    noise_multiplier: float  # σ as the sanitizer applies it: per step (DPGAN), per release (GS-WGAN), per group (dp-GAN)
    releases: int = 1  # the releases one step folds into its event: 1, B (GS-WGAN), n_dis·B (federated), k groups
    published_event: MechanismEvent | None = None  # as_published only: the paper's (unsound) per-step event
    published_epsilon: float | None = None  # as_published only: the paper's (unsound) ε of `steps`
    prefix: tuple[MechanismEvent, ...] = ()  # events recorded before the first step (DPGAN's warm-up release)

    @property
    def trace(self) -> MechanismTrace:
        """The trace a run of this plan records: ``prefix``, then ``event`` once per step."""
        return MechanismTrace([*self.prefix, self.event.with_count(self.steps)])

    def __post_init__(self) -> None:
        folded = self.noise_multiplier / math.sqrt(self.releases)
        if not math.isclose(self.event.noise_multiplier, folded, rel_tol=1e-12):
            raise ValueError(f"plan: the event's σ {self.event.noise_multiplier} is not σ/√releases = {folded}")
