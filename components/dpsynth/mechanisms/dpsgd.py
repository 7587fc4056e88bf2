"""The DP-SGD gradient sanitizer: per-example clipping, summed, plus Gaussian noise.

Per-example gradients come from Opacus (``GradSampleModule``: hooks, or expanded weights), or
are never built: the ghost-clipping engine (:mod:`dpsynth.mechanisms.ghost`) gets each example's
gradient norm from the layers' inputs and output gradients and forms the clipped sum directly.
:func:`private_module` wraps a model for one of these modes (``MODES``); this module turns the
result into one privatized gradient:

    g = (Σ_i clip(∇ℓ_i, C) + N(0, σ²C² I)) / expected_batch_size

Parameters may be split into groups with their own bounds c_j (dp-GAN's parameter
grouping); each group of each example is clipped to c_j and gets noise σ·c_j. With one
group this is plain DP-SGD. The k groups of one step form a single Gaussian release with
multiplier σ/√k (``dpsynth.privacy.events.fold_releases``).

Accounting is attached to the release, as Opacus attaches its accountant to the optimizer's step
hook: a trainer's sanitizer is built with the mechanism ``trace`` and the ``event`` one step is,
refuses an event whose σ is not the σ/√k it adds, and records the event itself in ``finalize``,
once per noisy release — so noise and accounting cannot come apart. A sanitizer built without
them (tests, benchmarks, the empirical audit's noiseless reference) records nothing.

The noise comes from the sanitizer's :class:`~dpsynth.mechanisms.randomness.MechanismRandomness`,
seeded from OS entropy (never from ``train.seed``); a trainer that also Poisson-samples passes its
own, so that the masks and the noise are the one secret stream of the mechanism.

Physical batches larger than memory allows are handled by calling ``accumulate(losses)`` with
each chunk's per-example losses and ``finalize`` once per logical step: the step semantics
(one clip per example, one noise draw, division by the *expected* batch size) are exact.

Under ``torchrun`` the sanitizer's ``reducer`` (:class:`dpsynth.distributed.ranks.NoiseOnRankZero`) makes
one logical step of the job's ranks: rank 0 alone adds the noise, then one SUM all-reduce of the sums.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from dpsynth.errors import PrivacyError
from dpsynth.privacy.events import MechanismEvent, MechanismTrace, fold_releases
from dpsynth.mechanisms.ghost import GhostClipping
from dpsynth.mechanisms.randomness import MechanismRandomness

# grad_sample_mode: Opacus' hooks or expanded weights (per-example gradients instantiated), or ghost
# clipping (norms without per-example gradients) by book-keeping or by a second backward pass
MODES = ("hooks", "ew", "ghost", "ghost_two_pass")


def private_module(module: nn.Module, mode: str) -> nn.Module:
    """``module`` wrapped for ``mode``: its forward then records what the sanitizer needs."""
    if mode in ("hooks", "ew"):
        from opacus.grad_sample.utils import prepare_module

        return prepare_module(module, mode, loss_reduction="sum")
    if mode == "ghost":
        return GhostClipping(module, strategy="bookkeeping")
    if mode == "ghost_two_pass":
        return GhostClipping(module, strategy="two_pass")
    raise ValueError(f"grad_sample_mode: must be one of {', '.join(MODES)}, got {mode!r}")


class RecordedRelease:
    """The contract every sanitizer keeps (Opacus' optimizer-step hook → accountant): built with the mechanism
    ``trace`` and the ``event`` one noisy release is (both or neither), it refuses an event whose σ is not the σ
    it adds folded over the releases that event covers, and records the event itself at each noisy release, so
    noise and accounting cannot come apart. Under torchrun its ``reducer``
    (:class:`dpsynth.distributed.ranks.NoiseOnRankZero`) makes one release of the job's ranks: noise on rank 0
    only, then one SUM all-reduce."""

    def __init__(self, *, trace: MechanismTrace | None, event: MechanismEvent | None):
        if (trace is None) != (event is None):
            raise ValueError("trace, event: a sanitizer that records its releases needs both (or neither)")
        self.trace, self.event = trace, event
        self.reducer = None  # one job on several ranks; None in one process

    def effective_noise_multiplier(self) -> float:
        """The multiplier of the single folded release that one recorded event is."""
        raise NotImplementedError

    def _noise_words(self) -> str:
        raise NotImplementedError

    def _check_event(self) -> None:
        """Refuse to release noise that differs from what the recorded event says."""
        if self.event is not None and not math.isclose(self.event.noise_multiplier, self.effective_noise_multiplier(),
                                                       rel_tol=1e-12):
            raise PrivacyError(f"noise_multiplier: the sanitizer adds {self._noise_words()}, but the event it records "
                               f"has σ = {self.event.noise_multiplier:.6g}; refusing to release")

    def _adds_noise(self) -> bool:
        """Whether this process adds the release's noise: always in one process, rank 0 alone across ranks."""
        return self.reducer is None or self.reducer.adds_noise

    def _record(self) -> None:
        if self.trace is not None:
            self.trace.record(self.event)


class GradientSanitizer(RecordedRelease):
    """Clip, sum and noise per-example gradients: those of ``module`` (from :func:`private_module`),
    given the per-example losses of its forward pass, or those held in ``p.grad_sample``.

    ``trace`` and ``event`` (both or neither): each ``finalize`` records ``event`` in ``trace``."""

    def __init__(
        self,
        params: Sequence[nn.Parameter] | Sequence[Sequence[nn.Parameter]],
        *,
        max_grad_norm: float | Sequence[float],
        noise_multiplier: float,
        expected_batch_size: float,
        randomness: MechanismRandomness | None = None,
        module: nn.Module | None = None,
        trace: MechanismTrace | None = None,
        event: MechanismEvent | None = None,
    ):
        params = list(params)
        groups = [list(g) for g in params] if params and not isinstance(params[0], nn.Parameter) else [params]
        bounds = [float(max_grad_norm)] * len(groups) if isinstance(max_grad_norm, (int, float)) else [float(c) for c in max_grad_norm]
        if len(bounds) != len(groups):
            raise ValueError(f"max_grad_norm: {len(bounds)} bounds for {len(groups)} parameter groups")
        if any(c <= 0 for c in bounds):
            raise ValueError("max_grad_norm: every bound must be > 0")
        if noise_multiplier < 0:
            raise ValueError("noise_multiplier: must be >= 0")
        if expected_batch_size <= 0:
            raise ValueError("expected_batch_size: must be > 0")
        self.groups = groups
        self.bounds = bounds
        self.noise_multiplier = float(noise_multiplier)
        self.expected_batch_size = float(expected_batch_size)
        if randomness is None:  # the sanitizer owns its secret noise
            device = groups[0][0].device if groups and groups[0] else "cpu"
            randomness = MechanismRandomness(device=device)
        self.randomness = randomness
        self.module = module
        self._sums: list[list[torch.Tensor]] | None = None
        super().__init__(trace=trace, event=event)
        self._check_event()

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def set_bounds(self, bounds: Sequence[float]) -> None:
        """Replace the per-group clipping bounds (adaptive clipping from public data)."""
        if len(bounds) != self.num_groups or any(c <= 0 for c in bounds):
            raise ValueError("max_grad_norm: need one positive bound per group")
        self.bounds = [float(c) for c in bounds]

    def regroup(self, groups: Sequence[Sequence[nn.Parameter]], bounds: Sequence[float]) -> None:
        """Replace the groups and their bounds (dp-GAN's clustering, redone from public data).

        The number of groups must stay the same, so the folded release (σ/√k) is unchanged, and
        the groups must partition the same parameters. Not between ``accumulate`` and ``finalize``.
        """
        groups = [list(g) for g in groups]
        if self._sums is not None:
            raise RuntimeError("regroup: a logical batch is being accumulated; finalize it first")
        if len(groups) != self.num_groups:
            raise ValueError(f"groups: {len(groups)} groups given, the sanitizer has {self.num_groups}")
        old = sorted(id(p) for g in self.groups for p in g)
        if sorted(id(p) for g in groups for p in g) != old:
            raise ValueError("groups: must partition the same parameters, each exactly once")
        if len(bounds) != len(groups) or any(c <= 0 for c in bounds):
            raise ValueError("max_grad_norm: need one positive bound per group")
        self.groups = groups
        self.bounds = [float(c) for c in bounds]

    def accumulate(self, losses: torch.Tensor | None = None) -> None:
        """Clip each example's gradient (per group) and add it to the running sums.

        ``losses``: the per-example losses (batch,) of a forward pass through ``module``; the
        sanitizer runs the backward pass. Without them, the per-example gradients must already be
        in ``p.grad_sample`` (set by the caller, or by its own backward through an Opacus module).
        """
        if losses is not None and isinstance(self.module, GhostClipping):
            sums = self.module.clipped_sums(losses, self.groups, self.bounds)
            if self._sums is None:  # the first physical batch: its sums are fresh tensors, the running sums
                self._sums = sums
                return
            with torch.no_grad():
                for acc_group, part in zip(self._sums, sums):
                    for acc, s in zip(acc_group, part):
                        acc.add_(s)
            return
        if losses is not None:
            if losses.dim() != 1:
                raise ValueError(f"losses: need one loss per example, shape (batch,), got {tuple(losses.shape)}")
            losses.sum().backward()
        if self._sums is None:
            self._sums = [[torch.zeros_like(p) for p in group] for group in self.groups]
        self._clip_grad_samples()

    @torch.no_grad()
    def _clip_grad_samples(self) -> None:
        for group, bound, sums in zip(self.groups, self.bounds, self._sums):
            samples = [p.grad_sample for p in group]
            if any(s is None for s in samples):
                raise RuntimeError("a parameter has no grad_sample: run backward through the GradSampleModule first")
            # vector_norm reads the per-example gradients in place; pow(2).sum() would copy them all
            norms = torch.stack([torch.linalg.vector_norm(s.reshape(s.shape[0], -1), dim=1) for s in samples])
            factors = (bound / (torch.linalg.vector_norm(norms, dim=0) + 1e-6)).clamp(max=1.0)
            for s, acc in zip(samples, sums):
                acc.add_(torch.einsum("i,i...->...", factors, s))
        for group in self.groups:
            for p in group:
                p.grad_sample = None
                p.grad = None

    def _noise_words(self) -> str:
        return (f"σ = {self.noise_multiplier:.6g} per group ({self.num_groups} group(s): one release of σ/√k = "
                f"{self.effective_noise_multiplier():.6g})")

    @torch.no_grad()
    def finalize(self) -> None:
        """Add the noise and write the privatized mean gradient to ``p.grad``; reset the sums; record
        the release's event in the trace (when built with one)."""
        self._check_event()
        if self._sums is None:  # an empty logical batch still gets its noise
            self._sums = [[torch.zeros_like(p) for p in group] for group in self.groups]
        reducer = self.reducer
        for group, bound, sums in zip(self.groups, self.bounds, self._sums):
            std = self.noise_multiplier * bound
            for p, acc in zip(group, sums):
                if std > 0 and self._adds_noise():
                    acc.add_(self.randomness.standard_normal(p.shape, dtype=p.dtype) * std)
        if reducer is not None:  # every rank: Σ_r sums_r + the noise rank 0 added
            reducer.all_reduce([acc for sums in self._sums for acc in sums])
        for group, sums in zip(self.groups, self._sums):
            for p, acc in zip(group, sums):
                p.grad = acc / self.expected_batch_size
        self._sums = None
        self._record()

    def effective_noise_multiplier(self) -> float:
        """The multiplier of the single folded release that one step of this sanitizer is."""
        return self.noise_multiplier / math.sqrt(self.num_groups)


def sanitize(grads: torch.Tensor, *, clip_norm: float, noise_multiplier: float,
             randomness: MechanismRandomness | None = None) -> torch.Tensor:
    """M_{σ,C} on each row: clip g_i to L2 norm ≤ C, add independent N(0, (σC)²) to every coordinate.

    The noise comes from ``randomness`` (the mechanism's secret coins); None: fresh OS-entropy coins."""
    flat = grads.flatten(1)
    scale = (clip_norm / (flat.norm(dim=1) + 1e-12)).clamp(max=1.0)
    clipped = flat * scale[:, None]
    if noise_multiplier == 0:
        return clipped.view_as(grads)
    randomness = randomness or MechanismRandomness(device=clipped.device)
    noise = randomness.standard_normal(clipped.shape, dtype=clipped.dtype)
    return (clipped + noise * (noise_multiplier * clip_norm)).view_as(grads)


class InputGradientSanitizer(RecordedRelease):
    """GS-WGAN's M_{σ,C} (:func:`sanitize`) on the per-sample gradients g_i = ∂ℓ_i/∂G(z_i) the generator receives,
    with the mechanism's secret coins: each call releases ``releases`` sanitized rows and records ``event`` —
    those releases folded into one (σ/√releases); a call with another number of rows is refused.

    Across torchrun ranks (:mod:`dpsynth.distributed.data_parallel`) only the rank holding D_k passes the B gradients
    (the others pass zeros), rank 0 alone adds the noise (σC per coordinate, from its secret coins: the
    one-process stream), and one SUM all-reduce gives every rank clip(g_i, C) + N(0, σ²C²)."""

    def __init__(self, *, clip_norm: float, noise_multiplier: float, randomness: MechanismRandomness,
                 trace: MechanismTrace | None = None, event: MechanismEvent | None = None, releases: int = 1):
        super().__init__(trace=trace, event=event)
        self.clip_norm, self.noise_multiplier, self.randomness = clip_norm, noise_multiplier, randomness
        self.releases = releases
        self._check_event()

    def effective_noise_multiplier(self) -> float:
        return fold_releases(self.noise_multiplier, self.releases)

    def _noise_words(self) -> str:
        return (f"σ = {self.noise_multiplier:.6g} per release ({self.releases} per event: σ/√{self.releases} = "
                f"{self.effective_noise_multiplier():.6g})")

    def __call__(self, grads: torch.Tensor) -> torch.Tensor:
        if self.trace is not None and len(grads) != self.releases:
            raise PrivacyError(f"sanitizer: {len(grads)} releases given, its event folds {self.releases}")
        noise = self.noise_multiplier if self._adds_noise() else 0.0
        released = sanitize(grads, clip_norm=self.clip_norm, noise_multiplier=noise, randomness=self.randomness)
        if self.reducer is not None:  # every rank: the owner's clipped rows + the noise rank 0 added
            self.reducer.all_reduce([released])
        self._record()
        return released
