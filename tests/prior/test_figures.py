"""The public prior (dpsynth.prior): deterministic from its seed, never drawing the confirmation sets' glyphs."""

import inspect

import numpy as np
import pytest

import dpsynth.prior.figures as figures
import dpsynth.prior.paint as paint_module
import dpsynth.prior.textures as textures
from dpsynth.prior import STATEMENT, VERSION
from dpsynth.prior.figures import EXCLUDED, GLYPHS, MAX_PARTS, excluded, masks, random_figures, vary
from dpsynth.prior.paint import paint, photographic

SYMBOLS_RGB = "♠♣♥♦★☂♪✈☎⚓☯☀"  # benchmarks/datasets.py's confirmation sets
GREEK = "αβγδεζηθλπ"


def test_the_prior_never_draws_a_glyph_of_the_confirmation_sets():
    assert all(excluded(c) for c in SYMBOLS_RGB + GREEK)
    assert not any(excluded(c) for c in GLYPHS)
    assert all(ord(c) < 128 for c in GLYPHS)
    rng = np.random.default_rng(1)
    drawn = {p.glyph for f in random_figures(rng, 2000) for f2 in [vary(f, 0.5, rng)] for p in (*f, *f2)
             if p.kind == "glyph"}
    assert drawn and drawn <= set(GLYPHS)


def test_drawing_and_painting_are_deterministic_in_the_public_seed():
    def draw(seed):
        rng = np.random.default_rng(seed)
        f = random_figures(rng, 20)
        return masks(f, 16), paint(masks(f, 16), rng, channels=3)

    (m1, p1), (m2, p2), (m3, _) = draw(5), draw(5), draw(6)
    assert m1.tobytes() == m2.tobytes() and p1.tobytes() == p2.tobytes()
    assert m1.tobytes() != m3.tobytes()
    assert m1.min() >= 0 and m1.max() <= 1
    assert (m1.reshape(20, -1).max(1) > 0.5).mean() > 0.8  # nearly every figure leaves ink


def test_the_prior_reads_no_record():
    """Nothing in the prior takes data: its functions' arguments are figures, sizes, steps and a numpy Generator;
    the release's painter (prior/release.py) takes the released figures, their weights (released noisy votes), the
    labels to draw (public: the label set) and its encoded state."""
    from dpsynth.prior import release

    allowed = {"rng", "n", "kind", "figure", "figures", "size", "step", "part", "masks", "channels", "min_contrast",
               "char", "canvas", "cells", "bg", "index", "px", "cx", "cy", "rx", "ry", "theta",
               "weights", "labels", "jitter", "parts", "params", "sizes", "photo", "mask", "leaves"}
    for module in (figures, paint_module, textures, release):
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ == module.__name__:
                assert set(inspect.signature(fn).parameters) <= allowed | {"n"}, name


def test_a_variation_of_step_zero_is_the_figure_and_parts_stay_bounded():
    rng = np.random.default_rng(2)
    figs = random_figures(rng, 50)
    assert [vary(f, 0.0, rng) for f in figs] == figs
    for f in figs:
        for _ in range(20):
            f = vary(f, 1.0, rng)
            assert 1 <= len(f) <= MAX_PARTS


def test_paint_gives_the_schema_and_keeps_the_figure_apart_from_its_background():
    rng = np.random.default_rng(3)
    full = np.zeros((30, 8, 8), np.float32)
    full[:, 2:6, 2:6] = 1.0
    x = paint(full, rng, channels=3).astype(float) / 255
    assert x.shape == (30, 8, 8, 3)
    inside, outside = x[:, 3:5, 3:5].reshape(30, -1, 3).mean(1), x[:, 0, :].reshape(30, -1, 3).mean(1)
    assert np.linalg.norm(inside - outside, axis=1).mean() > 0.2
    assert paint(full, rng, channels=1).shape == (30, 8, 8, 1)
    with pytest.raises(ValueError, match="channels"):
        paint(full, rng, channels=2)


def test_photo_textures_are_deterministic_bounded_and_varied():
    for fn in (textures.dead_leaves, textures.pink_noise, textures.mosaic, textures.photo_texture):
        a, b = fn(np.random.default_rng(7), 32), fn(np.random.default_rng(7), 32)
        assert a.shape == (32, 32, 3) and a.tobytes() == b.tobytes() and 0 <= a.min() and a.max() <= 1
        stds = [fn(np.random.default_rng(s), 32).std(axis=(0, 1)).max() for s in range(20)]
        assert np.median(stds) > 0.03, fn.__name__  # a texture, not a flat colour


def test_dead_leaves_sizes_follow_the_scale_invariant_law():
    """With one leaf on a known ground, the leaf's area is r·r·aspect (in 2× pixels): the share of large leaves
    falls as the r⁻³ law says (P(r > 2·lo) = 1/4 of P(r > lo) = 1, up to the canvas's cut-off)."""
    areas = []
    for s in range(400):
        img = textures.dead_leaves(np.random.default_rng(s), 32, leaves=1)
        areas.append((np.abs(img - img[0, 0]).sum(-1) > 1e-6).mean())
    big = np.mean(np.array(areas) > 0.05)
    assert 0.05 < big < 0.6


def test_the_photographic_style_contrasts_the_figure_locally():
    """The figure's luminance is pushed away from the ground's under it: darker on light ground, lighter on dark."""
    luma = np.array([0.299, 0.587, 0.114])
    mask = np.zeros((32, 32), np.float32)
    mask[8:24, 8:24] = 1.0
    gaps = []
    for s in range(40):
        img = photographic(mask, np.random.default_rng(s)) @ luma
        gaps.append(abs(img[10:22, 10:22].mean() - img[mask == 0].mean()))
    assert np.median(gaps) > 0.2
    shares = [(paint(mask[None], np.random.default_rng(s), channels=3, photo=p).std() > 0) for s in range(3)
              for p in (0.0, 1.0)]
    assert all(shares)


def test_the_statement_names_what_the_prior_is():
    text = STATEMENT.format(version=VERSION)
    assert "reads no record" in text and "DejaVu" in text and "never Greek" in text
    assert "dead leaves" in text and "no photograph" in text and VERSION == "2"
    assert EXCLUDED  # the blocks the statement promises


def test_doctests():
    import doctest

    from dpsynth.prior import ground, segmenter

    for module in (figures, paint_module, textures, ground, segmenter):
        assert doctest.testmod(module).failed == 0
