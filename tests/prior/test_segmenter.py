"""The public segmenter (docs/prior.md, "A public segmenter"): its committed weights segment the prior's paintings,
its training data come from public seeds only, and the feature built on it ignores colour."""

import importlib.util
import inspect
from pathlib import Path

import numpy as np
import pytest

from dpsynth.mechanisms import private_evolution as pe
from dpsynth.prior import segmenter
from dpsynth.prior.figures import masks, random_figures
from dpsynth.prior.paint import paint

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train_segmenter.py"


def _script():
    spec = importlib.util.spec_from_file_location("train_segmenter", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _iou(p: np.ndarray, m: np.ndarray) -> float:
    inter = ((p > 0.5) & (m > 0.5)).sum((1, 2))
    union = np.maximum(((p > 0.5) | (m > 0.5)).sum((1, 2)), 1)
    return float((inter / union).mean())


@pytest.fixture(scope="module")
def prior_paintings():
    rng = np.random.default_rng(20261130)  # a seed of neither the training nor the validation paintings
    m = masks(random_figures(rng, 64), 32)
    return paint(m, rng, channels=3), m


def test_the_committed_weights_segment_the_priors_paintings(prior_paintings):
    images, m = prior_paintings
    assert segmenter.WEIGHTS.stat().st_size < 1_000_000
    assert _iou(segmenter.predict(images), m) > 0.75  # measured 0.896; untrained weights 0.173


def test_untrained_weights_would_fail_that_check(prior_paintings, tmp_path):
    import torch

    torch.manual_seed(0)
    path = tmp_path / "random.npz"
    np.savez(path, **{k: v.numpy() for k, v in segmenter.network().eval().state_dict().items()})
    images, m = prior_paintings
    assert _iou(segmenter.predict(images, path=str(path)), m) < 0.75


def test_the_training_data_are_drawn_from_public_seeds_only():
    script = _script()
    assert list(inspect.signature(script.paintings).parameters) == ["seed", "n"]  # no record, no file
    a, b = script.paintings(3, 8), script.paintings(3, 8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[1], script.paintings(4, 8)[1])
    imported = {line.split()[1] for line in SCRIPT.read_text().splitlines() if line.startswith(("import ", "from "))}
    assert {m for m in imported if m.startswith("dpsynth")} <= {"dpsynth.prior", "dpsynth.prior.figures",
                                                                 "dpsynth.prior.paint"}


def test_the_segmenter_feature_ignores_colour_and_polarity():
    m = masks(random_figures(np.random.default_rng(5), 1), 32)[0][..., None]
    a = np.clip(m * (230, 30, 30) + (1 - m) * (20, 20, 20), 0, 255).astype(np.uint8)  # red on black
    b = np.clip(m * (10, 10, 90) + (1 - m) * (40, 210, 60), 0, 255).astype(np.uint8)  # dark blue on green
    f = pe.segmenter_map(np.stack([a, b]))
    assert float(f[0] @ f[1]) > 0.95
    mask_feature = pe.figure_map(np.round(m * 255).astype(np.uint8)[None])
    assert float(f[0] @ mask_feature[0]) > 0.9 and float(f[1] @ mask_feature[0]) > 0.9


def test_private_evolution_votes_in_the_feature_it_is_given():
    from dpsynth.errors import PrivacyError

    rng = np.random.default_rng(7)
    m = masks(random_figures(rng, 12), 32)
    images, labels = paint(m, rng, channels=3), np.arange(12) % 2
    seen = {}
    for feature in ("plane", "segmenter"):
        pe.evolve(images, labels, num_classes=2, rounds=1, candidates=4, noise_multiplier=0.0, threshold=0.5,
                  randomness=None, trace=None, seed=1, feature=feature,
                  observe=lambda t, noisy, query, f=feature: seen.setdefault(f, query))
    pop = pe.start(num_classes=2, candidates=4, seed=1)
    cands = pe.mask_features([f for figs in pop.figures for f in figs], 32)
    for feature, fn in (("plane", pe.figure_map), ("segmenter", pe.segmenter_map)):
        assert np.array_equal(seen[feature], pe.votes(fn(images), labels, cands, np.repeat([0, 1], 4)))
    assert not np.array_equal(seen["plane"], seen["segmenter"])  # the two features vote apart on these records
    with pytest.raises(PrivacyError, match="private_evolution.feature"):
        pe.evolve(images, labels, num_classes=2, rounds=1, candidates=4, noise_multiplier=0.0, threshold=0.5,
                  randomness=None, trace=None, feature="colour")


def test_the_hybrid_feature_sends_flat_grounds_to_the_plane_and_textured_ones_to_the_segmenter():
    m = masks(random_figures(np.random.default_rng(11), 1), 32)[0][..., None]
    ramp = np.linspace(0, 1, 32)[None, :, None]
    flat = m * (220, 40, 40) + (1 - m) * ((30, 80, 150) + ramp * (60, 0, -90))  # a gradient ground
    noise = np.random.default_rng(12).uniform(0, 255, (32, 32, 3))
    textured = m * (250, 250, 250) + (1 - m) * (0.5 * noise)  # a speckled ground
    x = np.clip(np.stack([flat, textured]) + 0.5, 0, 255).astype(np.uint8)
    r = pe.ground_roughness(x)
    assert r[0] < pe.TEXTURED < r[1]
    plane, seg, hybrid = pe.figure_map(x), pe.segmenter_map(x), pe.hybrid_map(x)
    assert not np.allclose(plane, seg, atol=1e-3)  # the two maps differ on both records, so the switch shows
    assert np.array_equal(hybrid[0], plane[0]) and np.array_equal(hybrid[1], seg[1])


def test_the_feature_names_agree():
    """The configuration's names (evolution.feature), the mechanism's features and the privacy statement's texts."""
    from typing import get_args, get_type_hints

    from dpsynth.config import EvolutionConfig
    from dpsynth.mechanisms.histograms import FEATURE_STATEMENTS

    names = set(get_args(get_type_hints(EvolutionConfig)["feature"]))
    assert names == set(pe.FEATURES) == set(FEATURE_STATEMENTS)
