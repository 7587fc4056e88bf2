"""An image's ground: the background colour field fitted to its border, and each pixel's distance from it.

A fixed public function of one image alone; Private Evolution's colour-blind feature
(:func:`dpsynth.mechanisms.private_evolution.figure_map`) and the public segmenter's input
(:mod:`dpsynth.prior.segmenter`) are built on it.
"""

from __future__ import annotations

import numpy as np

BORDER = 2  # pixels of the border ring the background plane is fitted to
TEXTURED = 0.114  # ground_roughness above which a ground is textured (set on the prior's paintings, docs/prior.md)


def _plane_fit(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """The basis [1, x, y] over all pixels (HW × 3) and the border ring's pixels (a boolean of HW)."""
    yy, xx = np.mgrid[0:h, 0:w]
    basis = np.stack([np.ones(h * w), xx.ravel() / max(w - 1, 1) - 0.5, yy.ravel() / max(h - 1, 1) - 0.5], 1)
    ring = ((yy < BORDER) | (yy >= h - BORDER) | (xx < BORDER) | (xx >= w - BORDER)).ravel()
    return basis, ring


def background_distance(images: np.ndarray) -> np.ndarray:
    """Each pixel's Euclidean distance over the channels, in [0, 1] units, from its record's background colour field
    (a plane per channel, least squares on the record's border ring): uint8 N × H × W × C → float64 N × H × W. A
    function of each record alone.

    >>> x = np.full((1, 6, 6, 3), 40, np.uint8); x[0, 2:4, 2:4] = (40, 40, 244)
    >>> d = background_distance(x); round(float(d[0, 2, 2]), 3), round(float(d[0, 0, 0]), 3)
    (0.8, 0.0)
    """
    n, h, w, c = images.shape
    basis, ring = _plane_fit(h, w)
    fit = np.linalg.pinv(basis[ring])  # 3 × ring
    x = images.reshape(n, h * w, c).astype(np.float64) / 255.0
    coef = np.einsum("kr,nrc->nkc", fit, x[:, ring])
    return np.sqrt(((x - basis @ coef) ** 2).sum(-1)).reshape(n, h, w)


def ground_roughness(images: np.ndarray) -> np.ndarray:
    """How far a record's border ring lies from its own fitted colour plane: the root mean square, over the ring's
    pixels, of :func:`background_distance` (float64 N). Flat grounds (a gradient) give little, textured ones much;
    above :data:`TEXTURED` a ground counts as textured. A function of each record alone.

    >>> x = np.full((2, 8, 8, 3), 90, np.uint8); x[1, ::2, ::2] = 200      # a flat and a speckled ground
    >>> r = ground_roughness(x); bool(r[0] < TEXTURED < r[1])
    True
    """
    n, h, w, _ = images.shape
    _, ring = _plane_fit(h, w)
    d = background_distance(images).reshape(n, h * w)[:, ring]
    return np.sqrt((d ** 2).mean(1))
