"""The empirical audit is on by default, says "inconclusive" when it could not have failed, and audits the
warm-up's Gaussian releases with canaries (issue #33): positive controls for every release."""

import pytest
import torch

from dpsynth.config import load_config
from dpsynth.warmup import central_images
from dpsynth.audit import empirical
from dpsynth.audit import statistics
from dpsynth.audit import warmup as warmup_audit
from dpsynth.mechanisms.randomness import MechanismRandomness
from dpsynth.stages import audit

DEFAULT = "configs/dpgan-digits-cpu.yaml"  # the digit recipe (`make run`'s until 2026-11-28): σ = 5, 0.75, 0.8 for the three releases
RELEASES = ("class_means", "styles", "variations")
SHAPE = (28, 28, 1)


def no_noise(monkeypatch):
    monkeypatch.setattr(MechanismRandomness, "standard_normal",
                        lambda self, shape, dtype=None: torch.zeros(shape, dtype=dtype))


def seeded_noise(monkeypatch, seed: int = 0):
    """Real Gaussian noise, and the canaries' inclusion coins, from a fixed seed: an audit at 95% confidence refuses a
    correct release now and then (4 in 2,000 audits of the σ = 20 class-mean release below, measured), so the tests
    that expect "passed" draw noise and coins that do not fail the suite by chance (with the noise alone seeded, the
    secret coins still failed one run in a few of this file). The canaries' public placement is seeded too: it is
    drawn from OS entropy per audit (``canaries.public_seed``), and with it free the σ = 20 variations release below
    failed its "passed" one fresh process in a few."""
    g, coins = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)
    monkeypatch.setattr(warmup_audit, "public_seed", lambda: seed + 2)
    monkeypatch.setattr(MechanismRandomness, "standard_normal",
                        lambda self, shape, dtype=None: torch.randn(shape, dtype=dtype, generator=g))
    monkeypatch.setattr(MechanismRandomness, "poisson_mask",
                        lambda self, n, rate: torch.rand(n, generator=coins) < rate)


def no_clip(monkeypatch):
    """The warm-up's queries without their clipping (class and style sums, and the residuals' moments)."""
    contributions, moments = central_images._contributions, central_images.residual_second_moments
    monkeypatch.setattr(central_images, "_contributions", lambda images, clip, centre=0.0: contributions(images, 1e12, centre))
    monkeypatch.setattr(central_images, "residual_second_moments",
                        lambda *a, clip, **k: moments(*a, clip=1e12, **k))


def release_audit(cfg, name, canaries=1000):
    return warmup_audit.audit_warmup_release(cfg, name, image_shape=SHAPE, num_classes=10, canaries=canaries,
                                             confidence=0.95)


def test_a_quick_audit_is_part_of_every_default_run():
    assert load_config().audit.empirical == "auto"
    assert empirical.mode_for(load_config(DEFAULT)) == "quick"
    from dpsynth.methods import registry

    make_run = load_config("configs/dpgan-mnist-cpu.yaml")  # `make run`'s recipe, as its stages resolve it
    assert [empirical.mode_for(registry.resolve(make_run, channels=c)) for c in (1, 3)] == ["quick", "quick"]
    assert empirical.mode_for(load_config(overrides=["train.method=gswgan"])) == "quick"
    assert empirical.mode_for(load_config(overrides=["train.method=gswgan_federated"])) is None  # has none (yet)
    assert empirical.mode_for(load_config(overrides=["audit.empirical=off"])) is None
    assert [r[0] for r in warmup_audit.audited_releases(load_config(DEFAULT))] == list(RELEASES)


def test_inconclusive_is_neither_passed_nor_failed_in_the_report():
    inconclusive = {"name": "empirical", "passed": None, "verdict": "inconclusive", "detail": "INCONCLUSIVE"}
    ok = {"name": "noise", "passed": True, "detail": ""}
    assert audit.decision([ok, inconclusive]) == "passed"
    assert audit.decision([ok, inconclusive, {"name": "x", "passed": False, "detail": ""}]) == "failed"
    assert audit.decision([ok, {"name": "x", "passed": None, "detail": ""}]) == "failed"  # only a verdict excuses
    assert audit._shown(inconclusive) == "**inconclusive**" and audit._shown(ok) == "yes"


@pytest.mark.parametrize("name", RELEASES)
def test_the_default_warmup_release_passes(name, monkeypatch):
    seeded_noise(monkeypatch)
    r = release_audit(load_config(DEFAULT), name)
    assert r["verdict"] == "passed" and warmup_audit.warmup_check(r)["passed"]
    assert r["epsilon_lower"] <= r["accounted_epsilon"]
    assert 0.97 < r["noise_test"]["noise_std_over_planned"] < 1.03
    assert r["bound_test"]["largest_canary_coordinate"] <= r["bound_test"]["bound"] * (1 + 1e-6)


@pytest.mark.parametrize("name", RELEASES)
def test_without_noise_the_default_warmup_release_fails(name, monkeypatch):
    """At the default's σ (ε of the style and variation releases above what 1,000 canaries can prove), the
    noise test catches it."""
    no_noise(monkeypatch)
    r = release_audit(load_config(DEFAULT), name)
    check = warmup_audit.warmup_check(r)
    assert r["verdict"] == "failed" and not check["passed"] and not r["noise_test"]["passed"]
    assert "adds less noise than accounted" in check["detail"]


@pytest.mark.parametrize("name", RELEASES)
def test_without_clipping_the_warmup_release_fails(name, monkeypatch):
    no_clip(monkeypatch)
    r = release_audit(load_config(DEFAULT), name)
    check = warmup_audit.warmup_check(r)
    assert r["verdict"] == "failed" and not r["bound_test"]["passed"] and "not clipped" in check["detail"]


@pytest.mark.parametrize("name", RELEASES)
def test_without_noise_the_one_run_bound_alone_fails_a_low_epsilon_release(name, monkeypatch):
    """σ = 20 for every release (ε ≈ 0.2 each): the canaries' one-run bound itself exceeds the accounted ε."""
    cfg = load_config(DEFAULT, overrides=["warmup.noise_multiplier=20", "warmup.styles_noise_multiplier=20",
                                          "warmup.variations_noise_multiplier=20"])
    seeded_noise(monkeypatch)
    real = release_audit(cfg, name)
    assert real["verdict"] == "passed" and real["one_run"] == "conclusive"
    no_noise(monkeypatch)
    r = release_audit(cfg, name)
    assert r["epsilon_lower"] > 5 * r["accounted_epsilon"] and r["verdict"] == "failed"


def test_warmup_canaries_join_the_audited_release_alone():
    """The releases before the audited one see no canary, so the templates they give do not depend on the coins."""
    from dpsynth.warmup import fit as warmup

    cfg = load_config(DEFAULT)
    images, labels, _ = warmup_audit.dirac_records(20, SHAPE, 10, value=1.0)
    seen = {}
    warmup.release(cfg, torch.empty(0, 1, 28, 28), torch.empty(0, dtype=torch.long), num_classes=10,
                   randomness=MechanismRandomness(), trace=None, canaries=("styles", images, labels),
                   observe=lambda name, noisy, query: seen.setdefault(name, query))
    assert list(seen) == list(RELEASES)
    assert seen["class_means"].abs().sum() == 0 and seen["variations"].abs().sum() == 0
    assert seen["styles"][:, -1].sum() > 0  # the 20 canaries' counts


def test_the_largest_provable_epsilon_counts_only_the_canaries_the_sampling_reaches():
    """A noiseless sanitizer's canaries that no step samples leave no trace: the audit's ceiling at reach 1 is the
    all-correct one, and far lower at the default's 76 % (100 steps at q = 0.0142), where it cannot pass."""
    full = statistics.guess_and_bound([1.0] * 500 + [0.0] * 500, [True] * 500 + [False] * 500, delta=1e-5,
                                      confidence=0.975)["ceiling"]
    at = [statistics.reachable_ceiling(1000, r, delta=1e-5, confidence=0.975) for r in (1.0, 0.99, 0.76, 0.5)]
    assert at[0] == pytest.approx(full, rel=1e-6) and at == sorted(at, reverse=True) and at[2] < 2.0
    attacks = [{"name": "gradient", "epsilon_lower": 0.2, "canaries": 1000, "correct": 60, "guesses": 100,
                "reach": 0.76}]
    check = empirical.gate({"epsilon_lower": 0.2, "accounted_epsilon": 3.6, "canaries": 1000, "confidence": 0.95,
                            "attacks": attacks, "mode": "quick", "steps": 100, "ceiling": at[2]})
    assert check["verdict"] == "inconclusive" and "76% of the included canaries" in check["detail"]


def test_a_looser_clip_of_the_image_part_fails_the_bound_test(monkeypatch):
    """The image part clipped to C instead of C/√2 (a record's [image, count] vector then exceeds C): caught."""
    contributions = central_images._contributions
    monkeypatch.setattr(central_images, "_contributions", lambda images, clip, centre=0.0: contributions(images, clip * 2 ** 0.5, centre))
    cfg = load_config(DEFAULT)
    r = release_audit(cfg, "class_means")
    assert r["verdict"] == "failed" and not r["bound_test"]["passed"]
    assert r["bound_test"]["largest_canary_coordinate"] == pytest.approx(cfg.warmup.clip)


def test_the_pipeline_summary_shows_the_verdict():
    from dpsynth.runner import run as pipeline

    s = {"stages": [], "audit": "passed", "empirical": "inconclusive", "epsilon_total": 9.99, "delta": 1e-5}
    assert "| **total** | audit passed, empirical audit inconclusive |" in pipeline.table(s)


GENERIC = "configs/dpgan-generic-cpu.yaml"  # opens with the intensity histogram, a release with no canary audit


@pytest.mark.parametrize("name", ("class_means", "variations"))
def test_each_release_is_compared_with_its_own_epsilon_when_the_warmup_opens_with_the_histogram(name, monkeypatch):
    """The accounted ε of a release's audit is its own Gaussian's (its σ, full batch), whatever releases come
    before it: with the intensity histogram first, a position in the trace named the previous release's event
    (the variation release was compared with the class means' ε ≈ 0.8, and its audit failed). Reference: Opacus'
    RDP accountant on one full-batch Gaussian of that σ."""
    from opacus.accountants import RDPAccountant

    cfg = load_config(GENERIC)
    sigma = {"class_means": cfg.warmup.noise_multiplier, "variations": cfg.warmup.variations_noise_multiplier}[name]
    acc = RDPAccountant()
    acc.history = [(sigma, 1.0, 1)]
    seeded_noise(monkeypatch)
    r = release_audit(cfg, name)
    assert r["accounted_epsilon"] == pytest.approx(acc.get_epsilon(delta=cfg.privacy.delta), rel=1e-3)
    assert r["verdict"] == "passed" and warmup_audit.warmup_check(r)["passed"]


SHARED = ["warmup.variations_shared=true"]  # one moment matrix over every class (warmup.fit_epsilon's low-ε release)


def test_the_shared_variation_release_passes_with_canaries_on_distinct_pixels(monkeypatch):
    seeded_noise(monkeypatch)
    r = release_audit(load_config(DEFAULT, overrides=SHARED), "variations")
    assert r["canaries"] == 784  # at most one per pixel: every canary lands in the one matrix
    assert r["verdict"] == "passed" and warmup_audit.warmup_check(r)["passed"]
    assert 0.97 < r["noise_test"]["noise_std_over_planned"] < 1.03
    assert r["noise_test"]["coordinates"] == 784 * 785 // 2  # one matrix's upper triangle, not ten


def fails_without_noise_or_clipping(cfg, name, monkeypatch):
    """Positive controls: the release's audit fails with its noise removed (noise test), then with its clipping
    removed (bound test)."""
    no_noise(monkeypatch)
    r = release_audit(cfg, name)
    assert r["verdict"] == "failed" and not r["noise_test"]["passed"]
    monkeypatch.undo()
    no_clip(monkeypatch)
    r = release_audit(cfg, name)
    assert r["verdict"] == "failed" and not r["bound_test"]["passed"]


def test_the_shared_variation_release_fails_without_noise_or_clipping(monkeypatch):
    fails_without_noise_or_clipping(load_config(DEFAULT, overrides=SHARED), "variations", monkeypatch)


def test_without_noise_the_one_run_bound_alone_fails_a_low_epsilon_shared_release(monkeypatch):
    cfg = load_config(DEFAULT, overrides=[*SHARED, "warmup.variations_noise_multiplier=20"])
    seeded_noise(monkeypatch)
    assert release_audit(cfg, "variations")["verdict"] == "passed"
    no_noise(monkeypatch)
    r = release_audit(cfg, "variations")
    assert r["epsilon_lower"] > 5 * r["accounted_epsilon"] and r["verdict"] == "failed"


ALONG = ["warmup.styles_along=variations"]  # the style templates move along the released variation directions


@pytest.mark.parametrize("name", ["styles", "variations"])
def test_with_styles_along_the_variations_each_release_passes(name, monkeypatch):
    seeded_noise(monkeypatch)
    r = release_audit(load_config(DEFAULT, overrides=ALONG), name)
    assert r["verdict"] == "passed" and warmup_audit.warmup_check(r)["passed"]
    assert 0.97 < r["noise_test"]["noise_std_over_planned"] < 1.03


@pytest.mark.slow
def test_with_styles_along_the_variations_the_style_release_fails_without_noise_or_clipping(monkeypatch):
    fails_without_noise_or_clipping(load_config(DEFAULT, overrides=ALONG), "styles", monkeypatch)


def test_with_styles_along_the_variations_the_style_canaries_join_it_alone():
    """The variation release now comes before the style release and reads no canary: the templates moved along its
    directions do not depend on the coins."""
    from dpsynth.warmup import fit as warmup

    cfg = load_config(DEFAULT, overrides=ALONG)
    images, labels, _ = warmup_audit.dirac_records(20, SHAPE, 10, value=1.0)
    seen = {}
    warmup.release(cfg, torch.empty(0, 1, 28, 28), torch.empty(0, dtype=torch.long), num_classes=10,
                   randomness=MechanismRandomness(), trace=None, canaries=("styles", images, labels),
                   observe=lambda name, noisy, query: seen.setdefault(name, query))
    assert list(seen) == ["class_means", "variations", "styles"]
    assert seen["class_means"].abs().sum() == 0 and seen["variations"].abs().sum() == 0
    assert seen["styles"][:, -1].sum() > 0  # the 20 canaries' counts
