"""Private Evolution on the public prior: the user's records vote, by Gaussian histograms, for figures of the prior.

After Lin et al., "Differentially Private Synthetic Data via Foundation Model APIs 1: Images" (ICLR 2024), with a
simulator in place of the foundation model as in Lin et al., "… APIs 3" (Sim-PE, 2025): the candidates are figures
of :mod:`dpsynth.prior.figures` (parameters a renderer draws), their variations the renderer's parameters moved.

Per class (the label set is public schema; each record votes within its own class), for ``rounds`` rounds:

1. every candidate figure of the class is drawn as a mask and mapped by :func:`figure_map`;
2. every private record is mapped by the same :func:`figure_map` and votes for its nearest candidate (largest
   cosine) of its own class: **one vote, in one bin** of the histogram stacked over every class's candidates;
3. the histogram is released by the Gaussian mechanism: N(0, σ²) on every bin (:func:`noisy_votes`). Adding or
   removing one record moves the stacked histogram by exactly one vote in one bin, so its L2 (and L1) sensitivity
   is 1 under add/remove adjacency: each round is one ``full_batch_gaussian(σ)`` event of the trace
   (:func:`events`), and the accountants compose the rounds (RDP: T·α/(2σ²));
4. post-processing of the released histogram: bins below the threshold H are zeroed, and the next round's
   candidates are drawn from the class's candidates in proportion to what is left and varied
   (:func:`dpsynth.prior.figures.vary`, a step shrinking geometrically from round to round), plus a share of
   fresh draws from the prior.

Once, before the first round, each class's **style** is released beside the votes (:func:`release_style`): every
record counts 1 in exactly one of its class's two bins, textured or flat ground (:func:`textured`: version 3's
:func:`ground_texture` against the public :data:`TEXTURE_MIDPOINT`), so this 2K-bin histogram has add/remove
sensitivity 1 too; N(0, σ_s²) on every bin, its own ``full_batch_gaussian(σ_s)`` event, the trace's first, accounted
with the rounds (:mod:`dpsynth.mechanisms.histograms` splits the budget). Its post-processing is each class's photo
share (:func:`photo_shares`): the clipped noisy share of textured records, capped at ½ (:data:`PHOTO_CAP`).

The release (:func:`sample`) draws figures of the last round in proportion to its thresholded noisy votes and paints
them in the prior's random colours (:func:`dpsynth.prior.paint.paint`), photographic with the class's released photo
share as probability: post-processing, no further privacy.

The feature ignores colour and polarity: each pixel's distance (Euclidean over the channels) from the background
colour field, a plane per channel fitted to the image's 2-pixel border; pooled to :data:`GRID` × :data:`GRID`,
blurred, less its mean, unit norm. It is public and data-independent (a fixed function each record computes alone).
A candidate's feature is the same function of its mask drawn white on black.

Only the noise uses the mechanism's secret coins (:class:`dpsynth.mechanisms.randomness.MechanismRandomness`); the
prior's draws, the resampling and the variations use a public seed, which only ever meets released values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dpsynth.errors import PrivacyError
from dpsynth.mechanisms.histograms import (  # noqa: F401 (the mechanism's privacy, re-exported for its users)
    PRIVATE_EVOLUTION, STYLE_SHARE, calibrate, calibrating_accountants, events, rounds_epsilon, sigmas, statement,
    style_sigma)
from dpsynth.privacy.events import MechanismTrace, full_batch_gaussian
from dpsynth.prior.figures import Figure, masks, random_figures, vary
from dpsynth.prior.paint import paint_figures

GRID = 16  # the feature's side
BORDER = 2  # pixels of the border ring the background plane is fitted to
# The largest photo probability a class is painted with (min(p_c, ½), docs/prior.md "min(p_c, ½)"): textured data
# keeps version 2's half-and-half mix, flat data is painted graphic.
PHOTO_CAP = 0.5
# The style release's statistic (docs/prior.md, "a released style share per class"). TEXTURE_RING: the border ring
# (pixels) whose texture is measured; TEXTURE_MIDPOINT: the ground texture above which a record counts as textured,
# the geometric mean of the medians of ground_texture over the prior's own graphic (0.038) and photographic (0.147)
# paintings of 32 × 32 figures (public draws; tests/mechanisms/test_private_evolution_style.py checks that it still
# separates them).
TEXTURE_RING = 3
TEXTURE_MIDPOINT = 0.075


def _plane_fit(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """The basis [1, x, y] over all pixels (HW × 3) and its least-squares fit on the border ring (3 × ring)."""
    yy, xx = np.mgrid[0:h, 0:w]
    basis = np.stack([np.ones(h * w), xx.ravel() / max(w - 1, 1) - 0.5, yy.ravel() / max(h - 1, 1) - 0.5], 1)
    ring = ((yy < BORDER) | (yy >= h - BORDER) | (xx < BORDER) | (xx >= w - BORDER)).ravel()
    return basis, ring


def figure_map(images: np.ndarray, *, grid: int = GRID, batch: int = 2048) -> np.ndarray:
    """The colour-blind feature of uint8 images (N × H × W × C): N × grid² float32, unit norm (see the module).

    >>> x = np.zeros((2, 8, 8, 3), np.uint8); x[0, 2:6, 2:6] = (255, 0, 0); x[1, 2:6, 2:6] = (0, 0, 90)
    >>> x[1, :, :, 1] += 200                                  # another colour, on another background
    >>> f = figure_map(x, grid=4); round(float(f[0] @ f[1]), 6)  # the same square: the same feature
    1.0
    """
    import torch
    import torch.nn.functional as F

    n, h, w, c = images.shape
    basis, ring = _plane_fit(h, w)
    fit = np.linalg.pinv(basis[ring])  # 3 × ring
    out = np.empty((n, grid * grid), np.float32)
    for lo in range(0, n, batch):
        x = images[lo:lo + batch].reshape(-1, h * w, c).astype(np.float64) / 255.0
        coef = np.einsum("kr,nrc->nkc", fit, x[:, ring])
        d = np.sqrt(((x - basis @ coef) ** 2).sum(-1)).reshape(-1, 1, h, w)
        t = F.adaptive_avg_pool2d(torch.from_numpy(d), grid)
        k = torch.tensor([1.0, 2.0, 1.0], dtype=t.dtype) / 4
        t = F.conv2d(F.pad(t, (1, 1, 1, 1), mode="replicate"), (k[:, None] * k[None, :]).view(1, 1, 3, 3))
        t = t.flatten(1)
        t = t - t.mean(1, keepdim=True)
        out[lo:lo + batch] = (t / t.norm(dim=1, keepdim=True).clamp(min=1e-8)).numpy()
    return out


def mask_features(figures: list[Figure], size: int) -> np.ndarray:
    """:func:`figure_map` of every figure's mask (size × size), drawn white on black."""
    m = masks(figures, size)
    return figure_map(np.round(m * 255).astype(np.uint8)[..., None])


def ground_texture(images: np.ndarray, *, batch: int = 2048) -> np.ndarray:
    """How textured each image's ground is (uint8 N × H × W × C → float64 N): the image smoothed by a 3 × 3 box (so
    that pixel noise does not count), its background plane fitted per channel to the :data:`TEXTURE_RING`-pixel
    border ring, and the median over that ring of each pixel's distance (Euclidean over the channels) from the
    plane. A flat or gradient ground gives ~0.02–0.07, a photo-like texture ~0.08–0.4.

    >>> x = np.full((2, 16, 16, 3), 128, np.uint8)
    >>> x[1] = np.random.default_rng(0).integers(0, 2, (1, 4, 4, 1)).repeat(4, 1).repeat(4, 2) * 200  # patches
    >>> textured(x).tolist()
    [False, True]
    """
    import torch
    import torch.nn.functional as F

    n, h, w, c = images.shape
    yy, xx = np.mgrid[0:h, 0:w]
    basis = np.stack([np.ones(h * w), xx.ravel() / max(w - 1, 1) - 0.5, yy.ravel() / max(h - 1, 1) - 0.5], 1)
    ring = ((yy < TEXTURE_RING) | (yy >= h - TEXTURE_RING) | (xx < TEXTURE_RING) | (xx >= w - TEXTURE_RING)).ravel()
    fit = np.linalg.pinv(basis[ring])
    out = np.empty(n, np.float64)
    for lo in range(0, n, batch):
        x = torch.from_numpy(images[lo:lo + batch].astype(np.float64) / 255.0).permute(0, 3, 1, 2)
        x = F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
        x = x.permute(0, 2, 3, 1).reshape(-1, h * w, c).numpy()
        coef = np.einsum("kr,nrc->nkc", fit, x[:, ring])
        d = np.sqrt(((x[:, ring] - basis[ring] @ coef) ** 2).sum(-1))
        out[lo:lo + batch] = np.median(d, 1)
    return out


def textured(images: np.ndarray) -> np.ndarray:
    """Whether each record's ground is textured (bool N): :func:`ground_texture` above :data:`TEXTURE_MIDPOINT`. A
    fixed public function of each record alone."""
    return ground_texture(images) > TEXTURE_MIDPOINT


def style_counts(is_textured: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """The style release's noiseless query: 2K bins, class c's flat records in bin 2c and its textured ones in bin
    2c + 1. Every record adds 1 to exactly one bin (add/remove sensitivity 1 in L1 and L2)."""
    labels = np.asarray(labels, np.int64)
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise PrivacyError(f"private_evolution: labels must lie in [0, {num_classes})")
    return np.bincount(2 * labels + np.asarray(is_textured, np.int64), minlength=2 * num_classes).astype(np.float64)


def photo_shares(noisy: np.ndarray) -> np.ndarray:
    """Each class's photo probability from the released 2K-bin histogram (post-processing): the noisy counts clipped
    at 0, textured / (flat + textured), capped at :data:`PHOTO_CAP` (½, version 2's mix: a class painted almost only
    photographic scored lower on textured data, docs/prior.md); ½ where both clip to 0."""
    c = np.maximum(np.asarray(noisy, np.float64).reshape(-1, 2), 0.0)
    total = c.sum(1)
    return np.minimum(np.where(total > 0, c[:, 1] / np.where(total > 0, total, 1.0), 0.5), PHOTO_CAP)


def release_style(is_textured: np.ndarray, labels: np.ndarray, *, num_classes: int, noise_multiplier: float,
                  randomness, trace: MechanismTrace | None) -> np.ndarray:
    """The style release (once, before the rounds): :func:`style_counts` by the Gaussian mechanism
    (:func:`noisy_votes`, σ = ``noise_multiplier``), one ``full_batch_gaussian(noise_multiplier)`` event in
    ``trace``; returns each class's photo share (:func:`photo_shares`, post-processing)."""
    noisy = noisy_votes(style_counts(is_textured, labels, num_classes), noise_multiplier=noise_multiplier,
                        randomness=randomness)
    if trace is not None:
        trace.record(full_batch_gaussian(noise_multiplier))
    return photo_shares(noisy)


def votes(record_features: np.ndarray, labels: np.ndarray, candidate_features: np.ndarray,
          candidate_classes: np.ndarray) -> np.ndarray:
    """The noiseless query: for every candidate, how many records of its class have it nearest (largest cosine).
    Every record adds one vote to one bin. Raises PrivacyError when a record's class has no candidate."""
    counts = np.zeros(len(candidate_features), np.float64)
    labels, candidate_classes = np.asarray(labels), np.asarray(candidate_classes)
    for c in np.unique(labels):
        idx = np.flatnonzero(candidate_classes == c)
        if len(idx) == 0:
            raise PrivacyError(f"private_evolution: class {int(c)} has no candidate")
        nearest = (record_features[labels == c] @ candidate_features[idx].T).argmax(1)
        counts += np.bincount(idx[nearest], minlength=len(counts))
    return counts


def noisy_votes(counts: np.ndarray, *, noise_multiplier: float, randomness) -> np.ndarray:
    """The Gaussian mechanism on a histogram of sensitivity 1: N(0, σ²) on every bin (σ = 0: none, not private)."""
    if noise_multiplier < 0:
        raise PrivacyError(f"private_evolution.noise_multiplier: must be >= 0, got {noise_multiplier}")
    if noise_multiplier == 0:
        return counts.astype(np.float64)
    if randomness is None:
        raise PrivacyError("private_evolution: noise needs the mechanism's secret randomness")
    import torch

    noise = randomness.standard_normal((len(counts),), dtype=torch.float64).cpu().numpy()
    return counts + noise_multiplier * noise


@dataclass
class Evolution:
    """What Private Evolution released and derived from it: the last round's figures of every class, their
    thresholded noisy votes (the weights :func:`sample` draws by), and every round's raw noisy histogram."""

    figures: list[list[Figure]]
    weights: list[np.ndarray]
    histograms: list[np.ndarray] = field(default_factory=list)
    photo: np.ndarray | None = None  # each class's released photo share (None: the prior's ½ for every class)


def _weights(noisy: np.ndarray, threshold: float) -> np.ndarray:
    w = np.where(noisy >= threshold, noisy, 0.0)
    return w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))  # nothing above H: the class unchanged


@dataclass
class Population:
    """Where Private Evolution stands between rounds: every class's candidate figures, the public coins, the rounds
    done and their released (noisy) histograms. Everything in it is public or released."""

    figures: list[list[Figure]]
    rng: np.random.Generator  # the public coins: prior draws, resampling, variations
    round: int = 0
    histograms: list[np.ndarray] = field(default_factory=list)


def start(*, num_classes: int, candidates: int, seed: int = 0) -> Population:
    """Round 0's candidates: ``candidates`` figures of the prior per class, drawn from the public ``seed``."""
    if candidates < 1:
        raise PrivacyError(f"private_evolution: candidates must be >= 1, got {candidates}")
    rng = np.random.default_rng(seed)
    return Population(figures=[random_figures(rng, candidates) for _ in range(num_classes)], rng=rng)


def evolve_round(pop: Population, records: np.ndarray, labels: np.ndarray, *, rounds: int, noise_multiplier: float,
                 threshold: float, randomness, trace: MechanismTrace | None, size: int,
                 steps: tuple[float, float] = (0.3, 0.05), fresh: float = 0.05, observe=None) -> None:
    """One round on the records' features (``records``: :func:`figure_map` of the images, ``labels``): the noisy
    histogram of their votes (one ``full_batch_gaussian(noise_multiplier)`` event in ``trace``), then, unless it is
    the last of ``rounds``, the next candidates drawn by the thresholded votes and varied (post-processing)."""
    classes = np.repeat(np.arange(len(pop.figures)), [len(f) for f in pop.figures])
    flat = [f for figs in pop.figures for f in figs]
    query = votes(records, labels, mask_features(flat, size), classes)
    noisy = noisy_votes(query, noise_multiplier=noise_multiplier, randomness=randomness)
    if trace is not None:
        trace.record(full_batch_gaussian(noise_multiplier))
    t = pop.round
    if observe is not None:
        observe(t, noisy, query)
    pop.histograms.append(noisy)
    pop.round += 1
    if pop.round >= rounds:
        return
    step = steps[0] * (steps[1] / steps[0]) ** ((t + 1) / max(rounds - 1, 1))
    rng, nxt, at = pop.rng, [], 0
    for figs in pop.figures:
        m = len(figs)
        n_fresh = int(round(fresh * m))
        w = _weights(noisy[at:at + m], threshold)
        parents = rng.choice(m, m - n_fresh, p=w)
        nxt.append([vary(figs[i], step, rng) for i in parents] + random_figures(rng, n_fresh))
        at += m
    pop.figures = nxt


def released(pop: Population, threshold: float, photo: np.ndarray | None = None) -> Evolution:
    """The release after the last round: its figures and their thresholded noisy votes (post-processing), and the
    classes' released photo shares ``photo``."""
    last, at, weights = pop.histograms[-1], 0, []
    for figs in pop.figures:
        weights.append(_weights(last[at:at + len(figs)], threshold))
        at += len(figs)
    return Evolution(figures=pop.figures, weights=weights, histograms=list(pop.histograms), photo=photo)


def evolve(images: np.ndarray, labels: np.ndarray, *, num_classes: int, rounds: int, candidates: int,
           noise_multiplier: float, threshold: float, randomness, trace: MechanismTrace | None,
           style_noise_multiplier: float | None = None, seed: int = 0, steps: tuple[float, float] = (0.3, 0.05),
           fresh: float = 0.05, observe=None) -> Evolution:
    """Private Evolution on the records (``images`` uint8 N × H × W × C, H = W; ``labels`` in [0, num_classes)):
    first the style release (:func:`release_style`, σ_s = ``style_noise_multiplier``; None: none, every class
    painted with the prior's ½ as version 2 painted), then
    ``rounds`` noisy histograms over ``candidates`` figures per class, each recorded in ``trace`` as
    ``full_batch_gaussian(noise_multiplier)``. ``threshold`` (votes) zeroes the bins below it; ``steps`` is the
    variation step of the first and the last round (geometric in between); a share ``fresh`` of every class's next
    candidates are new draws from the prior. ``seed`` seeds the public coins (prior, resampling, variations).
    ``observe(round, noisy, query)``, when given, sees each raw release and its noiseless query (tests and audits)."""
    if rounds < 1 or candidates < 1:
        raise PrivacyError(f"private_evolution: rounds and candidates must be >= 1, got {rounds}, {candidates}")
    labels = np.asarray(labels)
    photo = None
    if style_noise_multiplier is not None:
        photo = release_style(textured(images), labels, num_classes=num_classes,
                              noise_multiplier=style_noise_multiplier, randomness=randomness, trace=trace)
    records = figure_map(images)
    pop = start(num_classes=num_classes, candidates=candidates, seed=seed)
    while pop.round < rounds:
        evolve_round(pop, records, labels, rounds=rounds, noise_multiplier=noise_multiplier, threshold=threshold,
                     randomness=randomness, trace=trace, size=images.shape[1], steps=steps, fresh=fresh,
                     observe=observe)
    return released(pop, threshold, photo)


def sample(evolution: Evolution, n: int, *, size: int, channels: int, seed: int = 0,
           jitter: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """``n`` synthetic records (classes balanced): figures of the last round drawn by their weights, each varied by
    a small step ``jitter`` and painted in the prior's random colours (:func:`dpsynth.prior.paint.paint_figures`),
    photographic with its class's released photo share as probability. Post-processing. Returns (uint8 N × size × size × channels, int64 labels)."""
    labels = np.arange(n) % len(evolution.figures)
    images = paint_figures(evolution.figures, evolution.weights, labels, size=size, channels=channels,
                           rng=np.random.default_rng(seed), jitter=jitter, photo=evolution.photo)
    return images, labels.astype(np.int64)
