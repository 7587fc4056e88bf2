"""The evaluation's two measures in the reference CNN's features, on real MNIST against noise: the Fréchet distance
(dpsynth.evaluation.fid: real vs real ≈ 0, real vs noise large) and the scores (dpsynth.evaluation.scores: Inception
Score and dp-GAN's JS score). One module, so that one reference CNN is trained for both (about 13 CPU-s each time);
their closed forms: tests/evaluation/test_fid.py and test_scores.py."""

import dataclasses

import numpy as np
import pytest

from dpsynth.evaluation import fid, scores


@pytest.fixture(scope="module")
def reference_classifier(mnist):
    """The reference CNN trained on 1000 real MNIST records (records 0..999)."""
    from dpsynth.evaluation.classifiers import ReferenceClassifier

    return ReferenceClassifier(mnist.subset(np.arange(1000)), steps=150, seed=0)


@pytest.fixture(scope="module")
def noise(mnist):
    """1000 images of uniform noise, labelled like MNIST records 2000..2999."""
    real = mnist.subset(np.arange(2000, 3000))
    pixels = np.random.default_rng(0).integers(0, 256, real.images.shape, dtype=np.uint8)
    return dataclasses.replace(real, images=pixels)


@pytest.fixture(scope="module")
def features(mnist, reference_classifier, noise):
    """The FID's feature space without Inception weights (the reference CNN's penultimate layer), and the features
    of real records 1000..1999, of real records 2000..2999 and of the noise in it."""
    space = fid.feature_space(None, reference_classifier)
    a, b = (space.features(mnist.subset(np.arange(lo, lo + 1000))) for lo in (1000, 2000))
    return space, a, b, space.features(noise)


def test_real_vs_real_near_zero_real_vs_noise_large(features):
    space, a, b, noisy = features
    assert space.name == "fid_classifier"
    real_vs_real, real_vs_noise = fid.distance(a, b), fid.distance(a, noisy)
    assert real_vs_real < 0.02 * real_vs_noise
    # half the records replaced by noise lands in between
    mixed = np.concatenate([b[:500], noisy[:500]])
    assert real_vs_real < fid.distance(a, mixed) < real_vs_noise


def test_real_vs_real_and_noise(mnist, reference_classifier, noise, features):
    b = mnist.subset(np.arange(2000, 3000))
    real = scores.inception_score(reference_classifier.probabilities(b))[0]
    assert real > 5 and scores.inception_score(reference_classifier.probabilities(noise))[0] < real / 2
    _, fa, fb, fn = features  # the reference CNN's features (ClassifierFeatures.features is the classifier's)
    same, different = scores.js_score(fa, fb, seed=0)["js_score"], scores.js_score(fa, fn, seed=0)["js_score"]
    assert same < 0.1 < 1 < different
