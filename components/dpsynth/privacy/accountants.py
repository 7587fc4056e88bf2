"""Accountants: from a mechanism trace to an upper bound on ε at a given δ.

Every accountant answers one question, ``epsilon(trace, delta=δ)``: an **upper bound** on
the ε for which the whole trace is (ε, δ)-DP. Each says which events it can account
(``supports``) and refuses the rest with a PrivacyError rather than guess.

* ``"rdp"`` — Rényi DP of the Poisson-subsampled Gaussian (Mironov, Talwar, Zhang 2019,
  arXiv:1908.10530), computed by Opacus' ``opacus.accountants.analysis.rdp`` over Opacus'
  default orders; the curves of heterogeneous events add (RDP composition); conversion to
  (ε, δ) by Balle et al. 2020 (arXiv:1905.09982, Thm 21), as Opacus does. ``full_batch``
  (q = 1) is the plain Gaussian mechanism, RDP α/(2σ²).
* ``"prv"`` — numerical composition of privacy loss random variables (Gopi, Lee, Wutschitz
  2021, arXiv:2106.02848). We use the implementation Opacus vendors
  (``opacus.accountants.analysis.prv``), not Microsoft's ``prv-accountant`` 0.2.0 from
  PyPI: that release predates the upstream robustness fixes Opacus carries, and Opacus
  is already the library that computes the gradients, so one pinned dependency owns both.
  ``prv-accountant`` stays as an independent cross-check in the tests. The audit runs PRV
  through :func:`prv_bounds_or_rdp`: in a child process with a time limit
  (:data:`PRV_TIME_LIMIT_S`), falling back to the RDP bound (a valid upper bound) when PRV fails
  or runs out of time. The bound returned
  is the PRV ``eps_upper`` for the stated ``eps_error`` (default 0.01) and
  ``delta_error`` (default δ/1000, as Opacus). Two things differ from Opacus'
  ``PRVAccountant``: repeated events are grouped before composing, and the discretization
  grid is widened symmetrically to an FFT-friendly length (a wider truncation domain is
  still safe; it avoids Bluestein FFTs whose cached plans cost ~0.7 GB per new length).
  Like Opacus, it composes the "remove" pair ((1−q)N(0,σ²) + qN(1,σ²), N(0,σ²)); for the
  subsampled Gaussian it dominates the "add" pair (shown for RDP by Mironov et al. 2019;
  the tests check the composed PRV curves of both pairs numerically).

Both handle ``sampling="poisson"`` (any q in (0, 1]) and ``"full_batch"`` with
``sensitivity="add_remove"``. Fixed-size batches and shard choice (``without_replacement``,
``replace_one``) need the Wang–Balle–Kasiviswanathan bound: the ``"wor"`` accountant in
:mod:`dpsynth.privacy.without_replacement`, registered with :func:`register_accountant` when
:mod:`dpsynth.privacy` is imported.
"""

from __future__ import annotations

import abc
import functools
import math
import warnings
from typing import TYPE_CHECKING, ClassVar, Iterable

import numpy as np
from scipy import fft

from dpsynth.errors import PrivacyError
from dpsynth.privacy.events import MechanismEvent, MechanismTrace
from dpsynth.privacy.checks import as_real, check_delta_range

if TYPE_CHECKING:
    from opacus.accountants.analysis import prv as opacus_prv

# Opacus's RDP and PRV analyses are imported where they are used: importing the opacus package runs its __init__,
# which loads its optimizers, torch.distributed.tensor and scipy.stats, and most dpsynth processes (partition, sample,
# evaluate, a pipeline's start and finish, `config show`) never compute an ε (the stage runner's import beyond torch:
# 2.9 CPU-s with Opacus and scipy.stats imported at the top, 0.8 without; #53).

# Opacus's RDPAccountant.DEFAULT_ALPHAS (tests/privacy/test_accountants.py checks that the two agree)
DEFAULT_ORDERS: tuple[float, ...] = tuple(float(a) for a in [*(1 + x / 10.0 for x in range(1, 100)), *range(12, 64)])


def _as_trace(trace: MechanismTrace | Iterable[MechanismEvent]) -> MechanismTrace:
    return trace if isinstance(trace, MechanismTrace) else MechanismTrace(trace)


class Accountant(abc.ABC):
    """Maps a :class:`MechanismTrace` to an upper bound on ε at a given δ."""

    name: ClassVar[str]

    @abc.abstractmethod
    def unsupported_reason(self, event: MechanismEvent) -> str | None:
        """Why this accountant cannot account ``event`` ("field: ..."), or None when it can."""

    def supports(self, event: MechanismEvent) -> bool:
        return self.unsupported_reason(event) is None

    def check(self, trace: MechanismTrace) -> None:
        """Raise PrivacyError for the first event this accountant cannot account."""
        for event in trace.events:
            reason = self.unsupported_reason(event)
            if reason is not None:
                raise PrivacyError(reason)

    def epsilon(self, trace: MechanismTrace | Iterable[MechanismEvent], *, delta: float) -> float:
        """An upper bound on ε such that ``trace`` is (ε, δ)-DP; 0.0 for an empty trace."""
        trace = _as_trace(trace)
        delta = check_delta_range(delta)
        self.check(trace)
        if trace.steps == 0:
            return 0.0
        return float(self._epsilon(trace, delta))

    @abc.abstractmethod
    def _epsilon(self, trace: MechanismTrace, delta: float) -> float:
        """ε for a non-empty, supported trace and a valid δ."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class PoissonGaussianAccountant(Accountant):
    """Base of accountants for the Poisson-subsampled Gaussian under add/remove adjacency."""

    def unsupported_reason(self, event: MechanismEvent) -> str | None:
        if event.sampling not in ("poisson", "full_batch"):
            return (
                f"sampling: the {self.name!r} accountant handles Poisson or full-batch sampling, "
                f"not {event.sampling!r} (that needs a without-replacement accountant)"
            )
        if event.sensitivity != "add_remove":
            return (
                f"sensitivity: the {self.name!r} accountant pairs {event.sampling} sampling with "
                f"add_remove adjacency, not {event.sensitivity!r}"
            )
        return None


@functools.lru_cache(maxsize=4096)
def _rdp_per_step(q: float, sigma: float, orders: tuple[float, ...]) -> np.ndarray:
    """RDP of one step of the sampled Gaussian at each order (Opacus' formulas).

    An order whose computation fails numerically is set to +inf: ε is a minimum over
    orders, so dropping one can only loosen the bound.
    """
    from opacus.accountants.analysis import rdp as opacus_rdp

    values = np.empty(len(orders))
    for i, alpha in enumerate(orders):
        order = int(alpha) if float(alpha).is_integer() else float(alpha)
        try:
            values[i] = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=[order])[0]
        except (ValueError, OverflowError, FloatingPointError, ZeroDivisionError):
            values[i] = math.inf
    values[~(values >= 0)] = math.inf  # NaN means the computation broke down
    values.setflags(write=False)
    return values


class RDPCurveAccountant(Accountant):
    """Base of RDP accountants: add the per-step RDP curves of the trace's events at each
    order, convert to (ε, δ) by Balle et al. 2020 Thm 21 (Opacus' ``get_privacy_spent``)."""

    def __init__(self, *, orders: Iterable[float] = DEFAULT_ORDERS) -> None:
        self.orders = tuple(float(a) for a in orders)
        if not self.orders or any(not a > 1 or not math.isfinite(a) for a in self.orders):
            raise PrivacyError("orders: must be a non-empty list of finite RDP orders > 1")

    @abc.abstractmethod
    def step_rdp(self, event: MechanismEvent) -> np.ndarray:
        """RDP of one step of ``event`` at ``self.orders``."""

    def rdp(self, trace: MechanismTrace | Iterable[MechanismEvent]) -> np.ndarray:
        """The trace's RDP curve at ``self.orders``: Σ_events count · RDP_step(α)."""
        trace = _as_trace(trace)
        self.check(trace)
        total = np.zeros(len(self.orders))
        for event in trace.events:
            total += event.count * self.step_rdp(event)
        return total

    def _epsilon(self, trace: MechanismTrace, delta: float) -> float:
        from opacus.accountants.analysis import rdp as opacus_rdp

        curve = self.rdp(trace)
        if not np.isfinite(curve).any():
            return math.inf
        with warnings.catch_warnings():
            # "optimal order is the smallest/largest alpha": the bound is still valid, only looser.
            warnings.simplefilter("ignore", UserWarning)
            eps, _ = opacus_rdp.get_privacy_spent(orders=list(self.orders), rdp=curve, delta=delta)
        eps = float(eps)
        return math.inf if math.isnan(eps) else max(eps, 0.0)


class RDPAccountant(PoissonGaussianAccountant, RDPCurveAccountant):
    """Rényi-DP accountant of the Poisson-subsampled Gaussian (see the module docstring)."""

    name = "rdp"

    def step_rdp(self, event: MechanismEvent) -> np.ndarray:
        return _rdp_per_step(event.sample_rate, event.noise_multiplier, self.orders)

    def __repr__(self) -> str:
        default = self.orders == DEFAULT_ORDERS
        return "RDPAccountant()" if default else f"RDPAccountant(orders={list(self.orders)})"


class PRVAccountant(PoissonGaussianAccountant):
    """PRV accountant (Gopi et al. 2021) on Opacus' vendored implementation; returns ``eps_upper``."""

    name = "prv"
    max_grid_points: ClassVar[int] = 2**26  # ~0.5 GB per array; peak use is a few arrays

    def __init__(self, *, eps_error: float = 0.01, delta_error: float | None = None) -> None:
        self.eps_error = as_real(eps_error, "eps_error")
        if not 0 < self.eps_error < 1:
            raise PrivacyError(f"eps_error: must be in (0, 1), got {self.eps_error}")
        self.delta_error = None if delta_error is None else as_real(delta_error, "delta_error")
        if self.delta_error is not None and not self.delta_error > 0:
            raise PrivacyError(f"delta_error: must be > 0, got {self.delta_error}")

    def bounds(self, trace: MechanismTrace | Iterable[MechanismEvent], *, delta: float) -> tuple[float, float, float]:
        """(eps_lower, eps_estimate, eps_upper) of the PRV accountant."""
        trace = _as_trace(trace)
        delta = check_delta_range(delta)
        self.check(trace)
        if trace.steps == 0:
            return (0.0, 0.0, 0.0)
        delta_error = self._delta_error(delta)
        try:
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # Opacus' RDP order-range notice
                dprv = self._compose(trace, delta_error)
                low, est, up = dprv.compute_epsilon(delta, delta_error, self.eps_error)
        except (RuntimeError, ValueError, FloatingPointError) as exc:
            raise PrivacyError(
                f"accountant: the PRV accountant cannot bound this trace at delta={delta} ({exc}); "
                "use the 'rdp' accountant"
            ) from None
        return float(low), float(est), float(up)

    def _epsilon(self, trace: MechanismTrace, delta: float) -> float:
        return self.bounds(trace, delta=delta)[2]

    def _delta_error(self, delta: float) -> float:
        delta_error = delta / 1000 if self.delta_error is None else self.delta_error
        if not delta_error < delta:
            raise PrivacyError(f"delta_error: must be < delta = {delta}, got {delta_error}")
        return delta_error

    def _compose(self, trace: MechanismTrace, delta_error: float) -> opacus_prv.DiscretePRV:
        from opacus.accountants.analysis import prv as opacus_prv

        counts: dict[tuple[float, float], int] = {}  # composition commutes: group equal mechanisms
        for e in trace.events:
            key = (e.sample_rate, e.noise_multiplier)
            counts[key] = counts.get(key, 0) + e.count
        prvs = [opacus_prv.PoissonSubsampledGaussianPRV(q, sigma) for q, sigma in counts]
        steps = list(counts.values())
        domain = self._domain(prvs, steps, delta_error)
        composed = None
        for prv, n in zip(prvs, steps):
            truncated = opacus_prv.TruncatedPrivacyRandomVariable(prv, domain.t_min, domain.t_max)
            part = opacus_prv.compose_heterogeneous([opacus_prv.discretize(truncated, domain)], [n])
            # folding pairwise keeps two grids in memory however many distinct events there are
            composed = part if composed is None else opacus_prv.compose_heterogeneous([composed, part], [1, 1])
        return composed

    def _domain(self, prvs: list, steps: list[int], delta_error: float) -> opacus_prv.Domain:
        """Opacus' safe domain (Gopi et al. Remark 5.6) and mesh, widened to an FFT-friendly size."""
        from opacus.accountants.analysis import prv as opacus_prv

        half_width = opacus_prv.compute_safe_domain_size(
            prvs=prvs, max_self_compositions=steps, eps_error=self.eps_error, delta_error=delta_error
        )
        mesh = self.eps_error / math.sqrt(sum(steps) * math.log(12 / delta_error) / 2)
        if not math.isfinite(half_width) or 2 * half_width / mesh > self.max_grid_points:
            raise PrivacyError(
                f"accountant: the PRV grid for {sum(steps)} steps would exceed {self.max_grid_points} points; "
                "raise eps_error or use the 'rdp' accountant"
            )
        domain = opacus_prv.Domain.create_aligned(-half_width, half_width, mesh)
        # Opacus' FFT composition assumes t = 0 sits at index size/2 - 1; widen both sides equally.
        size = fft.next_fast_len(domain.size, real=True)
        while size % 2:
            size = fft.next_fast_len(size + 1, real=True)
        pad = (size - domain.size) // 2
        dt = domain.dt
        return opacus_prv.Domain(t_min=domain.t_min - pad * dt, t_max=domain.t_max + pad * dt, size=size)

    def __repr__(self) -> str:
        return f"PRVAccountant(eps_error={self.eps_error}, delta_error={self.delta_error})"


PRV_TIME_LIMIT_S = 120.0  # the audit's limit on one PRV computation (seconds of wall-clock)


def _prv_child(conn, trace_json: str, delta: float, eps_error: float) -> None:
    try:
        prv = PRVAccountant(eps_error=eps_error)
        conn.send(("ok", prv.bounds(MechanismTrace.from_json(trace_json), delta=delta)))
    except Exception as exc:  # noqa: BLE001 — reported to the parent, which falls back
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def prv_bounds_or_rdp(trace: MechanismTrace, *, delta: float, time_limit_s: float = PRV_TIME_LIMIT_S,
                      eps_error: float = 0.01) -> dict:
    """PRV's ``{"lower", "estimate", "upper", "eps_error"}`` of ``trace``, computed in a child process
    stopped after ``time_limit_s``; when it fails or runs out of time, the RDP bound instead:
    ``{"upper": ε_RDP, "eps_error": 0, "fallback": "rdp", "reason": …}``.

    The fallback is sound: RDP of the Poisson-subsampled Gaussian converted by Balle et al. 2020
    Thm 21 is a rigorous upper bound on ε of the same trace (PRV's upper bound only tightens it,
    within its eps_error), so replacing PRV's number by RDP's can only state more ε, never less.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_prv_child, args=(child, trace.to_json(), delta, eps_error), daemon=True)
    proc.start()
    child.close()
    try:
        result = parent.recv() if parent.poll(max(time_limit_s, 0.0)) else ("timeout", None)
    except EOFError:  # the child died (out of memory, killed)
        result = ("error", f"the PRV process ended with exit code {proc.exitcode}")
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        parent.close()
    status, value = result
    if status == "ok":
        low, est, up = value
        return {"lower": low, "estimate": est, "upper": up, "eps_error": eps_error}
    reason = f"PRV did not finish within {time_limit_s:g} s" if status == "timeout" else f"PRV failed ({value})"
    return {"upper": RDPAccountant().epsilon(trace, delta=delta), "eps_error": 0.0, "fallback": "rdp",
            "reason": reason + "; the RDP bound, a valid upper bound on the same trace, stands in"}
