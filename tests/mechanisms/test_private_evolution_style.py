"""Private Evolution's style release (#51, docs/prior.md "a released style share per class"): each class's counts of
flat- and textured-ground records, released once beside version 2's votes by its own Gaussian (its own event, with
the rounds in one account), so that a set of flat-ground records is painted graphic and a textured one photographic
(version 2 painted half of every class photographic, whatever the records)."""

import math

import numpy as np
import pytest
import torch

from dpsynth.config import load_config
from dpsynth.mechanisms import histograms, private_evolution as pe
from dpsynth.mechanisms.randomness import MechanismRandomness
from dpsynth.privacy import MechanismTrace, full_batch_gaussian, get_accountant
from dpsynth.prior.figures import masks, random_figures
from dpsynth.prior.paint import paint
from dpsynth.prior.release import FigurePainter
from tests.torch_threads import one_torch_thread  # noqa: F401 (autouse fixture)


def _painted(photo: float, n: int, size: int = 32, seed: int = 0):
    """``n`` random figures of the prior painted graphic (photo 0) or photographic (photo 1), a public stand-in for
    records; labels 0/1."""
    rng = np.random.default_rng(seed)
    return paint(masks(random_figures(rng, n), size), rng, channels=3, photo=photo), np.arange(n) % 2


def test_the_midpoint_separates_the_priors_own_styles():
    """TEXTURE_MIDPOINT (a constant) still lies between the prior's two styles: most graphic paintings fall below
    it, most photographic ones above."""
    graphic, photo = (pe.ground_texture(_painted(s, 120, seed=3)[0]) for s in (0.0, 1.0))
    assert np.median(graphic) < pe.TEXTURE_MIDPOINT < np.median(photo)
    assert (graphic < pe.TEXTURE_MIDPOINT).mean() > 0.85 and (photo > pe.TEXTURE_MIDPOINT).mean() > 0.85


def _released_share(photo: float) -> tuple[np.ndarray, float, float]:
    """Noiseless (σ = σ_s = 0) on 40 records of one style: the released shares, and the share of textured grounds
    among 200 samples of the painter a generator file holds and of :func:`pe.sample`."""
    x, y = _painted(photo, 40, size=16)
    evo = pe.evolve(x, y, num_classes=2, rounds=2, candidates=10, noise_multiplier=0.0, threshold=0.5,
                    randomness=None, trace=None, style_noise_multiplier=0.0, seed=1)
    ground = pe.textured(x)
    # noiseless: the records' own shares, capped at ½ (PHOTO_CAP)
    assert evo.photo.tolist() == [min(ground[y == c].mean(), 0.5) for c in (0, 1)]
    painter = FigurePainter.from_figures(evo.figures, evo.weights, image_size=16, channels=3, photo=evo.photo)
    images, _ = painter.sample(200, generator=torch.Generator().manual_seed(0))
    images = ((images.permute(0, 2, 3, 1).numpy() + 1) * 127.5).round().astype(np.uint8)
    sampled, _ = pe.sample(evo, 200, size=16, channels=3, seed=2)
    return evo.photo, float(pe.textured(images).mean()), float(pe.textured(sampled).mean())


def test_flat_records_get_a_graphic_release_and_textured_ones_version_2s_half_and_half():
    """Flat-ground records get an all-graphic release (photo probability ~0), textured ones version 2's mix: half
    photographic, not all (min(p_c, ½): a release painted only photographic scored lower on textured data,
    docs/prior.md). The statistic calls ~10 % of the prior's graphic paintings at 16 × 16 textured and ~10 % of its
    photographic ones flat, so a half-and-half release has ~45–55 % of its samples textured."""
    flat, textured = _released_share(0.0), _released_share(1.0)
    assert flat[0].max() < 0.3 and textured[0].tolist() == [0.5, 0.5]
    for f, t in zip(flat[1:], textured[1:]):
        assert f < 0.3 and 0.35 < t < 0.65
    

def test_one_record_moves_the_style_histogram_by_one_in_one_bin_of_its_class():
    """Brute force: removing any record (flat or textured, either class) changes the style release's noiseless
    query by exactly 1 in L1 and L2, in a bin of its own class, the one of its ground."""
    a, _ = _painted(0.0, 8, size=16, seed=4)
    b, _ = _painted(1.0, 8, size=16, seed=5)
    x, y = np.concatenate([a, b]), np.arange(16) % 3
    ground = pe.textured(x)
    assert 0 < ground.sum() < len(x)  # both kinds of record are present
    full = pe.style_counts(ground, y, 3)
    assert full.shape == (6,) and full.sum() == len(x)
    for i in range(len(x)):
        keep = np.arange(len(x)) != i
        diff = full - pe.style_counts(ground[keep], y[keep], 3)
        assert np.abs(diff).sum() == 1 and np.linalg.norm(diff) == 1
        assert np.flatnonzero(diff).tolist() == [2 * y[i] + int(ground[i])]
    with pytest.raises(pe.PrivacyError, match="labels"):
        pe.style_counts(ground, np.full(len(x), 3), 3)


def test_the_style_release_is_its_own_event_first_and_the_total_stays_at_the_target():
    """The plan: the style release (σ_s, STYLE_SHARE of the budget in 1/σ²) as the trace's first event, then T rounds
    whose σ is calibrated after it, so that every accountant the audit applies finds the whole trace ≤ ε."""
    cfg = load_config(overrides=["train.method=private-evolution", "privacy.epsilon=10", "privacy.delta=1e-5"])
    plan = histograms.PRIVATE_EVOLUTION.plan(cfg, 8000)
    sigma, style = plan.noise_multiplier, histograms.PRIVATE_EVOLUTION.style_noise_multiplier(plan)
    assert plan.trace == MechanismTrace([full_batch_gaussian(style), full_batch_gaussian(sigma).with_count(10)])
    share = style ** -2 / (style ** -2 + 10 / sigma ** 2)
    assert share == pytest.approx(histograms.STYLE_SHARE, rel=0.05)
    for name in ("rdp", "wor", "prv"):
        assert 9.0 < get_accountant(name).epsilon(plan.trace, delta=1e-5) <= 10.0
    without = max(histograms.calibrate(epsilon=10, delta=1e-5, rounds=10, accountant=a) for a in ("rdp", "wor"))
    assert without < sigma < without * math.sqrt(1 / (1 - histograms.STYLE_SHARE)) * 1.02  # the rounds pay ~1 %


def test_release_style_records_one_event_and_its_noise_has_std_sigma_s():
    r, trace = MechanismRandomness(seed=2), MechanismTrace()
    counts = pe.style_counts(np.zeros(3000, bool), np.zeros(3000, np.int64), 1)  # 3000 flat records, 0 textured
    shares = [pe.release_style(np.zeros(3000, bool), np.zeros(3000, np.int64), num_classes=1, noise_multiplier=30.0,
                               randomness=r, trace=trace)[0] for _ in range(400)]
    assert trace == MechanismTrace([full_batch_gaussian(30.0).with_count(400)])
    assert counts.tolist() == [3000.0, 0.0]
    # textured count N(0, 30²) clipped at 0: mean share ≈ 30 / √(2π) / 3000 ≈ 0.004
    assert 0.001 < np.mean(shares) < 0.01 and min(shares) >= 0.0
    assert pe.photo_shares(np.array([-3.0, -1.0, 10.0, -2.0, 3.0, 1.0, 1.0, 3.0])).tolist() == [0.5, 0.0, 0.25, 0.5]


def test_the_painter_holds_the_shares_and_a_file_without_them_paints_half():
    rng = np.random.default_rng(7)
    figures = [random_figures(rng, 4), random_figures(rng, 4)]
    p = FigurePainter.from_figures(figures, [np.full(4, 0.25)] * 2, image_size=16, channels=3,
                                   photo=np.array([0.0, 1.0]))
    q = FigurePainter(**{k: v for k, v in p.describe().items() if k != "class"})
    q.load_state_dict(p.state_dict())
    assert q.photo.tolist() == [0.0, 1.0]
    x, y = q.sample(60, generator=torch.Generator().manual_seed(0))
    textured = pe.textured(((x.permute(0, 2, 3, 1).numpy() + 1) * 127.5).round().astype(np.uint8))
    assert textured[y.numpy() == 0].mean() < 0.3 and textured[y.numpy() == 1].mean() > 0.8
    old = {k: v for k, v in p.state_dict().items() if k != "photo"}  # a release made before the style release
    q.load_state_dict(old)
    assert q.photo.tolist() == [0.5, 0.5]
    bad = dict(p.state_dict(), photo=torch.tensor([0.2, 1.5], dtype=torch.float64))
    with pytest.raises(RuntimeError, match="photo"):
        q.load_state_dict(bad)
