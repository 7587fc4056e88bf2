"""Noise calibration and step budgets: inverting an accountant's ε.

ε grows with the number of steps T and shrinks with the noise multiplier σ. Both searches
evaluate the accountant itself at every candidate they may return, so the answer is only
as tight as the search but never looser than the target:

* :func:`calibrate_noise` returns σ with ε(σ) ≤ target and ε(σ·(1 − rel_tol)) > target.
* :func:`max_steps` returns the largest T with ε(T) ≤ target, so ε(T + 1) > target.

ε is smooth and close to a power law in σ and in T, so both searches interpolate the
boundary in log–log coordinates (secant) and probe the two points that straddle it,
bisecting when that fails to halve the bracket. For an expensive accountant (PRV at 450k
steps: seconds per evaluation) the cheap RDP accountant supplies the starting point: RDP
bounds the same ε from above, usually a little looser, so its answer lies next to PRV's
and a PRV calibration takes about three PRV evaluations instead of Opacus' dozens.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

from dpsynth.errors import PrivacyError
from dpsynth.privacy.accountants import Accountant
from dpsynth.privacy.registry import get_accountant
from dpsynth.privacy.events import MechanismEvent, MechanismTrace
from dpsynth.privacy.checks import as_count, as_real, check_delta_range, check_epsilon

MAX_NOISE = 1e6  # as Opacus' get_noise_multiplier
MIN_NOISE = 1e-6
MAX_STEPS = 10**12


class _Point(NamedTuple):
    x: float  # log σ, or a step count
    g: float  # log(ε / target): > 0 means over the target


def _log_ratio(eps: float, target: float) -> float:
    if eps <= 0:
        return -math.inf
    return math.log(eps / target) if math.isfinite(eps) else math.inf


def _secant(ua: float, ga: float, ub: float, gb: float) -> float | None:
    """Root of the line through (ua, ga) and (ub, gb); None when undefined."""
    if not (math.isfinite(ga) and math.isfinite(gb)) or ga == gb or ua == ub:
        return None
    return ua - ga * (ub - ua) / (gb - ga)


def _sorted(within: _Point, over: _Point, p: _Point) -> tuple[_Point, _Point]:
    return (p, over) if p.g <= 0 else (within, p)


def _search_sigma(g_of: Callable[[float], float], *, start: float, slope: float, width: float) -> float:
    """The smallest σ with g_of(σ) ≤ 0 to within a factor e^width (g_of decreasing in σ)."""
    seen: dict[float, float] = {}  # σ → g: the σ returned is exactly one that was evaluated

    def at(u: float) -> _Point:
        sigma = math.exp(u)
        if sigma not in seen:
            seen[sigma] = g_of(sigma)
        return _Point(u, seen[sigma])

    first = at(math.log(start))
    within, over = (first, None) if first.g <= 0 else (None, first)
    # Bracket: step past the root a local power law ε ∝ σ^-slope predicts; double the step on a miss.
    step = abs(first.g) / slope + 0.45 * width if math.isfinite(first.g) else 1.0
    step = max(step, width)
    while within is None or over is None:
        if within is None:
            u = over.x + step
            if u > math.log(MAX_NOISE):
                raise PrivacyError(f"target_epsilon: cannot be met with a noise multiplier up to {MAX_NOISE:g}")
        else:
            u = within.x - step
            if u < math.log(MIN_NOISE):
                return math.exp(within.x)
        p = at(u)
        within, over = (p, over) if p.g <= 0 else (within, p)
        step *= 2
    while within.x - over.x > width:
        before = within.x - over.x
        root = _secant(over.x, over.g, within.x, within.g)
        if root is None:
            root = (over.x + within.x) / 2
        for u in (root + 0.45 * width, root - 0.45 * width):
            if over.x < u < within.x and within.x - over.x > width:
                within, over = _sorted(within, over, at(u))
        if within.x - over.x > max(width, before / 2):
            within, over = _sorted(within, over, at((over.x + within.x) / 2))
    return math.exp(within.x)


def calibrate_noise(
    *,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str | Accountant = "rdp",
    sampling: str = "poisson",
    sensitivity: str = "add_remove",
    rel_tol: float = 0.01,
    prefix: MechanismTrace | None = None,
) -> float:
    """The noise multiplier σ for which ``steps`` events spend at most ``target_epsilon``
    (after the events of ``prefix``, e.g. a warm-up release, when given).

    Guarantees ε(σ) ≤ target_epsilon (ε as ``accountant`` computes it) and
    ε(σ·(1 − rel_tol)) > target_epsilon: never over budget, at most ``rel_tol`` more noise
    than needed. Raises PrivacyError when no σ ≤ 10⁶ meets the target.
    """
    target = check_epsilon(target_epsilon, "target_epsilon")
    delta = check_delta_range(delta)
    steps = as_count(steps, "steps")
    if steps < 1:
        raise PrivacyError(f"steps: must be >= 1 to calibrate noise, got {steps}")
    rel_tol = as_real(rel_tol, "rel_tol")
    if not 0 < rel_tol < 1:
        raise PrivacyError(f"rel_tol: must be in (0, 1), got {rel_tol}")
    acc = get_accountant(accountant)
    probe = MechanismEvent(
        sampling=sampling, sample_rate=sample_rate, noise_multiplier=1.0, sensitivity=sensitivity, count=steps
    )
    before = tuple(prefix.events) if prefix is not None else ()
    acc.check(MechanismTrace([*before, probe]))
    width = -math.log1p(-rel_tol)

    def g_for(a: Accountant) -> Callable[[float], float]:
        return lambda sigma: _log_ratio(a.epsilon([*before, probe.with_noise(sigma)], delta=delta), target)

    start, slope = 1.0, 1.0  # ε ∝ 1/σ is the large-σ law
    rdp = get_accountant("rdp")
    if acc.name != "rdp" and all(rdp.supports(e) for e in (*before, probe)):
        g_rdp = g_for(rdp)
        try:
            start = _search_sigma(g_rdp, start=start, slope=slope, width=width / 4)
        except PrivacyError:  # RDP over Opacus' orders cannot certify some tiny ε; a tighter accountant may
            start = 1.0
        else:
            below = start * (1 - rel_tol)
            g_start, g_below = g_rdp(start), g_rdp(below)
            if math.isfinite(g_below) and g_below > g_start:
                slope = (g_below - g_start) / (math.log(start) - math.log(below))
    return _search_sigma(g_for(acc), start=start, slope=slope, width=width)


def max_additional_steps(
    *,
    trace: MechanismTrace,
    event: MechanismEvent,
    target_epsilon: float,
    delta: float,
    accountant: str | Accountant = "rdp",
) -> int:
    """The largest n such that ``trace`` then n repetitions of ``event`` spend ≤ target_epsilon.

    0 when even one more step would exceed it; capped at 10¹² steps.
    """
    target = check_epsilon(target_epsilon, "target_epsilon")
    delta = check_delta_range(delta)
    acc = get_accountant(accountant)
    unit = event.with_count(1)
    acc.check(MechanismTrace([*trace.events, unit]))
    seen: dict[int, float] = {}

    def at(n: int) -> _Point:
        if n not in seen:
            extended = trace.copy()
            extended.record(unit, count=n)
            seen[n] = _log_ratio(acc.epsilon(extended, delta=delta), target)
        return _Point(n, seen[n])

    within = at(0)
    if within.g > 0:
        return 0
    guess, slope = 1, 0.5  # ε ∝ √T is the law of long subsampled compositions
    rdp = get_accountant("rdp")
    if acc.name != "rdp" and all(rdp.supports(e) for e in (*trace.events, unit)):
        kwargs = dict(trace=trace, event=unit, target_epsilon=target, delta=delta)
        guess = max(1, max_additional_steps(**kwargs, accountant=rdp))
    over = None
    n = min(guess, MAX_STEPS)
    while over is None:  # bracket: jump past the root of the local power law, ×1.1 to ×1000
        p = at(n)
        if p.g > 0:
            over = p
            break
        if within.x > 0 and math.isfinite(within.g) and within.g < p.g:
            slope = (p.g - within.g) / math.log(n / within.x)
        within = p
        if n >= MAX_STEPS:
            return MAX_STEPS
        log_factor = -p.g / slope + 0.001 if math.isfinite(p.g) else math.log(2)
        n = min(MAX_STEPS, max(n + 1, math.ceil(n * math.exp(min(max(log_factor, 0.1), math.log(1000))))))
    while over.x - within.x > 1:
        before = over.x - within.x
        root = None
        if within.x > 0:
            r = _secant(math.log(within.x), within.g, math.log(over.x), over.g)
            root = math.exp(r) if r is not None else None
        if root is None:
            root = (within.x + over.x) / 2
        for c in (math.floor(root), math.floor(root) + 1):
            if within.x < c < over.x:
                within, over = _sorted(within, over, at(c))
        if over.x - within.x > max(1, before / 2):
            within, over = _sorted(within, over, at((within.x + over.x) // 2))
    return int(within.x)


def max_steps(
    *,
    noise_multiplier: float,
    sample_rate: float,
    target_epsilon: float,
    delta: float,
    accountant: str | Accountant = "rdp",
    sampling: str = "poisson",
    sensitivity: str = "add_remove",
) -> int:
    """The largest T with ε(T steps) ≤ target_epsilon (so ε(T + 1) > target); 0 if one step exceeds."""
    event = MechanismEvent(
        sampling=sampling, sample_rate=sample_rate, noise_multiplier=noise_multiplier, sensitivity=sensitivity
    )
    return max_additional_steps(
        trace=MechanismTrace(), event=event, target_epsilon=target_epsilon, delta=delta, accountant=accountant
    )
