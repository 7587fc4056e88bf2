"""Private Evolution's privacy (:mod:`dpsynth.mechanisms.private_evolution` is its algorithm): each round one
Gaussian histogram of the records' votes, of add/remove sensitivity 1 (every record adds one vote to one bin), so one
``full_batch_gaussian(σ)`` event of the trace per round; σ calibrated from ε, the plan, the statement, and the
method's :class:`~dpsynth.mechanisms.mechanism.Mechanism` object the registry, the trainer and the audit share.

Importing it loads neither numpy nor torch (``dpsynth --help`` reads the registry).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dpsynth.errors import PrivacyError
from dpsynth.mechanisms.mechanism import Mechanism
from dpsynth.privacy.events import MechanismTrace, full_batch_gaussian
from dpsynth.prior import STATEMENT as PRIOR_STATEMENT, VERSION as PRIOR_VERSION

if TYPE_CHECKING:
    from dpsynth.config import RunConfig
    from dpsynth.privacy.plan import PrivacyPlan


def events(rounds: int, noise_multiplier: float) -> list:
    """The mechanism's events: one full-batch Gaussian of add/remove sensitivity 1 per round."""
    return [full_batch_gaussian(noise_multiplier) for _ in range(rounds)]


def calibrate(*, epsilon: float, delta: float, rounds: int, accountant: str = "rdp") -> float:
    """The per-round σ for which ``rounds`` histograms spend at most ``epsilon`` at ``delta``."""
    from dpsynth.privacy.calibration import calibrate_noise

    return calibrate_noise(target_epsilon=epsilon, delta=delta, sample_rate=1.0, steps=rounds,
                           sampling="full_batch", accountant=accountant)


def calibrating_accountants(accountant: str) -> tuple[str, ...]:
    """The accountants σ is calibrated by: ``accountant`` and every RDP-curve one that accounts a full-batch Gaussian
    (the audit requires each accountant that applies to the trace to find ≤ ε; "rdp" and "wor" differ in their
    orders, PRV is tighter than both)."""
    from dpsynth.privacy.registry import ACCOUNTANTS

    probe = full_batch_gaussian(1.0)
    return tuple(dict.fromkeys([accountant, *(name for name, cls in ACCOUNTANTS.items()
                                               if name != "prv" and cls().supports(probe))]))


# evolution.feature, for a privacy statement: what a record's feature is (each a fixed public function of the record)
FEATURE_STATEMENTS = {
    "plane": "each pixel's distance from the record's own background plane",
    "segmenter": "the figure mask predicted by the public segmenter, a network trained on the prior's own paintings "
                 "only, its weights shipped with the code (dpsynth.prior.segmenter)",
}
FEATURE_STATEMENTS["hybrid"] = (f"{FEATURE_STATEMENTS['plane']} where the record's border is flat, and where it is "
                                "textured (the record's own border roughness above a threshold set on the prior's "
                                f"paintings) {FEATURE_STATEMENTS['segmenter']}")


def statement(*, rounds: int, candidates: int, noise_multiplier: float, threshold: float,
              feature: str = "plane") -> str:
    """What the release is, for a privacy statement: the prior, the rounds, the sensitivity and the noise."""
    return (f"σ·Δ with Δ = 1 (a record's one vote per round): N(0, σ²), σ = {noise_multiplier:g}, on every bin of each "
            f"round's histogram. " + PRIOR_STATEMENT.format(version=PRIOR_VERSION)
            + f" Private Evolution moves it to the records in {rounds} rounds, the trace's events #0–#{rounds - 1}, "
            f"each one full-batch Gaussian (q = 1): every record votes for the nearest of its class's {candidates} "
            f"candidate figures in a colour-blind feature ({FEATURE_STATEMENTS[feature]}), one vote in one bin of "
            f"the histogram stacked over all classes, so adding or removing a record moves it by 1 in L2. Bins below "
            f"{threshold:g} votes are "
            "zeroed; resampling, variations of the figures and their colours are post-processing of the released "
            "histograms.")


def rounds_epsilon(rounds: int, noise_multiplier: float, *, delta: float, accountant: str = "rdp") -> float:
    """ε of ``rounds`` rounds at ``delta`` (the accountant on :func:`events`)."""
    from dpsynth.privacy.registry import epsilon

    if not math.isfinite(noise_multiplier) or noise_multiplier <= 0:
        return math.inf
    return epsilon(MechanismTrace(events(rounds, noise_multiplier)), delta=delta, accountant=accountant)


# --- the method's mechanism: its plan, events and statement for the trainer and the audit --------------------


@dataclass(frozen=True)
class EvolutionHistograms(Mechanism):
    """Private Evolution's mechanism (Lin et al., Algorithm 1, with the public prior as the simulator): one Gaussian
    histogram of every record's vote per round, ``evolution.rounds`` rounds, each one full-batch event of add/remove
    sensitivity 1; σ is ``privacy.noise_multiplier`` or calibrated so that the rounds spend ≤ ε."""

    def plan(self, cfg: RunConfig, n: int) -> PrivacyPlan:
        from dpsynth.privacy import BudgetGuard, check_delta
        from dpsynth.privacy.plan import PrivacyPlan

        p, rounds = cfg.privacy, cfg.evolution.rounds
        check_delta(p.delta, n)
        sigma = p.noise_multiplier
        if sigma is None:  # every accountant the audit applies to full-batch events must find ≤ ε: the largest σ
            sigma = max(calibrate(epsilon=p.epsilon, delta=p.delta, rounds=rounds, accountant=name)
                        for name in calibrating_accountants(p.accountant))
        event = full_batch_gaussian(sigma)
        guard = BudgetGuard(target_epsilon=p.epsilon, delta=p.delta, accountant=p.accountant, event=event)
        steps = min(rounds, guard.remaining(MechanismTrace()))
        if steps < rounds:  # a round left out would change what the rounds mean: refuse rather than stop early
            raise PrivacyError(f"privacy.noise_multiplier: {sigma:.4g} allows {steps} of evolution.rounds = {rounds} "
                               f"rounds within privacy.epsilon = {p.epsilon}; raise it, lower evolution.rounds, or "
                               "leave privacy.noise_multiplier unset (calibrated)")
        return PrivacyPlan(event=event, steps=rounds, guard=guard, noise_multiplier=sigma)

    def threshold(self, cfg: RunConfig, plan: PrivacyPlan) -> float:
        """H in votes: ``evolution.threshold`` (in units of σ) times the plan's σ."""
        return cfg.evolution.threshold * plan.noise_multiplier

    def statement(self, cfg: RunConfig, plan: PrivacyPlan, n: int) -> dict:
        from dpsynth.privacy.statement import REPLACE_BY_GROUP_PRIVACY, statement as privacy_statement

        e = cfg.evolution
        return privacy_statement(
            adjacency=f"add/remove one record: every round's histogram counts each record's one vote (full batch, "
                      f"q = 1); {REPLACE_BY_GROUP_PRIVACY}.",
            noise=statement(rounds=plan.steps, candidates=e.candidates, noise_multiplier=plan.noise_multiplier,
                            threshold=self.threshold(cfg, plan), feature=e.feature),
            assumptions=["the prior, its variations and the painter read no record: they run from the public seed "
                         f"evolution.seed = {e.seed} and the released histograms only (dpsynth.prior, version "
                         f"{PRIOR_VERSION})"]
            + (["the segmenter's weights were trained on the prior's own paintings only, from a public seed "
                "(scripts/train_segmenter.py), and read no record"] if e.feature != "plane" else []))


PRIVATE_EVOLUTION = EvolutionHistograms(
    sampled="every record, every round (full batch); each record votes once for its class's nearest candidate",
    sampling="full_batch", clipped="votes",
    fold="nothing: one histogram, one release per round", noise="σ on every bin of a histogram of sensitivity 1")
