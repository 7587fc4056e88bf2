"""The without-replacement accountant: RDP of the Gaussian mechanism on a subsample drawn without replacement.

It holds :class:`WORAccountant` (Wang, Balle & Kasiviswanathan 2019, Theorem 9, in log-space, for fixed-size
batches and shards), :func:`gswgan_event` (one GS-WGAN iteration as one event) and :func:`as_published_epsilon`
(GS-WGAN's own, unsound number, to compare only). The mechanism, the bound, why it holds for shards, and
GS-WGAN's account: docs/privacy.md, "The without-replacement bound".

>>> event = gswgan_event(noise_multiplier=1.07, batch_size=32, num_shards=1000)
>>> (event.sampling, event.sample_rate, round(event.noise_multiplier, 4), event.sensitivity)
('without_replacement', 0.001, 0.1892, 'replace_one')
>>> round(as_published_epsilon(noise_multiplier=1.07, batch_size=32, num_shards=1000,
...                            steps=20_000, delta=1e-5), 2)
9.99
>>> WORAccountant().epsilon([event.with_count(20_000)], delta=1e-5) > 1e5
True
"""

from __future__ import annotations

import functools
import math
from typing import Iterable

import numpy as np
from scipy.special import gammaln

from dpsynth.errors import PrivacyError
from dpsynth.privacy.accountants import RDPCurveAccountant
from dpsynth.privacy.events import MechanismEvent, fold_releases
from dpsynth.privacy.checks import as_count, as_real, check_delta_range, check_noise, check_sample_rate

#: Integer orders 2..256 (where ε at useful budgets is minimised), then a sparse tail to 1024.
DEFAULT_ORDERS: tuple[float, ...] = tuple(float(a) for a in [*range(2, 257), *range(288, 1025, 32)])

REPLACE_ONE_SENSITIVITY = 2.0  # in units of the clip norm C


def _log_expm1(x: float) -> float:
    """log(e^x − 1) for x > 0, without overflow or cancellation."""
    return x + math.log1p(-math.exp(-x)) if x > 1.0 else math.log(math.expm1(x))


def _log_moment_bound(alpha: int, log_q: float, rho: float) -> float:
    """Theorem 9's bound on log E[(p/q)^α] at integer α ≥ 2, capped by the non-subsampled (α−1)ε(α).

    The base mechanism is Gaussian with ε(j) = ρ·j, so (j−1)ε(j) = ρ·j(j−1).
    """
    base = rho * alpha * (alpha - 1)
    if log_q == 0.0:  # γ = 1: the bound is never below the mechanism itself
        return base
    log_binom_2 = math.log(alpha * (alpha - 1) / 2)
    second = 2 * log_q + log_binom_2 + min(math.log(4.0) + _log_expm1(2 * rho), math.log(2.0) + 2 * rho)
    j = np.arange(3, alpha + 1, dtype=float)
    higher = (
        j * log_q
        + (gammaln(alpha + 1.0) - gammaln(j + 1.0) - gammaln(alpha - j + 1.0))
        + math.log(2.0)
        + rho * j * (j - 1.0)
    )
    top = max(second, float(higher.max()) if higher.size else -math.inf)
    if top <= 0.0:  # log(1 + small): log1p keeps the precision of tiny moments (large σ)
        bound = math.log1p(math.exp(second) + float(np.exp(higher).sum()))
    else:  # max-shifted logsumexp of [0, second, higher...]
        bound = top + math.log(math.exp(-top) + math.exp(second - top) + float(np.exp(higher - top).sum()))
    return min(base, bound)


def wor_gaussian_rdp(
    *, sample_rate: float, noise_multiplier: float, orders: Iterable[float], l2_sensitivity: float = 2.0
) -> np.ndarray:
    """RDP at ``orders`` of one Gaussian release subsampled without replacement (Theorem 9).

    ``l2_sensitivity`` is in units of C: 2 for replace-one adjacency of a clipped sum (the
    default, what :class:`WORAccountant` uses); 1 only to reproduce accounts that assume
    sensitivity C. The base mechanism is ε(α) = α·Δ²/(2σ²).
    """
    q = check_sample_rate(sample_rate)
    sigma = check_noise(noise_multiplier)
    delta_f = as_real(l2_sensitivity, "l2_sensitivity")
    if not 0 < delta_f < math.inf:
        raise PrivacyError(f"l2_sensitivity: must be a finite number > 0, got {delta_f}")
    orders = tuple(float(a) for a in orders)
    if not orders or any(not a > 1 or not math.isfinite(a) for a in orders):
        raise PrivacyError("orders: must be a non-empty list of finite RDP orders > 1")
    ratio = delta_f / sigma
    rho = 0.5 * ratio * ratio if ratio < 1e150 else math.inf  # ε(α) = ρα
    if rho == 0.0 or math.isinf(rho):  # σ beyond float range either way: no loss, or no privacy
        return np.full(len(orders), rho)
    log_q = math.log(q)
    cgf: dict[int, float] = {}

    def cgf_at(a: int) -> float:
        if a not in cgf:
            cgf[a] = _log_moment_bound(a, log_q, rho)
        return cgf[a]

    out = np.empty(len(orders))
    for i, alpha in enumerate(orders):
        if alpha < 2:
            out[i] = min(cgf_at(2), rho * alpha)  # ε'(α) ≤ ε'(2) and ≤ ε(α)
        elif alpha.is_integer():
            out[i] = cgf_at(int(alpha)) / (alpha - 1)
        else:
            lo, frac = math.floor(alpha), alpha - math.floor(alpha)
            interpolated = (1 - frac) * cgf_at(lo) + frac * cgf_at(lo + 1)
            out[i] = min(interpolated, rho * alpha * (alpha - 1)) / (alpha - 1)
    return out


@functools.lru_cache(maxsize=4096)
def _rdp_per_step(q: float, sigma: float, orders: tuple[float, ...]) -> np.ndarray:
    values = wor_gaussian_rdp(
        sample_rate=q, noise_multiplier=sigma, orders=orders, l2_sensitivity=REPLACE_ONE_SENSITIVITY
    )
    values[~(values >= 0)] = math.inf  # NaN would mean a numerical breakdown: drop that order
    values.setflags(write=False)
    return values


class WORAccountant(RDPCurveAccountant):
    """RDP accountant of the Gaussian mechanism subsampled without replacement, replace-one adjacency.

    See the module docstring: Wang–Balle–Kasiviswanathan Theorem 9 at each order, curves of
    the trace's events added, ε by Balle et al. 2020 Thm 21 (as the ``"rdp"`` accountant).
    """

    name = "wor"

    def __init__(self, *, orders: Iterable[float] = DEFAULT_ORDERS) -> None:
        super().__init__(orders=orders)

    def unsupported_reason(self, event: MechanismEvent) -> str | None:
        if event.sampling not in ("without_replacement", "full_batch"):
            return (
                f"sampling: the {self.name!r} accountant handles without_replacement (and full_batch) sampling, "
                f"not {event.sampling!r}"
            )
        if event.sampling == "full_batch":
            return None  # either adjacency: the Gaussian itself, sensitivity C (add_remove) or 2C (replace_one)
        if event.sensitivity != "replace_one":
            return (
                f"sensitivity: the {self.name!r} accountant pairs without_replacement sampling with "
                f"replace_one adjacency, not {event.sensitivity!r}"
            )
        return None

    def step_rdp(self, event: MechanismEvent) -> np.ndarray:
        if event.sampling == "full_batch":  # no subsampling (a warm-up release): the Gaussian's α·Δ²/(2σ²)
            sensitivity = REPLACE_ONE_SENSITIVITY if event.sensitivity == "replace_one" else 1.0
            return np.asarray(self.orders) * (sensitivity ** 2 / (2 * event.noise_multiplier ** 2))
        return _rdp_per_step(event.sample_rate, event.noise_multiplier, self.orders)

    def __repr__(self) -> str:
        default = self.orders == DEFAULT_ORDERS
        return "WORAccountant()" if default else f"WORAccountant(orders={list(self.orders)})"


# --- GS-WGAN ------------------------------------------------------------------------------------


def gswgan_event(*, noise_multiplier: float, batch_size: int, num_shards: int) -> MechanismEvent:
    """One GS-WGAN generator iteration, soundly: one shard out of K, B releases folded into one.

    ``noise_multiplier`` is the per-release σ (noise std / C of each sanitized per-sample
    gradient); the event carries σ/√B at rate 1/K, without replacement, replace-one adjacency.
    """
    batch = as_count(batch_size, "batch_size")
    if batch < 1:
        raise PrivacyError(f"batch_size: must be >= 1, got {batch}")
    shards = as_count(num_shards, "num_shards")
    if shards < 1:
        raise PrivacyError(f"num_shards: must be >= 1, got {shards}")
    return MechanismEvent(
        sampling="without_replacement",
        sample_rate=1.0 / shards,
        noise_multiplier=fold_releases(noise_multiplier, batch),
        sensitivity="replace_one",
    )


def as_published_epsilon(
    *, noise_multiplier: float, batch_size: int, num_shards: int, steps: int, delta: float
) -> float:
    """UNSOUND. The ε that GS-WGAN's released code reports; only to reproduce the paper's numbers.

    What it computes (the authors' ``evaluation/privacy_analysis.py`` with autodp): T·B
    compositions of a Gaussian release with RDP α/(2σ²) — sensitivity C, although their
    Theorem 4.1 derives 2C — each amplified separately by Theorem 9 at rate 1/K, then
    autodp's ``get_eps`` conversion min_α ε(α) + log(1/δ)/(α−1) over real α (log-moment
    interpolated between integers). It is unsound twice over: the B releases of one
    iteration use the same shard, so subsampling amplifies them once, not B times; and a
    replaced record moves each clipped release by up to 2C. Never use it for a release:
    account with :class:`WORAccountant` and :func:`gswgan_event`.
    """
    sigma = check_noise(noise_multiplier)
    batch = as_count(batch_size, "batch_size")
    shards = as_count(num_shards, "num_shards")
    steps = as_count(steps, "steps")
    delta = check_delta_range(delta)
    if batch < 1 or shards < 1:
        raise PrivacyError(f"batch_size, num_shards: must be >= 1, got {batch}, {shards}")
    if steps == 0:
        return 0.0
    compositions = steps * batch
    log_inv_delta = math.log(1 / delta)

    def mironov(orders: list[float]) -> np.ndarray:
        rdp = wor_gaussian_rdp(sample_rate=1.0 / shards, noise_multiplier=sigma, orders=orders, l2_sensitivity=1.0)
        return compositions * rdp + log_inv_delta / (np.asarray(orders) - 1)

    top = 128
    while True:  # integer orders until the best one is interior (autodp widens its range the same way)
        integers = [float(a) for a in range(2, top + 1)]
        values = mironov(integers)
        best = int(integers[int(np.argmin(values))])
        if best < top or top >= 4096:
            break
        top *= 2
    fine = [a for a in np.linspace(best - 1, best + 1, 2001).tolist() if a >= 2]
    return float(min(values.min(), mironov(fine).min()))


__all__ = [
    "DEFAULT_ORDERS",
    "WORAccountant",
    "as_published_epsilon",
    "gswgan_event",
    "wor_gaussian_rdp",
]
