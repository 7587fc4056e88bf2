"""Painting the prior's masks into images of the user's public schema: random colours on random backgrounds.

Two styles, each image drawing one (a share :data:`PHOTO_SHARE` photographic):

* **graphic**: a gradient between two random colours with smooth blotches and pixel noise as background; the
  figure a random colour at least ``min_contrast`` (Euclidean, RGB on [0, 1]) from the background's mean colour,
  flat, striped, checked, mottled or shaded;
* **photographic** (prior version 2): a photo-like texture made by code (:func:`dpsynth.prior.textures.photo_texture`:
  dead leaves, 1/f noise or a Voronoi mosaic) as background, the figure filled with another such texture or a
  graphic fill, its luminance pushed away from the background's luminance under the figure (darkened on a light
  ground, lightened on a dark one), so that it contrasts locally whatever the texture.

Grey schemas (one channel) get the luminance of the same painting. All of it is a function of the masks and a
publicly seeded numpy ``Generator``.

>>> from dpsynth.prior.figures import masks, random_figures
>>> rng = np.random.default_rng(0)
>>> x = paint(masks(random_figures(rng, 4), 8), rng, channels=3)
>>> x.shape, x.dtype
((4, 8, 8, 3), dtype('uint8'))
>>> paint(masks(random_figures(rng, 2), 8), rng, channels=1).shape
(2, 8, 8, 1)
"""

from __future__ import annotations

import math

import numpy as np

from dpsynth.prior.figures import Figure, masks, vary
from dpsynth.prior.textures import photo_texture

LUMA = np.array([0.299, 0.587, 0.114])
PHOTO_SHARE = 0.5  # the share of paintings in the photographic style (docs/prior.md, prior version 2)


def _smooth_noise(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """Smooth noise in [0, 1]: a cells × cells uniform grid, bilinearly upsampled to size × size."""
    grid = rng.random((cells + 1, cells + 1))
    t = np.linspace(0, cells, size)
    i = np.minimum(t.astype(int), cells - 1)
    f = t - i
    rows = grid[i] * (1 - f)[:, None] + grid[i + 1] * f[:, None]
    return rows[:, i] * (1 - f)[None, :] + rows[:, i + 1] * f[None, :]


def _texture(rng: np.random.Generator, size: int) -> np.ndarray:
    """A fill texture in [0.5, 1], size × size: flat, stripes, checks, mottled or a shade across."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    kind = rng.choice(5, p=[0.4, 0.15, 0.1, 0.15, 0.2])
    if kind == 0:
        return np.ones((size, size))
    if kind == 1:
        a, f = rng.uniform(0, math.pi), rng.uniform(0.4, 1.3) * 32 / size
        return 0.6 + 0.4 * (np.sin(f * (xx * math.cos(a) + yy * math.sin(a))) > 0)
    if kind == 2:
        p = max(2, int(rng.integers(2, 6) * size / 32))
        return 0.6 + 0.4 * (((xx // p) + (yy // p)) % 2)
    if kind == 3:
        return 0.5 + 0.5 * _smooth_noise(rng, size, max(2, size // 4))
    a = rng.uniform(0, 2 * math.pi)
    t = 0.5 + ((xx / (size - 1) - 0.5) * math.cos(a) + (yy / (size - 1) - 0.5) * math.sin(a))
    return 0.5 + 0.5 * np.clip(t, 0, 1)


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    c0 = rng.random(3)
    c1 = np.clip(c0 + rng.normal(0, 0.35, 3), 0, 1) if rng.random() < 0.5 else rng.random(3)
    a = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:size, 0:size] / max(size - 1, 1)
    t = np.clip(0.5 + (xx - 0.5) * math.cos(a) + (yy - 0.5) * math.sin(a), 0, 1)[..., None]
    bg = c0 * (1 - t) + c1 * t
    blotch = _smooth_noise(rng, size, max(2, size // 8))[..., None] - 0.5
    bg = bg + rng.uniform(0, 0.25) * blotch + rng.normal(0, rng.uniform(0, 0.05), (size, size, 3))
    return np.clip(bg, 0, 1)


def _figure_colour(rng: np.random.Generator, bg: np.ndarray, min_contrast: float) -> np.ndarray:
    mean = bg.reshape(-1, 3).mean(0)
    for _ in range(50):
        c = rng.random(3)
        if np.linalg.norm(c - mean) >= min_contrast:
            return c
    return 1 - mean


def photographic(mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``mask`` (H × W in [0, 1], H = W) painted in the photographic style: float64 H × W × 3 in [0, 1]. The
    figure's fill (another photo-like texture, or a random graphic fill) is scaled towards black on a ground
    lighter than mid-grey under the figure, towards white on a darker one, by a factor uniform in [0.15, 0.6]."""
    size = mask.shape[-1]
    m = mask[..., None].astype(np.float64)
    bg = photo_texture(rng, size)
    fg = photo_texture(rng, size) if rng.random() < 0.5 else rng.random(3) * _texture(rng, size)[..., None]
    under = float((bg @ LUMA * mask).sum() / mask.sum()) if mask.sum() > 0 else float((bg @ LUMA).mean())
    keep = rng.uniform(0.15, 0.6)
    fg = fg * keep if under > 0.5 else 1 - (1 - fg) * keep
    return bg * (1 - m) + fg * m


def paint(masks: np.ndarray, rng: np.random.Generator, *, channels: int, min_contrast: float = 0.4,
          photo: float = PHOTO_SHARE) -> np.ndarray:
    """Every mask (N × H × W in [0, 1], H = W) painted, with probability ``photo`` in the photographic style
    (:func:`photographic`), else in a random figure colour and texture on a random gradient background: uint8
    N × H × W × ``channels`` (1: the luminance, 3: RGB)."""
    if channels not in (1, 3):
        raise ValueError(f"channels: the prior paints 1 or 3 channels, not {channels}")
    n, size = len(masks), masks.shape[-1]
    out = np.empty((n, size, size, channels), np.uint8)
    for i in range(n):
        if rng.random() < photo:
            img = photographic(masks[i], rng)
        else:
            m = masks[i][..., None].astype(np.float64)
            bg = _background(rng, size)
            fg = _figure_colour(rng, bg, min_contrast) * _texture(rng, size)[..., None]
            img = bg * (1 - m) + fg * m
        if channels == 1:
            img = (img @ LUMA)[..., None]
        out[i] = np.clip(img * 255 + 0.5, 0, 255).astype(np.uint8)
    return out


def paint_figures(figures: list[list[Figure]], weights: list[np.ndarray], labels: np.ndarray, *, size: int,
                  channels: int, rng: np.random.Generator, jitter: float) -> np.ndarray:
    """One image per label (uint8 N × size × size × channels): a figure of the label's class drawn by its weight,
    varied by a step ``jitter``, painted in the prior's random colours (post-processing, ``rng`` public)."""
    figs = []
    for y in labels:
        pop = figures[int(y)]
        figs.append(vary(pop[rng.choice(len(pop), p=weights[int(y)])], jitter, rng))
    return paint(masks(figs, size), rng, channels=channels)
