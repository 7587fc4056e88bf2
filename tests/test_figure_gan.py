"""The figure map of benchmarks/figure_gan.py (#51): a function of each record alone (so the grey recipe's ε holds for
the colour records), blind to the figure's colour and polarity, a bright figure on a dark ground."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from figure_gan import figure_maps  # noqa: E402


def _records(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.empty((n, 32, 32, 3), np.uint8)
    for i in range(n):
        ground, figure = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
        x[i] = np.clip(ground + rng.normal(0, 4, (32, 32, 3)), 0, 255)
        r, c = rng.integers(6, 14, 2)
        x[i, r:r + 12, c:c + 6] = figure
    return x


def test_each_records_map_depends_on_that_record_alone():
    x = _records(12, 0)
    together = figure_maps(x)
    alone = np.concatenate([figure_maps(x[i:i + 1]) for i in range(len(x))])
    assert together.shape == (12, 32, 32, 1) and together.dtype == np.uint8
    assert (together == alone).all()
    neighbour = figure_maps(np.concatenate([x[:5], x[6:]]))  # a record removed: the others' maps are unchanged
    assert (neighbour == np.concatenate([together[:5], together[6:]])).all()


def test_the_map_ignores_colour_and_polarity_and_shows_the_figure_bright():
    x = np.full((3, 32, 32, 3), (20, 180, 60), np.uint8)
    x[:, 8:24, 12:18] = (240, 10, 200)
    x[1] = 255 - x[1]                       # the negative
    x[2] = x[2][..., ::-1]                  # other colours
    m = figure_maps(x)[..., 0].astype(int)
    assert np.abs(m[0] - m[1]).max() <= 1 and np.abs(m[0] - m[2]).max() <= 1
    assert m[0, 8:24, 12:18].min() == 255 and m[0, :8].max() == 0
