"""The without-replacement accountant against autodp, closed forms, and the GS-WGAN numbers.

Every reference number is computed here by autodp (Wang's implementation of the same
Theorem 9 bound, a test-only dependency), by Opacus' RDP-to-DP conversion, or by a closed
form — never by dpsynth itself.
"""

import doctest
import itertools
import json
import math

import numpy as np
import pytest
from opacus.accountants.analysis.rdp import get_privacy_spent

from dpsynth.errors import PrivacyError
from dpsynth.privacy import (
    MechanismEvent,
    MechanismTrace,
    WORAccountant,
    as_published_epsilon,
    calibrate_noise,
    epsilon,
    fold_releases,
    get_accountant,
    gswgan_event,
    max_steps,
)
from dpsynth.privacy import without_replacement as wor_module
from dpsynth.privacy.without_replacement import DEFAULT_ORDERS, wor_gaussian_rdp
from tests.privacy.test_cli import run as run_cli

from autodp import rdp_acct, rdp_bank  # noqa: E402  (test-only dependency, see requirements)
from autodp.mechanism_zoo import GaussianMechanism  # noqa: E402
from autodp.transformer_zoo import AmplificationBySampling, Composition  # noqa: E402

DELTA = 1e-5

# Opacus' conversion notes when α = 2 is optimal (huge ε); the reference values are still exact.
pytestmark = pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha:UserWarning")


def wor(q, sigma, count=1):
    return MechanismEvent(sampling="without_replacement", sample_rate=q, noise_multiplier=sigma,
                          sensitivity="replace_one", count=count)


# --- autodp references ------------------------------------------------------------------------


def autodp_acct(events, sensitivity=2.0):
    """autodp's analytical moments accountant with Theorem 9 (improved_bound_flag=False), one entry per event.

    ``rdp_bank.RDP_gaussian`` is α/(2s²) with s = noise std / sensitivity, so s = σ/Δ.
    """
    acct = rdp_acct.anaRDPacct()
    for q, sigma, count in events:
        s = sigma / sensitivity
        func = lambda x, s=s: rdp_bank.RDP_gaussian({"sigma": s}, x)  # noqa: E731
        acct.compose_subsampled_mechanism(func, q, coeff=count)
    return acct


def autodp_mechanism_epsilon(events, delta=DELTA):
    """autodp's Mechanism API: Gaussian (replace-one, Δ = 2C) → AmplificationBySampling(PoissonSampling=False)
    → Composition; ε by its BBGHS (Balle et al. 2020 Thm 21) conversion, optimised over real α."""
    mechanisms, coeffs = [], []
    for i, (q, sigma, count) in enumerate(events):
        gaussian = GaussianMechanism(sigma=sigma / 2, name=f"G{i}")
        gaussian.neighboring = "replace_one"
        mechanisms.append(gaussian if q == 1 else AmplificationBySampling(PoissonSampling=False)(gaussian, q))
        coeffs.append(count)
    with np.errstate(all="ignore"):
        return Composition()(mechanisms, coeffs).get_approxDP(delta)


CURVE_ORDERS = [*range(2, 65), 80, 128, 200, 256, 512, 1024, 2.5, 3.7, 10.25, 99.5]
CURVE_CONFIGS = [
    (0.001, 1.07 / math.sqrt(32)),  # GS-WGAN, folded
    (0.001, 1.0),
    (0.001, 20.0),
    (0.004, 0.7),
    (0.01, 2.0),
    (0.05, 5.0),
    (0.1, 0.05),
    (0.2, 1.0),
    (0.5, 3.0),
    (1.0, 1.0),
]


@pytest.mark.parametrize("q, sigma", CURVE_CONFIGS)
def test_rdp_curve_matches_autodp_theorem_9(q, sigma):
    ours = wor_gaussian_rdp(sample_rate=q, noise_multiplier=sigma, orders=CURVE_ORDERS)
    ref = autodp_acct([(q, sigma, 1)]).get_rdp(CURVE_ORDERS)
    # 1e-9: autodp takes log(1 + x) without log1p, which costs it ~1e-10 at σ = 20
    np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=0)


@pytest.mark.parametrize("q, sigma", [(0.001, 0.2), (0.1, 0.05), (0.5, 3.0), (0.01, 2.0)])
def test_orders_below_two_are_never_looser_than_autodp(q, sigma):
    # autodp uses ε'(2) on (1, 2]; we also cap by the base ε(α) = 2α/σ², so we may only be tighter.
    orders = [1.01, 1.25, 1.5, 1.9]
    ours = wor_gaussian_rdp(sample_rate=q, noise_multiplier=sigma, orders=orders)
    ref = autodp_acct([(q, sigma, 1)]).get_rdp(orders)
    assert np.all(ours <= ref * (1 + 1e-12))
    assert np.all(ours <= 2 * np.asarray(orders) / sigma**2 * (1 + 1e-12))


TRACES = [
    [(0.001, 1.07 / math.sqrt(32), 20_000)],
    [(0.001, 4 / math.sqrt(32), 20_000)],
    [(0.01, 1.0, 1000)],
    [(0.2, 5.0, 100)],
    [(1.0, 10.0, 10)],
    [(0.05, 2.0, 500), (0.01, 1.0, 3000)],  # heterogeneous
    [(0.004, 1.5, 10_000), (0.02, 3.0, 200), (1.0, 20.0, 5)],  # heterogeneous, with a full pass
]


@pytest.mark.parametrize("events", TRACES)
def test_composed_curve_and_epsilon_match_autodp(events):
    accountant = WORAccountant()
    trace = MechanismTrace(wor(*e) for e in events)
    # the composed curve, at every default order
    ref_curve = autodp_acct(events).get_rdp(list(DEFAULT_ORDERS))
    np.testing.assert_allclose(accountant.rdp(trace), ref_curve, rtol=1e-9)
    # ε: autodp's curve through the same (Balle et al. 2020) conversion over the same orders ...
    ref_eps, _ = get_privacy_spent(orders=list(DEFAULT_ORDERS), rdp=ref_curve, delta=DELTA)
    ours = accountant.epsilon(trace, delta=DELTA)
    assert ours == pytest.approx(float(ref_eps), rel=1e-9)
    # ... and autodp's own end-to-end Mechanism API, which optimises over real orders
    assert ours == pytest.approx(autodp_mechanism_epsilon(events), rel=1e-3)


def test_epsilon_is_not_above_autodp_get_eps():
    # autodp's get_eps converts with ε(α) + log(1/δ)/(α−1) (Mironov 2017), looser than Balle et al. 2020.
    for events in TRACES[:4]:
        ref = autodp_acct(events).get_eps(DELTA)
        assert WORAccountant().epsilon([wor(*e) for e in events], delta=DELTA) <= ref


# --- closed forms and shape -------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [0.3, 1.0, 4.0, 50.0])
def test_rate_one_is_the_plain_gaussian_with_sensitivity_two(sigma):
    orders = [2, 3, 5.5, 17, 64, 300]
    ours = wor_gaussian_rdp(sample_rate=1.0, noise_multiplier=sigma, orders=orders)
    np.testing.assert_allclose(ours, [2 * a / sigma**2 for a in orders], rtol=1e-12)


def test_subsampling_never_exceeds_the_base_mechanism():
    orders = list(DEFAULT_ORDERS)
    for q, sigma in itertools.product([0.001, 0.1, 0.9], [0.1, 1.0, 10.0]):
        ours = wor_gaussian_rdp(sample_rate=q, noise_multiplier=sigma, orders=orders)
        assert np.all(ours <= 2 * np.asarray(orders) / sigma**2 * (1 + 1e-12))


@pytest.mark.parametrize("sigma", [1e-200, 1e300])
def test_noise_beyond_float_range_is_handled(sigma):
    acc = WORAccountant()
    eps = acc.epsilon([wor(0.5, sigma, 3)], delta=DELTA)
    if sigma < 1:
        assert eps == math.inf
    else:  # zero RDP: only the conversion's own term at the largest order, 1024, remains
        assert np.all(acc.rdp([wor(0.5, sigma, 3)]) == 0)
        a = DEFAULT_ORDERS[-1]
        assert eps == pytest.approx(-(math.log(DELTA) + math.log(a)) / (a - 1) + math.log((a - 1) / a), rel=1e-9)


@pytest.mark.parametrize("sigma", [1e-6, 1e-3, 1e3, 1e6])
def test_extreme_noise_is_finite_and_sane(sigma):
    curve = wor_gaussian_rdp(sample_rate=0.01, noise_multiplier=sigma, orders=DEFAULT_ORDERS)
    assert np.all(np.isfinite(curve)) and np.all(curve >= 0)
    cap = 2 * np.asarray(DEFAULT_ORDERS) / sigma**2
    assert np.all(curve <= cap * (1 + 1e-12))
    if sigma >= 1e3:  # α = 2: the bound is log(1 + 4γ²(e^{ε(2)} − 1)) with ε(2) = 4/σ², far below ε(2)
        assert curve[0] == pytest.approx(math.log1p(4 * 0.01**2 * math.expm1(4 / sigma**2)), rel=1e-12)
    if sigma >= 1e6:  # α ≥ 3: the constant terms 2γ^j C(α, j) exceed (α−1)ε(α), so the cap is returned
        np.testing.assert_allclose(curve[1:], cap[1:], rtol=1e-12)


def test_epsilon_is_monotone_in_steps_and_noise():
    acc = WORAccountant()
    steps = [1, 10, 100, 1000, 10_000, 100_000]
    by_steps = [acc.epsilon([wor(0.01, 2.0, t)], delta=DELTA) for t in steps]
    assert all(a < b for a, b in zip(by_steps, by_steps[1:]))
    sigmas = [0.5, 0.8, 1.0, 2.0, 4.0, 10.0, 100.0]
    by_sigma = [acc.epsilon([wor(0.01, s, 1000)], delta=DELTA) for s in sigmas]
    assert all(a > b for a, b in zip(by_sigma, by_sigma[1:]))
    by_rate = [acc.epsilon([wor(q, 2.0, 1000)], delta=DELTA) for q in (0.001, 0.01, 0.1, 1.0)]
    assert all(a < b for a, b in zip(by_rate, by_rate[1:]))


def test_composition_adds_curves():
    acc = WORAccountant()
    a, b = wor(0.01, 1.0, 300), wor(0.1, 4.0, 20)
    np.testing.assert_allclose(acc.rdp([a, b]), acc.rdp([a]) + acc.rdp([b]), rtol=1e-12)
    np.testing.assert_allclose(acc.rdp([a.with_count(600)]), 2 * acc.rdp([a]), rtol=1e-12)


# --- what it accepts --------------------------------------------------------------------------


def test_registered_as_wor():
    assert isinstance(get_accountant("wor"), WORAccountant)
    assert repr(WORAccountant()) == "WORAccountant()"
    assert epsilon([wor(0.01, 1.0, 10)], delta=DELTA, accountant="wor") == WORAccountant().epsilon(
        [wor(0.01, 1.0, 10)], delta=DELTA)


@pytest.mark.parametrize(
    "event, field",
    [
        (MechanismEvent(sampling="poisson", sample_rate=0.01, noise_multiplier=1.0, sensitivity="add_remove"),
         "sampling"),
        (MechanismEvent(sampling="poisson", sample_rate=0.01, noise_multiplier=1.0, sensitivity="replace_one"),
         "sampling"),
        (MechanismEvent(sampling="without_replacement", sample_rate=0.01, noise_multiplier=1.0,
                        sensitivity="add_remove"), "sensitivity"),
    ],
)
def test_other_events_are_refused(event, field):
    acc = WORAccountant()
    assert not acc.supports(event)
    with pytest.raises(PrivacyError, match=f"^{field}: "):
        acc.epsilon([wor(0.01, 1.0, 10), event], delta=DELTA)


@pytest.mark.parametrize("orders", [[], [1.0], [0.5, 2], [2, math.inf]])
def test_bad_orders_are_refused(orders):
    with pytest.raises(PrivacyError, match="^orders: "):
        WORAccountant(orders=orders)


def test_empty_trace_spends_nothing():
    assert WORAccountant().epsilon(MechanismTrace(), delta=DELTA) == 0.0


# --- GS-WGAN ----------------------------------------------------------------------------------


def test_gswgan_event_folds_the_batch_into_one_shard_draw():
    event = gswgan_event(noise_multiplier=1.07, batch_size=32, num_shards=1000)
    assert event == MechanismEvent(sampling="without_replacement", sample_rate=0.001,
                                   noise_multiplier=1.07 / math.sqrt(32), sensitivity="replace_one")
    assert event.noise_multiplier == fold_releases(1.07, 32)
    with pytest.raises(PrivacyError, match="^batch_size: "):
        gswgan_event(noise_multiplier=1.0, batch_size=0, num_shards=10)
    with pytest.raises(PrivacyError, match="^num_shards: "):
        gswgan_event(noise_multiplier=1.0, batch_size=1, num_shards=0)


def authors_code_epsilon(sigma, batch, shards, steps, delta=DELTA):
    """GS-WGAN's evaluation/privacy_analysis.py: RDP_gaussian(σ) subsampled at 1/K, coeff = T·B, get_eps."""
    acct = autodp_acct([(1.0 / shards, sigma, steps * batch)], sensitivity=1.0)
    return acct.get_eps(delta)


@pytest.mark.parametrize("sigma, batch, shards, steps", [(1.07, 32, 1000, 20_000), (0.8, 16, 500, 5000),
                                                         (2.0, 64, 100, 1000)])
def test_as_published_reproduces_the_authors_code(sigma, batch, shards, steps):
    ours = as_published_epsilon(noise_multiplier=sigma, batch_size=batch, num_shards=shards, steps=steps,
                                delta=DELTA)
    assert ours == pytest.approx(authors_code_epsilon(sigma, batch, shards, steps), rel=1e-5)


def test_gswgan_anchors():
    setting = dict(batch_size=32, num_shards=1000)
    # the paper's ε ≈ 10 at σ = 1.07, T = 20k (GS-WGAN Table 1 / supplement C.1; DESIGN.md: 9.99)
    published = as_published_epsilon(noise_multiplier=1.07, **setting, steps=20_000, delta=DELTA)
    assert published == pytest.approx(9.99, abs=0.005)
    acc = WORAccountant()
    for sigma in (1.07, 4.0):
        sound = acc.epsilon([gswgan_event(noise_multiplier=sigma, **setting).with_count(20_000)], delta=DELTA)
        ref = autodp_mechanism_epsilon([(0.001, sigma / math.sqrt(32), 20_000)])
        assert sound == pytest.approx(ref, rel=1e-3)
        assert sound > 10 * published
    # DESIGN.md's "sound" figures (ε ≈ 3·10⁵ at σ = 1.07, ε ≈ 3.4 at σ ≈ 4) are the folded account with
    # sensitivity C, not 2C: autodp's get_eps on α/(2(σ/√B)²) reproduces them.
    # With 2C (checked above) they are ≈ 2·10⁶ and ≈ 130.
    assert autodp_acct([(0.001, 1.07 / math.sqrt(32), 20_000)], sensitivity=1.0).get_eps(DELTA) == pytest.approx(
        3e5, rel=0.02)
    assert autodp_acct([(0.001, 4 / math.sqrt(32), 20_000)], sensitivity=1.0).get_eps(DELTA) == pytest.approx(
        3.4, abs=0.05)


# --- calibration, budget, CLI ------------------------------------------------------------------

WOR_ARGS = dict(accountant="wor", sampling="without_replacement", sensitivity="replace_one")


@pytest.mark.parametrize("target, q, steps", [(10.0, 0.001, 20_000), (1.0, 0.01, 1000), (3.0, 1.0, 50),
                                              (0.5, 0.004, 5000)])
def test_calibration_round_trip_never_overshoots(target, q, steps):
    sigma = calibrate_noise(target_epsilon=target, delta=DELTA, sample_rate=q, steps=steps, **WOR_ARGS)
    ref = autodp_acct([(q, sigma, steps)]).get_rdp(list(DEFAULT_ORDERS))
    ref_eps, _ = get_privacy_spent(orders=list(DEFAULT_ORDERS), rdp=ref, delta=DELTA)
    assert ref_eps <= target
    assert WORAccountant().epsilon([wor(q, sigma * 0.99, steps)], delta=DELTA) > target
    n = max_steps(noise_multiplier=sigma, sample_rate=q, target_epsilon=target, delta=DELTA, **WOR_ARGS)
    assert n >= steps
    assert WORAccountant().epsilon([wor(q, sigma, n)], delta=DELTA) <= target
    assert WORAccountant().epsilon([wor(q, sigma, n + 1)], delta=DELTA) > target


def test_calibration_refuses_a_mismatched_accountant():
    with pytest.raises(PrivacyError, match="^sampling: "):
        calibrate_noise(target_epsilon=1.0, delta=DELTA, sample_rate=0.01, steps=100, accountant="rdp",
                        sampling="without_replacement", sensitivity="replace_one")


GSWGAN_CLI = ["--sample-rate", "0.001", "--steps", "20000", "--delta", "1e-5", "--sampling", "without_replacement"]


def test_cli_epsilon_without_replacement(capsys):
    sigma = 4 / math.sqrt(32)
    code, out = run_cli(["privacy", "epsilon", "--noise-multiplier", str(sigma), *GSWGAN_CLI, "--json"], capsys)
    result = json.loads(out)
    assert code == 0
    assert (result["accountant"], result["sampling"], result["sensitivity"]) == ("wor", "without_replacement",
                                                                                  "replace_one")
    assert result["epsilon"] == pytest.approx(autodp_mechanism_epsilon([(0.001, sigma, 20_000)]), rel=1e-3)
    argv = ["privacy", "epsilon", "--noise-multiplier", str(sigma), *GSWGAN_CLI, "--accountant", "wor"]
    code, out = run_cli(argv, capsys)
    assert code == 0 and "wor" in out


def test_cli_noise_without_replacement(capsys):
    code, out = run_cli(["privacy", "noise", "--epsilon", "10", *GSWGAN_CLI, "--json"], capsys)
    result = json.loads(out)
    assert code == 0 and result["accountant"] == "wor" and result["epsilon"] <= 10


def test_cli_refuses_rdp_for_without_replacement(capsys):
    with pytest.raises(PrivacyError, match="^sampling: "):
        run_cli(["privacy", "epsilon", "--noise-multiplier", "1", *GSWGAN_CLI, "--accountant", "rdp"], capsys)


def test_module_examples_run():
    assert doctest.testmod(wor_module).failed == 0


# --- full-batch releases before shard-sampled iterations (a private warm-up) -----------------------


@pytest.mark.parametrize("sensitivity, delta_f", [("add_remove", 1.0), ("replace_one", 2.0)])
def test_full_batch_releases_compose_with_the_iterations_as_autodp(sensitivity, delta_f):
    # a warm-up (two full-batch Gaussians) then GS-WGAN-like iterations; autodp's Mechanism API composes
    # Gaussians of std σ/Δ with the amplified iterations, optimising over real orders
    warm = [MechanismEvent(sampling="full_batch", sample_rate=1.0, noise_multiplier=s, sensitivity=sensitivity)
            for s in (5.0, 1.5)]
    ours = WORAccountant().epsilon(MechanismTrace([*warm, wor(0.02, 3.0, 500)]), delta=DELTA)
    gaussians = [GaussianMechanism(sigma=s / delta_f, name=f"W{i}") for i, s in enumerate((5.0, 1.5))]
    gaussian = GaussianMechanism(sigma=3.0 / 2, name="I")
    gaussian.neighboring = "replace_one"
    iterations = AmplificationBySampling(PoissonSampling=False)(gaussian, 0.02)
    with np.errstate(all="ignore"):
        ref = Composition()([*gaussians, iterations], [1, 1, 500]).get_approxDP(DELTA)
    assert ref * (1 - 1e-9) <= ours <= ref * 1.005  # ours: the best of a finite set of orders (≥ real-order optimum)
    # and more than the iterations alone
    assert ours > WORAccountant().epsilon([wor(0.02, 3.0, 500)], delta=DELTA)

