"""Private Evolution's privacy (:mod:`dpsynth.mechanisms.private_evolution` is its algorithm): first, once, the style
release (each class's counts of flat- and textured-ground records, add/remove sensitivity 1: one
``full_batch_gaussian(σ_s)`` event, the trace's first), then each round one Gaussian histogram of the records' votes,
of add/remove sensitivity 1 (every record adds one vote to one bin), so one ``full_batch_gaussian(σ)`` event of the
trace per round; σ_s and σ calibrated from ε (the budget split: :data:`STYLE_SHARE`), the plan, the statement, and
the method's :class:`~dpsynth.mechanisms.mechanism.Mechanism` object the registry, the trainer and the audit share.

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


# The style release's share of the budget, in the Gaussian's 1/σ² (RDP and PRV compose full-batch Gaussians by
# adding 1/σ²): σ_s = σ₁ / √STYLE_SHARE, σ₁ the one Gaussian that spends ε alone; the rounds' σ is then calibrated
# after it (docs/prior.md, "a released style share per class").
STYLE_SHARE = 0.02


def events(rounds: int, noise_multiplier: float, style_noise_multiplier: float | None = None) -> list:
    """The mechanism's events: the style release (σ_s, when given), then one full-batch Gaussian of add/remove
    sensitivity 1 per round."""
    style = [] if style_noise_multiplier is None else [full_batch_gaussian(style_noise_multiplier)]
    return style + [full_batch_gaussian(noise_multiplier) for _ in range(rounds)]


def style_sigma(*, epsilon: float, delta: float, accountant: str = "rdp") -> float:
    """σ_s of the style release: :data:`STYLE_SHARE` of the budget (σ₁ / √share, σ₁ one release's σ at ε)."""
    from dpsynth.privacy.calibration import calibrate_noise

    one = calibrate_noise(target_epsilon=epsilon, delta=delta, sample_rate=1.0, steps=1, sampling="full_batch",
                          accountant=accountant)
    return one / math.sqrt(STYLE_SHARE)


def calibrate(*, epsilon: float, delta: float, rounds: int, accountant: str = "rdp",
              style_noise_multiplier: float | None = None) -> float:
    """The per-round σ for which ``rounds`` histograms, after the style release at ``style_noise_multiplier`` (when
    given), spend at most ``epsilon`` at ``delta``."""
    from dpsynth.privacy.calibration import calibrate_noise

    prefix = MechanismTrace(events(0, 1.0, style_noise_multiplier)) if style_noise_multiplier is not None else None
    return calibrate_noise(target_epsilon=epsilon, delta=delta, sample_rate=1.0, steps=rounds,
                           sampling="full_batch", accountant=accountant, prefix=prefix)


def sigmas(*, epsilon: float, delta: float, rounds: int, accountants: tuple[str, ...] = ("rdp",)) -> tuple[float, float]:
    """(σ of the rounds, σ_s of the style release) from ε: for every accountant in ``accountants`` the whole trace
    spends ≤ ε (the largest σ_s any of them needs, then the largest σ)."""
    s = max(style_sigma(epsilon=epsilon, delta=delta, accountant=name) for name in accountants)
    return max(calibrate(epsilon=epsilon, delta=delta, rounds=rounds, accountant=name, style_noise_multiplier=s)
               for name in accountants), s


def calibrating_accountants(accountant: str) -> tuple[str, ...]:
    """The accountants σ is calibrated by: ``accountant`` and every RDP-curve one that accounts a full-batch Gaussian
    (the audit requires each accountant that applies to the trace to find ≤ ε; "rdp" and "wor" differ in their
    orders, PRV is tighter than both)."""
    from dpsynth.privacy.registry import ACCOUNTANTS

    probe = full_batch_gaussian(1.0)
    return tuple(dict.fromkeys([accountant, *(name for name, cls in ACCOUNTANTS.items()
                                               if name != "prv" and cls().supports(probe))]))


def statement(*, rounds: int, candidates: int, noise_multiplier: float, threshold: float,
              style_noise_multiplier: float) -> str:
    """What the release is, for a privacy statement: the prior, the style release, the rounds, the sensitivity and
    the noise."""
    return (f"σ·Δ with Δ = 1 (a record's one vote per round): N(0, σ²), σ = {noise_multiplier:g}, on every bin of each "
            f"round's histogram. " + PRIOR_STATEMENT.format(version=PRIOR_VERSION)
            + " The trace's event #0 is the style release, one full-batch Gaussian (q = 1): each record counts 1 in "
            "one of its class's two bins, textured or flat ground (the median distance of its smoothed border ring "
            "from its fitted background plane, above or below a public constant), so adding or removing a record "
            f"moves the 2-bins-a-class histogram by 1 in L2; N(0, σ_s²), σ_s = {style_noise_multiplier:g}, on every "
            "bin; each class's clipped noisy share of textured records, capped at ½, is the probability that its "
            "images are painted in the photographic style."
            + f" Private Evolution moves the prior to the records in {rounds} rounds, the trace's events "
            f"#1–#{rounds}, "
            f"each one full-batch Gaussian (q = 1): every record votes for the nearest of its class's {candidates} "
            "candidate figures in a colour-blind feature (each pixel's distance from the record's own background "
            "plane), one vote in one bin of the histogram stacked over all classes, so adding or removing a record "
            f"moves it by 1 in L2. Bins below {threshold:g} votes are "
            "zeroed; resampling, variations of the figures and their colours are post-processing of the released "
            "histograms.")


def rounds_epsilon(rounds: int, noise_multiplier: float, *, delta: float, accountant: str = "rdp",
                   style_noise_multiplier: float | None = None) -> float:
    """ε of ``rounds`` rounds (after the style release at ``style_noise_multiplier``, when given) at ``delta`` (the
    accountant on :func:`events`)."""
    from dpsynth.privacy.registry import epsilon

    if not math.isfinite(noise_multiplier) or noise_multiplier <= 0:
        return math.inf
    return epsilon(MechanismTrace(events(rounds, noise_multiplier, style_noise_multiplier)), delta=delta,
                   accountant=accountant)


# --- the method's mechanism: its plan, events and statement for the trainer and the audit --------------------


@dataclass(frozen=True)
class EvolutionHistograms(Mechanism):
    """Private Evolution's mechanism (Lin et al., Algorithm 1, with the public prior as the simulator): the style
    release first (the plan's ``prefix``: one full-batch event of add/remove sensitivity 1, σ_s from
    :data:`STYLE_SHARE` of the budget), then one Gaussian histogram of every record's vote per round,
    ``evolution.rounds`` rounds, each one full-batch event of add/remove sensitivity 1; σ is
    ``privacy.noise_multiplier`` or calibrated so that the style release and the rounds together spend ≤ ε."""

    def plan(self, cfg: RunConfig, n: int) -> PrivacyPlan:
        from dpsynth.privacy import BudgetGuard, check_delta
        from dpsynth.privacy.plan import PrivacyPlan

        p, rounds = cfg.privacy, cfg.evolution.rounds
        check_delta(p.delta, n)
        # every accountant the audit applies to full-batch events must find ≤ ε: the largest σ_s, then the largest σ
        names = calibrating_accountants(p.accountant)
        style = max(style_sigma(epsilon=p.epsilon, delta=p.delta, accountant=name) for name in names)
        prefix = MechanismTrace(events(0, 1.0, style))
        sigma = p.noise_multiplier
        if sigma is None:
            sigma = max(calibrate(epsilon=p.epsilon, delta=p.delta, rounds=rounds, accountant=name,
                                  style_noise_multiplier=style) for name in names)
        event = full_batch_gaussian(sigma)
        guard = BudgetGuard(target_epsilon=p.epsilon, delta=p.delta, accountant=p.accountant, event=event)
        steps = min(rounds, guard.remaining(prefix))
        if steps < rounds:  # a round left out would change what the rounds mean: refuse rather than stop early
            raise PrivacyError(f"privacy.noise_multiplier: {sigma:.4g} allows {steps} of evolution.rounds = {rounds} "
                               f"rounds within privacy.epsilon = {p.epsilon} after the style release; raise it, lower "
                               "evolution.rounds, or leave privacy.noise_multiplier unset (calibrated)")
        return PrivacyPlan(event=event, steps=rounds, guard=guard, noise_multiplier=sigma, prefix=prefix.events)

    @staticmethod
    def style_noise_multiplier(plan: PrivacyPlan) -> float:
        """σ_s of the plan's style release (its prefix's one event)."""
        return plan.prefix[0].noise_multiplier

    def threshold(self, cfg: RunConfig, plan: PrivacyPlan) -> float:
        """H in votes: ``evolution.threshold`` (in units of σ) times the plan's σ."""
        return cfg.evolution.threshold * plan.noise_multiplier

    def statement(self, cfg: RunConfig, plan: PrivacyPlan, n: int) -> dict:
        from dpsynth.privacy.statement import REPLACE_BY_GROUP_PRIVACY, statement as privacy_statement

        e = cfg.evolution
        return privacy_statement(
            adjacency=f"add/remove one record: the style release counts each record once and every round's histogram "
                      f"counts each record's one vote (full batch, q = 1); {REPLACE_BY_GROUP_PRIVACY}.",
            noise=statement(rounds=plan.steps, candidates=e.candidates, noise_multiplier=plan.noise_multiplier,
                            threshold=self.threshold(cfg, plan),
                            style_noise_multiplier=self.style_noise_multiplier(plan)),
            assumptions=["the prior, its variations and the painter read no record: they run from the public seed "
                         f"evolution.seed = {e.seed} and the released histograms only (dpsynth.prior, version "
                         f"{PRIOR_VERSION})"])


PRIVATE_EVOLUTION = EvolutionHistograms(
    sampled="every record, every round (full batch); each record votes once for its class's nearest candidate",
    sampling="full_batch", clipped="votes",
    fold="nothing: one histogram, one release per round, and the style histogram once before the rounds",
    noise="σ on every bin of a histogram of sensitivity 1 (σ_s on the style histogram)")
