"""A method's privacy mechanism, as one frozen object: what is sampled and how, what is clipped, what one
step folds, what noise it adds — and from that its plan, its events, its statement and its sanitizer.

One private step is one path through its mechanism: **select** (:meth:`Mechanism.select`: the batch — a Poisson
sample of the records, the shard or client drawn, or every record — from the mechanism's secret coins, at the
plan's rate) → **sanitize** (its sanitizer: clip, add the noise) → **event** (the sanitizer appends the plan's
event to the trace at the noisy release). A trainer asks its mechanism for the batch, as Opacus' DP data loader
draws it for the optimizer that noises it, and jax_privacy's execution plan fixes both from the configuration.

After jax_privacy's frozen DP execution plan (everything about the privacy fixed from the configuration and
n before the first step) and Opacus' optimizer-step hook (the sanitizer records its own event at every
noisy release, so noise and accounting cannot come apart). A method names its mechanism in the registry
(:mod:`dpsynth.methods.registry`); its trainer plans with it and builds its sanitizer from it, and the audit
recomputes the same plan from the configuration and n and requires the trace to equal it
(:func:`dpsynth.stages.audit.plan_check`): the trace is the plan's, event by event, or the audit fails.

Importing this package loads no torch (``dpsynth --help`` reads the registry): what a mechanism needs to
plan or sanitize is imported when it plans or sanitizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from dpsynth.config import RunConfig
    from dpsynth.privacy.events import MechanismTrace
    from dpsynth.privacy.plan import PrivacyPlan

Sampling = Literal["poisson", "without_replacement", "full_batch"]
# what bounds one record's contribution: its clipped parameter gradients, its clipped ∂ℓ_i/∂G(z_i), or one vote
Clipped = Literal["parameter_gradients", "input_gradients", "votes"]


@dataclass(frozen=True)
class Mechanism:
    """The privacy of one method's private step. Subclasses give :meth:`plan` and :meth:`statement`."""

    sampled: str  # what one step samples, and how (in words, for a reader and the docs)
    sampling: Sampling  # the trace's sampling scheme
    clipped: Clipped  # what the sanitizer clips: per-example parameter gradients, or ∂ℓ_i/∂G(z_i); "votes": nothing
    # is clipped, each record adds one vote to one bin (Private Evolution)
    fold: str  # which releases one step folds into its event (σ/√releases)
    noise: str  # the noise convention: σ in units of which bound

    def plan(self, cfg: RunConfig, n: int) -> PrivacyPlan:
        """The frozen plan of a run of ``cfg`` on n records: the per-step event, the steps, the guard."""
        raise NotImplementedError

    def select(self, plan: PrivacyPlan, randomness, population: int, *, ranks=None):
        """One private step's batch, drawn from the mechanism's secret coins (``randomness``,
        :class:`~dpsynth.mechanisms.randomness.MechanismRandomness`) by its sampling scheme:

        * ``poisson``: each of the ``population`` records independently at the plan's rate q — a bool mask of
          ``range(population)``; under torchrun (``ranks``, :class:`~dpsynth.distributed.ranks.Ranks`) the
          indices of this rank's part, drawn from its own coins;
        * ``without_replacement``: one of ``population`` shards (GS-WGAN) or clients (federated), uniformly; under
          torchrun drawn by rank 0 and the same on every rank;
        * ``full_batch``: every record (``slice(None)``), no coin drawn.

        ``ranks`` None: one process (the same draws as a job of one rank).

        >>> from dpsynth.mechanisms.randomness import MechanismRandomness
        >>> from dpsynth.privacy.plan import PrivacyPlan
        >>> from dpsynth.privacy.events import MechanismEvent
        >>> event = MechanismEvent(sampling="poisson", sample_rate=1.0, noise_multiplier=1.0, sensitivity="add_remove")
        >>> plan = PrivacyPlan(event, steps=1, guard=None, noise_multiplier=1.0)
        >>> Mechanism("", "poisson", "votes", "", "").select(plan, MechanismRandomness(seed=1), 3).tolist()
        [True, True, True]
        """
        if self.sampling == "poisson":
            rate = plan.event.sample_rate
            return randomness.poisson_mask(population, rate) if ranks is None else \
                ranks.poisson_take(randomness, population, rate)
        if self.sampling == "without_replacement":
            if ranks is None:
                return randomness.choice(population)
            return ranks.from_main(randomness.choice(population) if ranks.is_main else None)
        return slice(None)

    def events(self, cfg: RunConfig, n: int) -> MechanismTrace:
        """The trace a run of ``cfg`` on n records must write: the plan's prefix, then its event per step."""
        return self.plan(cfg, n).trace

    def statement(self, cfg: RunConfig, plan: PrivacyPlan, n: int) -> dict:
        """What the (ε, δ) of ``plan`` means (:mod:`dpsynth.privacy.statement`)."""
        raise NotImplementedError

    def reported_noise_multiplier(self, plan: PrivacyPlan) -> float:
        """The σ a run reports (``TrainResult.noise_multiplier``): its event's (GS-WGAN's: per release)."""
        return plan.event.noise_multiplier

    def accountant(self, cfg: RunConfig) -> str:
        """The accountant of its events: ``privacy.accountant`` (GS-WGAN's shard sampling fixes its own)."""
        return cfg.privacy.accountant

    def privacy_record(self, cfg: RunConfig) -> dict:
        """What the generator file records of the privacy unit besides the record (the federated client's)."""
        return {}
