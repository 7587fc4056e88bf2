"""Central images: one Gaussian release of every class's mean image (a DP warm-up).

It holds :func:`central_images` (the class means), :func:`style_images` (the means of style groups),
:func:`variation_directions` and :func:`intensity_histogram`, each one event, :func:`dpsynth.privacy.full_batch_gaussian`,
after Li et al. (2025). What each release sums, why one record moves it by at most C, and the event it is:
docs/privacy.md, "Central images: the query and its sensitivity".

>>> import torch
>>> x = torch.full((4, 1, 2, 2), -1.0); x[2:] = 1.0          # two black, two white images
>>> y = torch.tensor([0, 0, 1, 1])
>>> means = central_images(x, y, num_classes=2, clip=10.0, noise_multiplier=0.0)  # σ = 0: not private
>>> means[:, 0, 0, 0].tolist()
[-1.0, 1.0]
>>> e = full_batch_gaussian(20.0); e.sampling, e.sample_rate, e.noise_multiplier
('full_batch', 1.0, 20.0)
"""

from __future__ import annotations

import math
from typing import Protocol

import torch

from dpsynth.errors import PrivacyError
from dpsynth.privacy.events import MechanismTrace, full_batch_gaussian


class SecretCoins(Protocol):
    """What the releases draw from the mechanism's secret coins: a
    :class:`dpsynth.mechanisms.randomness.MechanismRandomness` (the method's mechanism holds it; this room sits
    below the mechanisms, which read the warm-up's releases, so it names the one call it makes)."""

    def standard_normal(self, shape: tuple[int, ...], *, dtype: torch.dtype | None = None) -> torch.Tensor: ...


def _contributions(images: torch.Tensor, clip: float, centre: float = 0.0) -> torch.Tensor:
    """Every record's [x̃_i, c]: the image in [0, 1] less the public ``centre``, clipped to C/√2, and the count
    coordinate C/√2."""
    if clip <= 0:
        raise PrivacyError(f"warmup.clip: must be > 0, got {clip}")
    x = ((images.double() + 1) / 2).flatten(1).cpu() - centre  # [0, 1], on the CPU as every query here
    part = clip / math.sqrt(2)
    x = x * (part / x.norm(dim=1).clamp(min=part)).unsqueeze(1)
    return torch.cat([x, torch.full((len(x), 1), part, dtype=x.dtype)], dim=1)


def group_sums(images: torch.Tensor, groups: torch.Tensor, *, num_groups: int, clip: float,
               centre: float = 0.0) -> torch.Tensor:
    """The noiseless query: a (num_groups, D + 1) matrix, row k = Σ over the records of group k of [x̃_i, c].
    Each record's group must be a function of that record and public values only."""
    v = _contributions(images, clip, centre)
    sums = torch.zeros(num_groups, v.shape[1], dtype=v.dtype)
    sums.index_add_(0, groups.long().cpu(), v)
    return sums


def class_sums(images: torch.Tensor, labels: torch.Tensor, *, num_classes: int, clip: float,
               centre: float = 0.0) -> torch.Tensor:
    """The class-mean query: one group per class."""
    return group_sums(images, labels, num_groups=num_classes, clip=clip, centre=centre)


def nearest_template(images: torch.Tensor, labels: torch.Tensor, templates: torch.Tensor,
                     template_labels: torch.Tensor) -> torch.Tensor:
    """Each record's group: the index of the nearest (L2, on [0, 1]) of the templates of its own class.
    Reads the record and the public templates only, so one record moves one group's sum."""
    x = ((images.float() + 1) / 2).flatten(1).cpu()
    t = ((templates.float() + 1) / 2).flatten(1).cpu()
    d = torch.cdist(x, t)
    d[labels.long().cpu().unsqueeze(1) != template_labels.long().cpu().unsqueeze(0)] = float("inf")
    if torch.isinf(d.min(1).values).any():
        raise PrivacyError("warmup: a class has no template")
    return d.argmin(1)


def noisy_means(sums: torch.Tensor, *, clip: float, noise_multiplier: float,
                randomness: SecretCoins | None, observe=None, centre: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The Gaussian mechanism on stacked sums: N(0, (σC)²) on every coordinate; returns every group's
    mean in [0, 1] (noisy sum / noisy count, post-processing) and its noisy count. ``observe(noisy, query)``,
    when given, sees the mechanism's raw output and the noiseless query (the empirical audit's run only)."""
    sums = _noised(sums, clip=clip, noise_multiplier=noise_multiplier, randomness=randomness, observe=observe)
    counts = sums[:, -1] / (clip / math.sqrt(2))
    means = (sums[:, :-1] / counts.clamp(min=1.0).unsqueeze(1) + centre).clamp(0, 1)
    return means, counts


def _noised(sums: torch.Tensor, *, clip: float, noise_multiplier: float, randomness: SecretCoins | None,
            observe=None, field: str = "warmup.noise_multiplier") -> torch.Tensor:
    """The Gaussian mechanism on stacked sums of sensitivity ``clip``: N(0, (σC)²) on every coordinate (σ = 0: none,
    not private). ``observe(noisy, query)`` sees the raw output and the noiseless query (the audit run only)."""
    if noise_multiplier < 0:
        raise PrivacyError(f"{field}: must be >= 0, got {noise_multiplier}")
    query = sums
    if noise_multiplier > 0:
        if randomness is None:
            raise PrivacyError("central images: noise needs the mechanism's secret randomness")
        noise = randomness.standard_normal(tuple(sums.shape), dtype=torch.float64).cpu()
        sums = sums + noise_multiplier * clip * noise
    if observe is not None:
        observe(sums, query)
    return sums


def central_images(images: torch.Tensor, labels: torch.Tensor, *, num_classes: int, clip: float,
                   noise_multiplier: float, randomness: SecretCoins | None = None,
                   trace: MechanismTrace | None = None, with_counts: bool = False, observe=None, centre: float = 0.0):
    """The noisy class means, shaped (num_classes, C, H, W) in [-1, 1] (and, ``with_counts``, the classes'
    noisy counts); the release records ``full_batch_gaussian(noise_multiplier)`` in ``trace`` (a mechanism's trace;
    None: records nothing).

    ``images`` are N×C×H×W in [-1, 1]. ``randomness`` is the mechanism's secret coins (required when
    ``noise_multiplier`` > 0). ``observe``: :func:`noisy_means`'. ``centre`` (public, on [0, 1]) is taken off every
    pixel before the clip and added back to the means: images far from black (light paper, colour) then lose less
    to the clip.
    """
    sums = class_sums(images, labels, num_classes=num_classes, clip=clip, centre=centre)
    means, counts = noisy_means(sums, clip=clip, noise_multiplier=noise_multiplier, randomness=randomness,
                                observe=observe, centre=centre)
    if trace is not None:
        trace.record(full_batch_gaussian(noise_multiplier))
    means = (means * 2 - 1).float().view(num_classes, *images.shape[1:])
    return (means, counts.float()) if with_counts else means


def style_images(images: torch.Tensor, labels: torch.Tensor, templates: torch.Tensor, template_labels: torch.Tensor,
                 *, clip: float, noise_multiplier: float,
                 randomness: SecretCoins | None = None,
                 trace: MechanismTrace | None = None, observe=None, centre: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The noisy means of the groups that the public ``templates`` (K×C×H×W in [-1, 1], class
    ``template_labels``) induce: (K×C×H×W in [-1, 1], the K noisy counts). One Gaussian event, which
    the release records in ``trace`` (``full_batch_gaussian(noise_multiplier)``; None: records nothing). ``observe``:
    :func:`noisy_means`'."""
    groups = nearest_template(images, labels, templates, template_labels)
    return group_images(images, groups, num_groups=len(templates), clip=clip, noise_multiplier=noise_multiplier,
                        randomness=randomness, trace=trace, observe=observe, centre=centre)


def group_images(images: torch.Tensor, groups: torch.Tensor, *, num_groups: int, clip: float, noise_multiplier: float,
                 randomness: SecretCoins | None = None, trace: MechanismTrace | None = None, observe=None,
                 centre: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The noisy means of ``num_groups`` groups (each record's group a function of that record and public values
    only): (num_groups×C×H×W in [-1, 1], the noisy counts). One Gaussian event, ``full_batch_gaussian(noise_multiplier)``,
    recorded in ``trace`` (None: records nothing). ``observe``: :func:`noisy_means`'."""
    sums = group_sums(images, groups, num_groups=num_groups, clip=clip, centre=centre)
    means, counts = noisy_means(sums, clip=clip, noise_multiplier=noise_multiplier, randomness=randomness,
                                observe=observe, centre=centre)
    if trace is not None:
        trace.record(full_batch_gaussian(noise_multiplier))
    return (means * 2 - 1).float().view(num_groups, *images.shape[1:]), counts.float()


# --- polarity shapes: shapes whatever their colours --------------------------------------------------------
# A class of shapes drawn in random colours on random backgrounds has a flat grey mean: the colours average out,
# and so does the shape, lighter than its surroundings in some records and darker in others. This release keeps it:
# every record computes alone its luminance less its own mean, scaled to unit norm (f), and its polarity, the sign
# of f's third moment (+: the rarer tone — a shape on a larger background — is lighter than the rest, −: darker);
# each class is split by polarity into two groups, and the groups' sums of [s·f·C/√2, C/√2] (s the polarity: the
# shape always bright) are released: one record moves one group's row by ≤ C, one Gaussian event of sensitivity C.


def polarity(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each record's (f, s): its luminance (the mean of its channels, on [0, 1]) less its own mean, scaled to L2 norm
    1 (a flat image: 0), N × H·W in float64; and its polarity s ∈ {+1, −1}, the sign of Σ f³ (0 counts as +1). A
    function of the record alone."""
    lum = ((images.double() + 1) / 2).mean(1).flatten(1).cpu()
    g = lum - lum.mean(1, keepdim=True)
    f = g / g.norm(dim=1, keepdim=True).clamp(min=1e-12)
    return f, torch.where(f.pow(3).sum(1) < 0, -1.0, 1.0).to(f.dtype)


def shape_sums(images: torch.Tensor, labels: torch.Tensor, *, num_classes: int, clip: float) -> torch.Tensor:
    """The noiseless query: a (2·num_classes, H·W + 1) matrix, row 2k + (s < 0) = Σ over the records of class k
    and polarity s of [s·f·C/√2, C/√2] (:func:`polarity`). ‖f‖ ≤ 1, so one record moves one row by ≤ C."""
    if clip <= 0:
        raise PrivacyError(f"warmup.clip: must be > 0, got {clip}")
    f, s = polarity(images)
    part = clip / math.sqrt(2)
    v = torch.cat([f * s.unsqueeze(1) * part, torch.full((len(f), 1), part, dtype=f.dtype)], dim=1)
    groups = 2 * labels.long().cpu() + (s < 0).long()
    return torch.zeros(2 * num_classes, v.shape[1], dtype=v.dtype).index_add_(0, groups, v)


def polarity_shapes(images: torch.Tensor, labels: torch.Tensor, *, num_classes: int, clip: float,
                    noise_multiplier: float, randomness: SecretCoins | None = None,
                    trace: MechanismTrace | None = None, observe=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (class, polarity) group's shape: the Gaussian mechanism on :func:`shape_sums` (noise std σ·C on every
    coordinate), then — post-processing — noisy sum over noisy count: (2·num_classes × H·W in float64, the shape
    bright and unit-less, class-major, polarity + then −; the 2·num_classes noisy counts). One event,
    ``full_batch_gaussian(noise_multiplier)``, recorded in ``trace`` (None: records nothing)."""
    sums = _noised(shape_sums(images, labels, num_classes=num_classes, clip=clip), clip=clip,
                   noise_multiplier=noise_multiplier, randomness=randomness, observe=observe,
                   field="warmup.polarity_noise_multiplier")
    if trace is not None:
        trace.record(full_batch_gaussian(noise_multiplier))
    part = clip / math.sqrt(2)
    counts = sums[:, -1] / part
    return sums[:, :-1] / part / counts.clamp(min=1.0).unsqueeze(1), counts.float()


# --- intensity histogram: a release before the class means ---------------------------------------------


INTENSITY_BINS = 16


def intensity_sums(images: torch.Tensor, *, bins: int = INTENSITY_BINS) -> torch.Tensor:
    """The noiseless query: Σ over records of each record's histogram of pixel intensities (every channel, on
    [0, 1], ``bins`` equal bins), normalised to sum 1. One record's vector has L1 norm 1, so L2 ≤ 1: adding or
    removing a record moves the sum by at most 1."""
    x = ((images.double() + 1) / 2).flatten(1).cpu().clamp(0, 1)
    idx = (x * bins).long().clamp(max=bins - 1)
    per_record = torch.zeros(len(x), bins, dtype=torch.float64).scatter_add_(1, idx, torch.ones_like(x))
    return (per_record / x.shape[1]).sum(0)


def intensity_histogram(images: torch.Tensor, *, noise_multiplier: float, randomness: SecretCoins | None,
                        trace: MechanismTrace | None = None, bins: int = INTENSITY_BINS, observe=None) -> torch.Tensor:
    """The share of pixels in each intensity bin over the whole dataset: the Gaussian mechanism on
    :func:`intensity_sums` (sensitivity 1, noise N(0, σ²) per bin), then — post-processing — clamped at 0 and
    normalised. One event, ``full_batch_gaussian(noise_multiplier)``, recorded in ``trace`` (None: records nothing).
    ``observe(noisy, query)`` sees the raw output and the noiseless query (the empirical audit's run only)."""
    if noise_multiplier <= 0:
        raise PrivacyError(f"warmup.intensity_noise_multiplier: must be > 0, got {noise_multiplier}")
    if randomness is None:
        raise PrivacyError("central images: noise needs the mechanism's secret randomness")
    query = intensity_sums(images, bins=bins)
    sums = query + noise_multiplier * randomness.standard_normal((bins,), dtype=torch.float64).cpu()
    if observe is not None:
        observe(sums, query)
    if trace is not None:
        trace.record(full_batch_gaussian(noise_multiplier))
    sums = sums.clamp(min=0)
    return (sums / sums.sum().clamp(min=1e-12)).float()


# --- variation directions: a third release ------------------------------------------------------------


def residual_second_moments(images: torch.Tensor, labels: torch.Tensor, centres: torch.Tensor,
                            centre_labels: torch.Tensor, *, num_classes: int, clip: float) -> torch.Tensor:
    """The noiseless query of the variation release: for every class c, Σ r_i r_iᵀ over its records, where
    r_i is record i's image (in [0, 1]) minus the nearest public centre of its class, clipped to L2 norm
    ``clip``. Returns (num_classes, D, D) in float64. Adding or removing one record changes one class's
    matrix by r rᵀ, whose Frobenius norm is ‖r‖² ≤ clip²."""
    if clip <= 0:
        raise PrivacyError(f"warmup.variations_clip: must be > 0, got {clip}")
    groups = nearest_template(images, labels, centres, centre_labels)
    x = ((images.double() + 1) / 2).flatten(1).cpu()
    r = x - ((centres.double() + 1) / 2).flatten(1).cpu()[groups]
    r = r * (clip / r.norm(dim=1).clamp(min=clip)).unsqueeze(1)
    y = labels.long().cpu()
    return torch.stack([r[y == c].T @ r[y == c] for c in range(num_classes)])


def symmetric_noise(shape: tuple[int, int, int], *, randomness: SecretCoins) -> torch.Tensor:
    """Standard normal noise on every entry on or above the diagonal of each matrix, mirrored below it:
    one independent draw per coordinate of the upper-triangle vectorisation (the query's output)."""
    n, d, _ = shape
    iu = torch.triu_indices(d, d)
    upper = randomness.standard_normal((n, iu.shape[1]), dtype=torch.float64).cpu()
    out = torch.zeros(shape, dtype=torch.float64)
    out[:, iu[0], iu[1]] = upper
    out[:, iu[1], iu[0]] = upper
    return out


def variation_directions(images: torch.Tensor, labels: torch.Tensor, centres: torch.Tensor,
                         centre_labels: torch.Tensor, counts: torch.Tensor, *, rank: int, clip: float,
                         noise_multiplier: float, randomness: SecretCoins | None = None,
                         trace: MechanismTrace | None = None, observe=None, shared: bool = False) -> torch.Tensor:
    """Each class's main directions of variation around its released images: the Gaussian mechanism on the
    upper triangles of the stacked residual second-moment matrices (sensitivity clip², noise
    N(0, (σ·clip²)²) per entry), then — post-processing — each divided by the class's released count and its
    top ``rank`` eigenvectors scaled by the square roots of their eigenvalues. Returns
    (num_classes, rank, C, H, W) in [-1, 1] units: class c's samples vary as Σ_j a_j·P[c, j], a ~ N(0, I).
    ``counts`` are the classes' noisy counts from an earlier release (public). One Gaussian event, recorded
    as ``full_batch_gaussian(noise_multiplier)`` in ``trace`` (None: records nothing). ``observe(noisy, query)``: the noisy
    and the noiseless moment matrices (the empirical audit's run only).

    ``shared``: the classes' matrices are summed before the noise, one matrix (1, D, D) released, whose directions
    every class shares: a record still moves it by ‖r‖² ≤ clip² (the same event), but the signal is every
    record's instead of one class's, for the same noise (what pays at a low ε)."""
    num_classes = len(counts)
    moments = residual_second_moments(images, labels, centres, centre_labels, num_classes=num_classes, clip=clip)
    if shared:
        moments, counts = moments.sum(0, keepdim=True), counts.sum().view(1)
    if noise_multiplier < 0:
        raise PrivacyError(f"warmup.variations_noise_multiplier: must be >= 0, got {noise_multiplier}")
    query = moments
    if noise_multiplier > 0:
        if randomness is None:
            raise PrivacyError("central images: noise needs the mechanism's secret randomness")
        moments = moments + noise_multiplier * clip ** 2 * symmetric_noise(tuple(moments.shape), randomness=randomness)
    if observe is not None:
        observe(moments, query)
    if trace is not None:
        trace.record(full_batch_gaussian(noise_multiplier))
    cov = moments / counts.double().clamp(min=1.0).view(-1, 1, 1)
    eigenvalues, eigenvectors = torch.linalg.eigh(cov)  # ascending
    lam = eigenvalues.flip(-1)[:, :rank].clamp(min=0)
    vec = eigenvectors.flip(-1)[:, :, :rank]
    directions = (vec * lam.sqrt().unsqueeze(1)).transpose(1, 2)  # (classes or 1, rank, D), [0, 1] units
    directions = directions.expand(num_classes, -1, -1)  # shared: every class the same directions
    return (2 * directions).float().reshape(num_classes, rank, *images.shape[1:])
