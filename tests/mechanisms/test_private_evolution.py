"""Private Evolution on the public prior (dpsynth.mechanisms.private_evolution) against first principles: the
query's sensitivity by brute force, each round one Gaussian event whose composed ε matches the exact Gaussian
mechanism, a canary's measured privacy loss below the accounted ε (and far above it without the noise), and the
colour-blind feature."""

import math

import numpy as np
import pytest
from scipy import optimize, stats

from dpsynth.errors import PrivacyError
from dpsynth.mechanisms import private_evolution as pe
from dpsynth.mechanisms.randomness import MechanismRandomness
from dpsynth.prior.figures import Part, masks, random_figures
from dpsynth.prior.paint import paint
from dpsynth.privacy import MechanismTrace, full_batch_gaussian, get_accountant


def exact_gaussian_epsilon(s, delta):
    """ε of one Gaussian mechanism of sensitivity 1 and noise s at δ (Balle & Wang 2018, Thm 8), solved for ε."""
    def gap(eps):
        return stats.norm.cdf(1 / (2 * s) - eps * s) - math.exp(eps) * stats.norm.cdf(-1 / (2 * s) - eps * s) - delta
    return optimize.brentq(gap, 0.0, 500.0, xtol=1e-12)


SQUARE = (Part("poly", (0.5, 0.5, 0.35, math.pi / 4, 1.0, 0.1, 1.0, 1.0, 1.0, 1.0)),)
RING = (Part("ellipse", (0.5, 0.5, 0.33, 0.33, 0.0, 0.0, 0.12)),)


def _records(n_per_class=12, size=12, seed=0):
    """Two classes, filled squares and rings, painted in the prior's random colours (a public stand-in)."""
    rng = np.random.default_rng(seed)
    m = np.concatenate([masks([SQUARE] * n_per_class, size), masks([RING] * n_per_class, size)])
    return paint(m, rng, channels=3), np.repeat([0, 1], n_per_class)


def test_the_feature_ignores_colour_but_not_shape():
    x, _ = _records(n_per_class=6)
    f = pe.figure_map(x)
    same = f[:6] @ f[:6].T
    other = f[:6] @ f[6:].T
    assert same.min() > other.max()
    assert np.allclose(np.linalg.norm(f, axis=1), 1, atol=1e-5)


def test_one_record_moves_the_stacked_histogram_by_one_vote_in_one_bin():
    """Brute force over every record: removing it changes the noiseless query by exactly 1 in L2 (and L1)."""
    x, y = _records()
    rng = np.random.default_rng(1)
    cands = random_figures(rng, 16)
    classes = np.repeat([0, 1], 8)
    cf = pe.mask_features(cands, x.shape[1])
    rf = pe.figure_map(x)
    full = pe.votes(rf, y, cf, classes)
    assert full.sum() == len(x)
    for i in range(len(x)):
        keep = np.arange(len(x)) != i
        diff = full - pe.votes(rf[keep], y[keep], cf, classes)
        assert np.abs(diff).sum() == 1 and np.linalg.norm(diff) == 1
        assert classes[np.flatnonzero(diff)[0]] == y[i]  # the vote went to a candidate of the record's class


def test_every_round_is_one_full_batch_gaussian_and_the_accountants_match_the_exact_gaussian_mechanism():
    x, y = _records()
    trace, seen = MechanismTrace(), []
    sigma, rounds, delta = 3.0, 4, 1e-5
    evo = pe.evolve(x, y, num_classes=2, rounds=rounds, candidates=6, noise_multiplier=sigma, threshold=1.0,
                    randomness=MechanismRandomness(seed=0), trace=trace, observe=lambda t, n, q: seen.append(q))
    assert trace == MechanismTrace([full_batch_gaussian(sigma).with_count(rounds)])
    assert [q.sum() for q in seen] == [len(x)] * rounds and len(evo.histograms) == rounds
    # T Gaussian releases of sensitivity 1 and noise σ are exactly one of noise σ/√T (their GDP μ add in squares)
    exact = exact_gaussian_epsilon(sigma / math.sqrt(rounds), delta)
    rdp = get_accountant("rdp").epsilon(trace, delta=delta)
    prv = get_accountant("prv").epsilon(trace, delta=delta)
    assert exact <= rdp <= 1.25 * exact
    assert prv == pytest.approx(exact, abs=0.03)
    assert pe.rounds_epsilon(rounds, sigma, delta=delta) == rdp


def test_calibration_spends_the_target_and_no_more():
    sigma = pe.calibrate(epsilon=10.0, delta=1e-5, rounds=10)
    eps = pe.rounds_epsilon(10, sigma, delta=1e-5)
    assert 9.8 <= eps <= 10.0
    assert exact_gaussian_epsilon(sigma / math.sqrt(10), 1e-5) <= 10.0


def _canary_loss(sigma, trials=4000):
    """The canary's measured privacy loss: the best threshold test on its bin over ``trials`` releases with and
    without it, log(TPR / FPR) from one-sided 95% Clopper–Pearson bounds. An (ε, δ) guarantee caps it at about ε:
    TPR ≤ e^ε·FPR + δ, and δ = 1e-5 is negligible beside the false-positive rates a few thousand trials resolve."""
    x, y = _records()
    canary, _ = _records(n_per_class=1, seed=9)
    cf = pe.mask_features([SQUARE, RING], x.shape[1])
    without = pe.votes(pe.figure_map(x), y, cf, np.array([0, 1]))
    with_ = pe.votes(pe.figure_map(np.concatenate([x, canary[:1]])), np.append(y, 0), cf, np.array([0, 1]))
    assert (with_ - without).tolist() == [1.0, 0.0]  # the canary (a square of class 0) votes for the square
    r = MechanismRandomness(seed=3)
    a = np.array([pe.noisy_votes(with_, noise_multiplier=sigma, randomness=r)[0] for _ in range(trials)])
    b = np.array([pe.noisy_votes(without, noise_multiplier=sigma, randomness=r)[0] for _ in range(trials)])
    best = 0.0
    for t in np.quantile(np.concatenate([a, b]), np.linspace(0.5, 0.99, 40)):
        tp, fp = (a > t).sum(), (b > t).sum()
        lo = stats.beta.ppf(0.05, tp, trials - tp + 1) if tp else 0.0  # Clopper–Pearson
        hi = stats.beta.ppf(0.95, fp + 1, trials - fp)
        if lo > 0:
            best = max(best, math.log(lo / hi))
    return best


def test_a_canarys_measured_loss_stays_below_the_accounted_epsilon_and_the_noiseless_control_exceeds_it():
    sigma = 0.5  # one round: ε ≈ 9.7 at δ = 1e-5, the canary's loss at δ = 0 measurably above 0
    accounted = pe.rounds_epsilon(1, sigma, delta=1e-5)
    measured = _canary_loss(sigma)
    assert 0.3 < measured <= accounted
    assert _canary_loss(0.02) > 5.0  # positive control: nearly without noise the canary is plainly seen


def test_the_noise_on_every_bin_has_std_sigma_and_is_fresh_each_round():
    r = MechanismRandomness(seed=4)
    a = pe.noisy_votes(np.zeros(20000), noise_multiplier=1.7, randomness=r)
    b = pe.noisy_votes(np.zeros(20000), noise_multiplier=1.7, randomness=r)
    assert a.std() == pytest.approx(1.7, rel=0.02) and abs(a.mean()) < 0.05
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.03


def test_noise_needs_the_secret_randomness_and_a_nonnegative_sigma():
    with pytest.raises(PrivacyError, match="secret randomness"):
        pe.noisy_votes(np.zeros(3), noise_multiplier=1.0, randomness=None)
    with pytest.raises(PrivacyError, match="noise_multiplier"):
        pe.noisy_votes(np.zeros(3), noise_multiplier=-1.0, randomness=None)


def test_noiseless_evolution_moves_the_prior_towards_each_class():
    """σ = 0 (not private): after a few rounds each class's release looks like its own records, not the other's."""
    x, y = _records(n_per_class=20, size=16)
    evo = pe.evolve(x, y, num_classes=2, rounds=4, candidates=40, noise_multiplier=0.0, threshold=0.5,
                    randomness=None, trace=None, seed=0)
    images, labels = pe.sample(evo, 40, size=16, channels=3, seed=1)
    f, r = pe.figure_map(images), pe.figure_map(x)
    centre = np.stack([r[y == c].mean(0) for c in (0, 1)])
    assert ((f @ centre.T).argmax(1) == labels).mean() > 0.9
    assert images.shape == (40, 16, 16, 3) and labels.tolist() == [0, 1] * 20


def test_the_statement_says_the_sensitivity_and_the_noise():
    text = pe.statement(rounds=10, candidates=200, noise_multiplier=1.7, threshold=3.4)
    assert "moves it by 1 in L2" in text and "σ = 1.7" in text and "#0–#9" in text and "reads no record" in text


def test_doctests():
    import doctest

    assert doctest.testmod(pe).failed == 0
