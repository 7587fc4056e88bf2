"""Private Evolution chooses the painting style with the shape (#51, prior version 3): each candidate carries its
style, the vote's feature sees how textured a record's ground is, and the same one vote per record picks both, so a
set of flat-ground records is released in the graphic style and a textured one in the photographic style (whose
figures are painted on a photo-like texture half of the time, paint.TEXTURED_SHARE)."""

import numpy as np
import pytest
import torch

from dpsynth.mechanisms import private_evolution as pe
from dpsynth.prior.figures import masks, random_figures
import dpsynth.prior.paint as paint_module
from dpsynth.prior.paint import GRAPHIC, PHOTO, TEXTURED_SHARE, paint
from dpsynth.prior.release import FigurePainter


def _painted(style: int, n: int, size: int = 32, seed: int = 0):
    """``n`` random figures of the prior painted in one style, the photographic one always on a texture (a public
    stand-in for records of flat or of textured grounds), labels 0/1."""
    rng = np.random.default_rng(seed)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(paint_module, "TEXTURED_SHARE", 1.0)
        images = paint(masks(random_figures(rng, n), size), rng, channels=3, styles=np.full(n, style))
    return images, np.arange(n) % 2


def test_the_midpoint_separates_the_priors_own_styles():
    """TEXTURE_MIDPOINT (a constant) still lies between the prior's two styles: most graphic paintings fall below
    it, most photographic ones above."""
    graphic, photo = (pe.ground_texture(_painted(s, 120, seed=3)[0]) for s in (GRAPHIC, PHOTO))
    assert np.median(graphic) < pe.TEXTURE_MIDPOINT < np.median(photo)
    assert (graphic < pe.TEXTURE_MIDPOINT).mean() > 0.85 and (photo > pe.TEXTURE_MIDPOINT).mean() > 0.85


@pytest.mark.parametrize("style", [GRAPHIC, PHOTO])
def test_the_records_choose_the_style_of_the_release(style):
    """Noiseless (σ = 0) on records all of one style: the release's weight is of that style, and its samples are
    flat-ground when the records are (prior version 2 painted half of every release on textures, whatever the
    records), a mixture with TEXTURED_SHARE on textures when they are textured."""
    x, y = _painted(style, 40)
    evo = pe.evolve(x, y, num_classes=2, rounds=3, candidates=20, noise_multiplier=0.0, threshold=0.5,
                    randomness=None, trace=None, seed=1)
    share = sum(float(w[s == style].sum()) for w, s in zip(evo.weights, evo.styles)) / 2
    assert share > 0.8
    images, _ = pe.sample(evo, 80, size=32, channels=3, seed=2)
    photo_like = (pe.photo_likeness(images) > 0.5).mean()
    assert abs(photo_like - TEXTURED_SHARE) < 0.2 if style == PHOTO else photo_like < 0.15


def test_one_record_still_moves_the_histogram_by_one_vote_in_one_bin():
    """The style part changes which bin a record picks, not how many: removing any record (of either style) changes
    the noiseless query by exactly 1 in L2 and L1, in a bin of its own class."""
    a, _ = _painted(GRAPHIC, 8, size=16, seed=4)
    b, _ = _painted(PHOTO, 8, size=16, seed=5)
    x, y = np.concatenate([a, b]), np.arange(16) % 2
    rng = np.random.default_rng(6)
    classes = np.repeat([0, 1], 6)
    cf = pe.candidate_map(random_figures(rng, 12), np.tile([GRAPHIC, PHOTO], 6), 16)
    rf = pe.record_map(x)
    assert np.allclose(np.linalg.norm(rf, axis=1), 1, atol=1e-5) and np.allclose(np.linalg.norm(cf, axis=1), 1,
                                                                                   atol=1e-5)
    full = pe.votes(rf, y, cf, classes)
    assert full.sum() == len(x)
    for i in range(len(x)):
        keep = np.arange(len(x)) != i
        diff = full - pe.votes(rf[keep], y[keep], cf, classes)
        assert np.abs(diff).sum() == 1 and np.linalg.norm(diff) == 1
        assert classes[np.flatnonzero(diff)[0]] == y[i]


def test_the_released_painter_paints_each_figure_in_its_style():
    rng = np.random.default_rng(7)
    figures = [random_figures(rng, 4), random_figures(rng, 4)]
    styles = [np.full(4, GRAPHIC), np.full(4, PHOTO)]
    p = FigurePainter.from_figures(figures, [np.full(4, 0.25)] * 2, styles, image_size=32, channels=3)
    q = FigurePainter(**{k: v for k, v in p.describe().items() if k != "class"})
    q.load_state_dict(p.state_dict())
    assert [s.tolist() for s in q.styles()] == [[0] * 4, [1] * 4]
    x, y = q.sample(120, generator=torch.Generator().manual_seed(0))
    images = ((x.permute(0, 2, 3, 1).numpy() + 1) * 127.5).round().astype(np.uint8)
    photo_like = pe.photo_likeness(images) > 0.5
    assert photo_like[y.numpy() == 0].mean() < 0.15 and abs(photo_like[y.numpy() == 1].mean() - TEXTURED_SHARE) < 0.2
    state = p.state_dict()
    state["styles_flat"] = state["styles_flat"][:-1]
    with pytest.raises(RuntimeError, match="styles"):
        q.load_state_dict(state)
