"""The empirical audit's statistics: the one-run lower bound on ε from m canaries' guesses (Steinke, Nasr &
Jagielski 2023: :func:`p_value`, :func:`epsilon_lower_bound`, :func:`guess_and_bound` over a grid of guess counts,
the most an audit of m canaries can prove, :func:`reachable_ceiling`), and :func:`verdict`. It reads scores and coins
only: which canaries and attacks produce them is :mod:`dpsynth.audit.canaries`'. Why the bound holds at the stated
confidence: docs/privacy.md, "The empirical audit's run, attacks and bound".
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

CONFIDENCE = 0.95
# k = fraction · m / 2 canaries guessed "in" and as many "out"; the rest abstain (Bonferroni over these)
GUESS_FRACTIONS = (1.0, 0.5, 0.2, 0.1, 0.05, 0.02)

# --- the one-run bound ----------------------------------------------------------------------------
def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """An upper bound on P[≥ v of r guesses correct] for m canaries under an (ε, δ)-DP mechanism."""
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError(f"need epsilon >= 0 and delta in [0, 1], got {epsilon}, {delta}")
    from scipy import stats  # here, not at the top: scipy.stats takes 1.4 s to import, and every stage imports this module

    q = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(stats.binom.sf(v - 1, r, q))  # P[Binomial(r, q) >= v]
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    below = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q)  # P[B = v-1], P[B = v-2], …, P[B = 0]
    alpha = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))
    return min(tail + 2 * m * delta * alpha, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, *, delta: float, confidence: float = CONFIDENCE,
                        tolerance: float = 1e-6) -> float:
    """The largest ε (to ``tolerance``, rounded down) at which v correct of r guesses would have
    probability < 1 − confidence: the mechanism is not (ε, δ)-DP for any smaller ε, at that confidence."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence: must be in (0, 1), got {confidence}")
    beta = 1 - confidence
    if p_value(m, r, v, 0.0, delta) >= beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m, r, v, hi, delta) < beta:
        lo, hi = hi, 2 * hi
        if hi > 1e3:  # v = r and δ = 0 with r huge: no finite ε explains it
            return math.inf
    while hi - lo > tolerance:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p_value(m, r, v, mid, delta) < beta else (lo, mid)
    return lo


def guess_and_bound(scores, included, *, delta: float, confidence: float = CONFIDENCE,
                    fractions: Sequence[float] = GUESS_FRACTIONS) -> dict:
    """Guess "in" for the k highest ``scores`` and "out" for the k lowest, for each k of the grid; the
    best ε_lower over the grid, each at confidence 1 − (1 − confidence)/|grid|."""
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    m = len(scores)
    order = np.argsort(scores, kind="stable")
    per_k = 1 - (1 - confidence) / len(fractions)
    best = {"epsilon_lower": 0.0, "guesses": 0, "correct": 0}
    for f in fractions:
        k = max(1, int(f * m) // 2)
        correct = int(included[order[-k:]].sum() + (~included[order[:k]]).sum())
        eps = epsilon_lower_bound(m, 2 * k, correct, delta=delta, confidence=per_k)
        if eps > best["epsilon_lower"] or best["guesses"] == 0:
            best = {"epsilon_lower": eps, "guesses": 2 * k, "correct": correct}
    # the most this audit could prove (every guess right at the grid's best k): a gate at a larger ε cannot fail
    ceiling = max(epsilon_lower_bound(m, 2 * k, 2 * k, delta=delta, confidence=per_k)
                  for k in {max(1, int(f * m) // 2) for f in fractions})
    return {**best, "canaries": m, "confidence": confidence, "delta": delta, "guess_grid": list(fractions),
            "ceiling": ceiling}


def reachable_ceiling(m: int, reach: float, *, delta: float, confidence: float = CONFIDENCE,
                      fractions: Sequence[float] = GUESS_FRACTIONS) -> float:
    """The most an audit of m canaries can prove when an included canary leaves a trace only with probability
    ``reach`` (the sampling reaches it in some audited step: 1 − (1 − q)^steps): the bound of a perfect attack
    — every reached canary scored first, the rest (unreached, excluded) indistinguishable — with the expected
    counts. Below the all-correct ceiling when reach < 1: a sanitizer without noise cannot be caught above it."""
    per_k = 1 - (1 - confidence) / len(fractions)
    reached, excluded = reach * m / 2, m / 2
    rest = m - reached  # the scores a perfect attacker cannot tell apart
    best = 0.0
    for k in {max(1, int(f * m) // 2) for f in fractions}:
        ins = min(k, reached) + max(0.0, k - reached) * (m / 2 - reached) / rest
        outs = k * excluded / rest
        best = max(best, epsilon_lower_bound(m, 2 * k, min(2 * k, int(ins + outs)), delta=delta, confidence=per_k))
    return best

VERDICTS = ("passed", "failed", "inconclusive")


def verdict(lower: float, accounted: float, ceiling: float) -> str:
    """failed: ε_lower > the accounted ε; inconclusive: no audit of this size could have failed (the largest
    provable ε is ≤ the accounted ε), so it passed nothing; passed: it could have failed and did not."""
    if lower > accounted:
        return "failed"
    return "passed" if ceiling > accounted else "inconclusive"
