"""Inception Score and dp-GAN's JS score against closed forms (on real data vs noise: tests/evaluation/test_real_and_noise.py)."""

import numpy as np
import pytest
from scipy.stats import entropy

from dpsynth.evaluation import scores


def test_inception_score_closed_forms():
    k = 10
    assert scores.inception_score(np.eye(k)[np.arange(1000) % k])[0] == pytest.approx(k)  # confident, balanced
    assert scores.inception_score(np.full((1000, k), 1 / k))[0] == pytest.approx(1)  # undecided
    assert scores.inception_score(np.eye(k)[np.zeros(1000, int)])[0] == pytest.approx(1)  # one class only


def test_inception_score_matches_a_brute_force_kl():
    p = np.random.default_rng(0).dirichlet(np.ones(5) * 0.3, size=400)
    marginal = p.mean(0)
    want = np.exp(np.mean([entropy(row, marginal) for row in p]))
    assert scores.inception_score(p, splits=1) == (pytest.approx(want, rel=1e-9), 0.0)


def test_bernoulli_js_score_closed_form():
    assert scores.bernoulli_js_score(np.full(7, 0.5)) == pytest.approx(0)
    p = 0.8  # ½[p ln 2p + (1-p) ln 2(1-p)] + ½[½ ln(1/2p) + ½ ln(1/2(1-p))]
    want = 0.5 * (p * np.log(2 * p) + (1 - p) * np.log(2 * (1 - p))) + 0.25 * (np.log(0.5 / p) + np.log(0.5 / (1 - p)))
    assert scores.bernoulli_js_score(np.array([p, 1 - p])) == pytest.approx(want)
