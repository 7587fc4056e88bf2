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

The release (:func:`sample`) draws figures of the last round in proportion to its thresholded noisy votes and paints
them in the prior's random colours (:func:`dpsynth.prior.paint.paint`): post-processing, no further privacy.

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
    PRIVATE_EVOLUTION, calibrate, calibrating_accountants, events, rounds_epsilon, statement)
from dpsynth.privacy.events import MechanismTrace, full_batch_gaussian
from dpsynth.prior.figures import Figure, masks, random_figures, vary
from dpsynth.prior.ground import (  # noqa: F401 (figure_map's ground, re-exported)
    BORDER, TEXTURED, background_distance, ground_roughness)
from dpsynth.prior.paint import paint_figures

GRID = 16  # the feature's side
def figure_map(images: np.ndarray, *, grid: int = GRID, batch: int = 2048) -> np.ndarray:
    """The colour-blind feature of uint8 images (N × H × W × C): N × grid² float32, unit norm (see the module):
    :func:`background_distance`, pooled to grid × grid, blurred, less its mean.

    >>> x = np.zeros((2, 8, 8, 3), np.uint8); x[0, 2:6, 2:6] = (255, 0, 0); x[1, 2:6, 2:6] = (0, 0, 90)
    >>> x[1, :, :, 1] += 200                                  # another colour, on another background
    >>> f = figure_map(x, grid=4); round(float(f[0] @ f[1]), 6)  # the same square: the same feature
    1.0
    """
    import torch
    import torch.nn.functional as F

    out = np.empty((len(images), grid * grid), np.float32)
    for lo in range(0, len(images), batch):
        d = background_distance(images[lo:lo + batch])[:, None]
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


def segmenter_map(images: np.ndarray) -> np.ndarray:
    """A record's feature by the public segmenter (:mod:`dpsynth.prior.segmenter`, trained on the prior's own
    paintings only): its predicted figure mask, mapped as a candidate's mask is (:func:`mask_features`: drawn white
    on black, then :func:`figure_map`). A fixed public function of each record alone."""
    from dpsynth.prior import segmenter

    return figure_map(np.round(segmenter.predict(images) * 255).astype(np.uint8)[..., None])


def hybrid_map(images: np.ndarray) -> np.ndarray:
    """A record's feature chosen by its own ground: :func:`segmenter_map` where its border ring is textured
    (:func:`ground_roughness` above :data:`TEXTURED`, a threshold set on the prior's paintings), else
    :func:`figure_map` (the border plane). A fixed public function of each record alone: one record, one feature,
    one vote."""
    textured = ground_roughness(images) > TEXTURED
    out = np.empty((len(images), GRID * GRID), np.float32)
    out[~textured] = figure_map(images[~textured])  # each record mapped once, by its own ground's feature
    out[textured] = segmenter_map(images[textured])
    return out


FEATURES = {"plane": figure_map, "segmenter": segmenter_map, "hybrid": hybrid_map}  # a record's feature, by name


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


def released(pop: Population, threshold: float) -> Evolution:
    """The release after the last round: its figures and their thresholded noisy votes (post-processing)."""
    last, at, weights = pop.histograms[-1], 0, []
    for figs in pop.figures:
        weights.append(_weights(last[at:at + len(figs)], threshold))
        at += len(figs)
    return Evolution(figures=pop.figures, weights=weights, histograms=list(pop.histograms))


def evolve(images: np.ndarray, labels: np.ndarray, *, num_classes: int, rounds: int, candidates: int,
           noise_multiplier: float, threshold: float, randomness, trace: MechanismTrace | None,
           seed: int = 0, steps: tuple[float, float] = (0.3, 0.05), fresh: float = 0.05, observe=None,
           feature: str = "plane") -> Evolution:
    """Private Evolution on the records (``images`` uint8 N × H × W × C, H = W; ``labels`` in [0, num_classes)):
    ``rounds`` noisy histograms over ``candidates`` figures per class, each recorded in ``trace`` as
    ``full_batch_gaussian(noise_multiplier)``. ``threshold`` (votes) zeroes the bins below it; ``steps`` is the
    variation step of the first and the last round (geometric in between); a share ``fresh`` of every class's next
    candidates are new draws from the prior. ``seed`` seeds the public coins (prior, resampling, variations).
    ``observe(round, noisy, query)``, when given, sees each raw release and its noiseless query (tests and audits).
    ``feature`` names the records' feature in :data:`FEATURES` (``plane``: :func:`figure_map`; ``segmenter``:
    :func:`segmenter_map`; ``hybrid``: :func:`hybrid_map`)."""
    if rounds < 1 or candidates < 1:
        raise PrivacyError(f"private_evolution: rounds and candidates must be >= 1, got {rounds}, {candidates}")
    if feature not in FEATURES:
        raise PrivacyError(f"private_evolution.feature: one of {sorted(FEATURES)}, not {feature!r}")
    labels = np.asarray(labels)
    records = FEATURES[feature](images)
    pop = start(num_classes=num_classes, candidates=candidates, seed=seed)
    while pop.round < rounds:
        evolve_round(pop, records, labels, rounds=rounds, noise_multiplier=noise_multiplier, threshold=threshold,
                     randomness=randomness, trace=trace, size=images.shape[1], steps=steps, fresh=fresh,
                     observe=observe)
    return released(pop, threshold)


def sample(evolution: Evolution, n: int, *, size: int, channels: int, seed: int = 0,
           jitter: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """``n`` synthetic records (classes balanced): figures of the last round drawn by their weights, each varied by
    a small step ``jitter`` and painted in the prior's random colours (:func:`dpsynth.prior.paint.paint_figures`).
    Post-processing. Returns (uint8 N × size × size × channels, int64 labels)."""
    labels = np.arange(n) % len(evolution.figures)
    images = paint_figures(evolution.figures, evolution.weights, labels, size=size, channels=channels,
                           rng=np.random.default_rng(seed), jitter=jitter)
    return images, labels.astype(np.int64)
