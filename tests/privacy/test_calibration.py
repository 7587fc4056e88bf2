"""Noise calibration and step budgets: round trips, boundaries, and published settings."""

import itertools
import time

import pytest

from dpsynth.errors import PrivacyError
from dpsynth.privacy import MechanismEvent, MechanismTrace, calibrate_noise, epsilon, max_steps
from dpsynth.privacy.calibration import max_additional_steps


def eps_at(sigma, q, steps, accountant="rdp", delta=1e-5, sampling="poisson"):
    event = MechanismEvent(sampling=sampling, sample_rate=q, noise_multiplier=sigma, sensitivity="add_remove",
                           count=steps)
    return epsilon([event], delta=delta, accountant=accountant)


def assert_tight(sigma, target, q, steps, accountant="rdp", rel_tol=0.01, sampling="poisson"):
    assert eps_at(sigma, q, steps, accountant, sampling=sampling) <= target
    assert eps_at(sigma * (1 - rel_tol), q, steps, accountant, sampling=sampling) > target


# --- calibrate_noise --------------------------------------------------------------------------

RDP_GRID = list(itertools.product([0.5, 1.0, 3.0, 10.0], [0.001, 0.01, 0.1, 1.0], [10, 1000, 100_000]))


@pytest.mark.parametrize("target, q, steps", RDP_GRID)
def test_rdp_calibration_never_overshoots_and_is_tight(target, q, steps):
    sigma = calibrate_noise(target_epsilon=target, delta=1e-5, sample_rate=q, steps=steps)
    assert_tight(sigma, target, q, steps)


@pytest.mark.parametrize("rel_tol", [0.001, 0.05, 0.3])
def test_rel_tol_is_respected(rel_tol):
    sigma = calibrate_noise(target_epsilon=2.0, delta=1e-6, sample_rate=0.02, steps=5000, rel_tol=rel_tol)
    assert eps_at(sigma, 0.02, 5000, delta=1e-6) <= 2.0
    assert eps_at(sigma * (1 - rel_tol), 0.02, 5000, delta=1e-6) > 2.0


def test_full_batch_calibration():
    sigma = calibrate_noise(target_epsilon=3.0, delta=1e-5, sample_rate=1.0, steps=50, sampling="full_batch")
    assert_tight(sigma, 3.0, 1.0, 50, sampling="full_batch")


@pytest.mark.parametrize(
    "target, steps, accountant, opacus_sigma",
    [  # opacus/tests/accountants_test.py, get_noise_multiplier at q = 0.04, δ = 1e-5
        (8.0, 2250, "rdp", 1.416),
        (8.0, 2000, "rdp", 1.3562),
        (8.0, 2250, "prv", 1.34765625),
        (8.0, 2000, "prv", 1.2915),
    ],
)
def test_calibration_agrees_with_opacus_anchors(target, steps, accountant, opacus_sigma):
    # Opacus stops within ε-tolerance 0.01 of the target, we within 1% of σ: both near the same root.
    sigma = calibrate_noise(target_epsilon=target, delta=1e-5, sample_rate=0.04, steps=steps, accountant=accountant)
    assert sigma == pytest.approx(opacus_sigma, rel=0.012)


@pytest.mark.parametrize("target, q, steps", [(6.78, 0.04, 2250), (1.0, 0.01, 5000), (3.0, 1.0, 50)])
def test_prv_calibration_round_trip(target, q, steps):
    sigma = calibrate_noise(target_epsilon=target, delta=1e-5, sample_rate=q, steps=steps, accountant="prv")
    assert_tight(sigma, target, q, steps, accountant="prv")


@pytest.mark.slow  # a PRV search at 450K steps (the anchors at 450K, and calibration round trips at smaller T, are quick)
def test_seed_000_calibration_at_450k_steps():
    # The paper: σ = 1 at q = 128/60000 allows 450K steps at (10, 1e-5) by Opacus' RDP.
    q, steps = 128 / 60000, 450_000
    sigma_rdp = calibrate_noise(target_epsilon=10.0, delta=1e-5, sample_rate=q, steps=steps)
    assert sigma_rdp == pytest.approx(1.0, abs=0.015)
    start = time.perf_counter()
    sigma_prv = calibrate_noise(target_epsilon=10.0, delta=1e-5, sample_rate=q, steps=steps, accountant="prv")
    print(f"PRV calibration at 450k steps: {time.perf_counter() - start:.1f} s")  # reported, not asserted
    assert sigma_prv < sigma_rdp
    assert_tight(sigma_prv, 10.0, q, steps, accountant="prv")


def test_unreachable_target_is_refused():
    with pytest.raises(PrivacyError, match="^target_epsilon: "):
        calibrate_noise(target_epsilon=1e-9, delta=1e-5, sample_rate=1.0, steps=1_000_000)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(target_epsilon=0.0), "target_epsilon"),
        (dict(target_epsilon=-1.0), "target_epsilon"),
        (dict(target_epsilon=float("inf")), "target_epsilon"),
        (dict(delta=1.5), "delta"),
        (dict(delta=0.0), "delta"),
        (dict(sample_rate=0.0), "sample_rate"),
        (dict(sample_rate=1.2), "sample_rate"),
        (dict(steps=0), "steps"),
        (dict(steps=-3), "steps"),
        (dict(rel_tol=0.0), "rel_tol"),
        (dict(rel_tol=1.0), "rel_tol"),
        (dict(accountant="moments"), "accountant"),
        (dict(sampling="without_replacement"), "sampling"),
        (dict(sensitivity="replace_one"), "sensitivity"),
    ],
)
def test_calibration_rejects_bad_input(kwargs, field):
    args = dict(target_epsilon=1.0, delta=1e-5, sample_rate=0.01, steps=1000) | kwargs
    with pytest.raises(PrivacyError, match=f"^{field}: "):
        calibrate_noise(**args)


# --- max_steps --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sigma, q, target, delta, paper_steps",
    [  # "Private GANs, Revisited" (seed 000), Tables 6-7: steps each setting ran within its RDP target
        (1.0, 128 / 60000, 10.0, 1e-5, 450_000),
        (2.0, 1 / 118, 10.0, 1e-5, 174_000),
        (5.6, 1 / 30, 10.0, 1e-5, 98_000),
        (5.0, 128 / 60000, 1.0, 1e-5, 325_000),
        (14.0, 1 / 118, 1.0, 1e-5, 165_000),
    ],
)
def test_rdp_max_steps_boundary_and_paper_budgets(sigma, q, target, delta, paper_steps):
    steps = max_steps(noise_multiplier=sigma, sample_rate=q, target_epsilon=target, delta=delta)
    assert eps_at(sigma, q, steps, delta=delta) <= target < eps_at(sigma, q, steps + 1, delta=delta)
    assert paper_steps <= steps < paper_steps * 1.02  # the paper rounds its budgets down


@pytest.mark.parametrize("sigma, q, target", [(1.5, 0.04, 6.78), (10.0, 1.0, 3.0), (0.9, 0.01, 2.0)])
def test_prv_max_steps_boundary(sigma, q, target):
    steps = max_steps(noise_multiplier=sigma, sample_rate=q, target_epsilon=target, delta=1e-5, accountant="prv")
    assert eps_at(sigma, q, steps, "prv") <= target < eps_at(sigma, q, steps + 1, "prv")


def test_max_steps_is_zero_when_one_step_exceeds():
    assert max_steps(noise_multiplier=0.5, sample_rate=0.01, target_epsilon=0.1, delta=1e-5) == 0


def test_full_batch_max_steps_against_the_exact_gaussian_law():
    # RDP of T Gaussian steps is T·α/(2σ²): T steps at σ equal one step at σ/√T, so the budget
    # at σ = 10·√k is k times the budget at σ = 10 (up to rounding of the boundary).
    one = max_steps(noise_multiplier=10.0, sample_rate=1.0, target_epsilon=3.0, delta=1e-5, sampling="full_batch")
    four = max_steps(noise_multiplier=20.0, sample_rate=1.0, target_epsilon=3.0, delta=1e-5, sampling="full_batch")
    assert 4 * one <= four <= 4 * one + 3


def test_max_additional_steps_after_a_different_prefix():
    prefix = MechanismTrace([MechanismEvent(sampling="poisson", sample_rate=0.05, noise_multiplier=1.5,
                                            sensitivity="add_remove", count=300)])
    event = MechanismEvent(sampling="poisson", sample_rate=0.01, noise_multiplier=1.2, sensitivity="add_remove")
    n = max_additional_steps(trace=prefix, event=event, target_epsilon=5.0, delta=1e-5)

    def spent(k):
        trace = prefix.copy()
        trace.record(event, count=k)
        return epsilon(trace, delta=1e-5)

    assert 0 < n and spent(n) <= 5.0 < spent(n + 1)
    assert max_additional_steps(trace=prefix, event=event, target_epsilon=2.0, delta=1e-5) == 0


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(noise_multiplier=0.0), "noise_multiplier"),
        (dict(sample_rate=2.0), "sample_rate"),
        (dict(target_epsilon=0.0), "target_epsilon"),
        (dict(delta=1.0), "delta"),
        (dict(sampling="without_replacement", sensitivity="replace_one"), "sampling"),
    ],
)
def test_max_steps_rejects_bad_input(kwargs, field):
    args = dict(noise_multiplier=1.0, sample_rate=0.01, target_epsilon=1.0, delta=1e-5) | kwargs
    with pytest.raises(PrivacyError, match=f"^{field}: "):
        max_steps(**args)


def test_prv_calibrates_targets_rdp_cannot_certify():
    # Over Opacus' orders (≤ 63) RDP cannot certify ε below ~0.1 at δ = 1e-5, whatever σ.
    with pytest.raises(PrivacyError, match="^target_epsilon: "):
        calibrate_noise(target_epsilon=0.05, delta=1e-5, sample_rate=0.001, steps=100)
    sigma = calibrate_noise(target_epsilon=0.05, delta=1e-5, sample_rate=0.001, steps=100, accountant="prv")
    assert_tight(sigma, 0.05, 0.001, 100, accountant="prv")
