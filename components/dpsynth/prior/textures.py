"""Photo-like textures made by code: the backgrounds and figure fills of the prior's photographic paintings.

Three procedural families that share the statistics of natural images without drawing any photograph:

* :func:`dead_leaves`: occluding discs and rectangles whose sizes follow the scale-invariant law p(r) ∝ r⁻³ of
  natural images (Lee, Mumford & Huang 2001), in colours drawn around a small palette — the classic image prior of
  Baradad et al., "Learning to See by Looking at Noise" (NeurIPS 2021);
* :func:`pink_noise`: Gaussian noise with a 1/f^β amplitude spectrum (β in [1.5, 2.5]), one luminance field and two
  weaker chroma fields, around a random mean colour;
* :func:`mosaic`: a Voronoi mosaic of a few to a few dozen cells, each a colour of a palette, softened.

:func:`photo_texture` draws one of them. Every function is of a publicly seeded numpy ``Generator`` and a size: no
record is an argument. Each returns float64 size × size × 3 in [0, 1].

>>> rng = np.random.default_rng(0)
>>> [f(rng, 16).shape for f in (dead_leaves, pink_noise, mosaic, photo_texture)]
[(16, 16, 3), (16, 16, 3), (16, 16, 3), (16, 16, 3)]
>>> t = photo_texture(np.random.default_rng(1), 32); bool(t.min() >= 0 and t.max() <= 1)
True
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

FAMILIES = ("dead_leaves", "pink_noise", "mosaic")
FAMILY_WEIGHTS = (0.45, 0.3, 0.25)


def _palette(rng: np.random.Generator, n: int) -> np.ndarray:
    """n colours around a random hue family: a base colour, each member moved by N(0, 0.25) and some greyed
    (photographs' colours are muted and correlated)."""
    base = rng.random(3)
    pal = np.clip(base + rng.normal(0, 0.25, (n, 3)), 0, 1)
    grey = rng.uniform(0, 0.7, (n, 1))
    return pal * (1 - grey) + pal.mean(1, keepdims=True) * grey


def dead_leaves(rng: np.random.Generator, size: int, *, leaves: int | None = None) -> np.ndarray:
    """A dead-leaves image: ``leaves`` (default 15–80) discs and rectangles, radii r ∝ r⁻³ between a
    16th of the canvas and the canvas, each a palette colour jittered in brightness, later ones occluding earlier ones; drawn at 2× and
    averaged down."""
    big = 2 * size
    pal = _palette(rng, int(rng.integers(2, 7)))
    n = int(leaves if leaves is not None else rng.integers(15, 81))
    lo, hi = big / 16, float(big)
    r = (lo ** -2 - rng.random(n) * (lo ** -2 - hi ** -2)) ** -0.5  # inverse CDF of p(r) ∝ r^-3 on [lo, hi]
    r = np.sort(r)[::-1]  # the large leaves first, so that small ones stay visible on top
    colours = np.clip(pal[rng.integers(len(pal), size=n)] * rng.uniform(0.6, 1.25, (n, 1))
                      + rng.normal(0, 0.04, (n, 3)), 0, 1)
    canvas = Image.new("RGB", (big, big), tuple(int(v) for v in (pal[0] * 255)))
    d = ImageDraw.Draw(canvas)
    xy = rng.uniform(-0.1, 1.1, (n, 2)) * big
    aspect = rng.uniform(0.4, 1.0, n)
    rect = rng.random(n) < 0.35
    for i in range(n):
        x, y, rx = xy[i, 0], xy[i, 1], r[i]
        ry = rx * aspect[i]
        box = [x - rx, y - ry, x + rx, y + ry]
        fill = tuple(int(v) for v in colours[i] * 255 + 0.5)
        d.rectangle(box, fill=fill) if rect[i] else d.ellipse(box, fill=fill)
    return np.asarray(canvas.resize((size, size), Image.BOX), dtype=np.float64) / 255.0


def pink_noise(rng: np.random.Generator, size: int) -> np.ndarray:
    """Coloured 1/f^β noise (β uniform in [1.5, 2.5]): a luminance field and two chroma fields a third to two thirds
    as strong, each unit-variance Gaussian noise filtered in Fourier space, around a random mean colour; contrast
    (the luminance field's standard deviation) uniform in [0.06, 0.25]."""
    beta = rng.uniform(1.5, 2.5)
    fy, fx = np.meshgrid(np.fft.fftfreq(size), np.fft.fftfreq(size), indexing="ij")
    amp = np.hypot(fx, fy)
    amp[0, 0] = np.inf
    amp = amp ** -beta
    fields = np.fft.ifft2(np.fft.fft2(rng.normal(0, 1, (3, size, size))) * amp).real
    fields /= fields.reshape(3, -1).std(1)[:, None, None] + 1e-12
    chroma = np.array([[1, 1, 1], [1, 0, -1], [0.5, -1, 0.5]]) / np.sqrt([3, 2, 1.5])[:, None]
    weights = np.array([1.0, *rng.uniform(0.33, 0.67, 2)])
    img = np.einsum("k,khw,kc->hwc", weights, fields, chroma) * rng.uniform(0.06, 0.25)
    return np.clip(rng.uniform(0.15, 0.85, 3) + img, 0, 1)


def mosaic(rng: np.random.Generator, size: int) -> np.ndarray:
    """A Voronoi mosaic: 3–40 random cells, each a palette colour with its own brightness, softened by a Gaussian
    blur of 0–1 pixel."""
    k = int(rng.integers(3, 41))
    seeds = rng.random((k, 2)) * size
    yy, xx = np.mgrid[0:size, 0:size] + 0.5
    owner = ((xx[..., None] - seeds[:, 0]) ** 2 + (yy[..., None] - seeds[:, 1]) ** 2).argmin(-1)
    pal = _palette(rng, int(rng.integers(2, 6)))
    colours = np.clip(pal[rng.integers(len(pal), size=k)] * rng.uniform(0.6, 1.25, (k, 1)), 0, 1)
    img = Image.fromarray((colours[owner] * 255 + 0.5).astype(np.uint8))
    img = img.filter(ImageFilter.GaussianBlur(rng.uniform(0, 1)))
    return np.asarray(img, dtype=np.float64) / 255.0


def photo_texture(rng: np.random.Generator, size: int) -> np.ndarray:
    """One texture of a family drawn by :data:`FAMILY_WEIGHTS`."""
    family = FAMILIES[rng.choice(len(FAMILIES), p=FAMILY_WEIGHTS)]
    return {"dead_leaves": dead_leaves, "pink_noise": pink_noise, "mosaic": mosaic}[family](rng, size)
