"""The generic recipe's first releases — the intensity histogram and the polarity shapes — have audit runs in the
empirical audit like the other warm-up releases (issue #52 item 5), each with positive controls: without its noise,
or without the normalisation that bounds a record's contribution, the run fails."""

import pytest
import torch

from dpsynth.audit import warmup as warmup_audit
from dpsynth.config import load_config
from dpsynth.warmup import central_images
from dpsynth.mechanisms.randomness import MechanismRandomness
from tests.audit.test_empirical_warmup import no_noise, seeded_noise

GENERIC = "configs/dpgan-generic-cpu.yaml"  # intensity histogram, class means, polarity shapes, variations
NEW = ("intensity", "polarity")


def audit_run(name, shape=(28, 28, 1)):
    return warmup_audit.audit_warmup_release(load_config(GENERIC), name, image_shape=shape, num_classes=10,
                                             canaries=1000, confidence=0.95)


def test_the_generic_recipe_audits_every_release_it_makes():
    assert [r[0] for r in warmup_audit.audited_releases(load_config(GENERIC))] == \
        ["intensity", "class_means", "polarity", "variations"]


@pytest.mark.parametrize("shape", [(28, 28, 1), (16, 16, 3)])
@pytest.mark.parametrize("name", NEW)
def test_the_release_passes_its_audit_run(name, shape, monkeypatch):
    seeded_noise(monkeypatch)
    r = audit_run(name, shape)
    assert r["verdict"] == "passed" and warmup_audit.warmup_check(r)["passed"]
    assert r["epsilon_lower"] <= r["accounted_epsilon"]
    assert r["bound_test"]["largest_canary_coordinate"] <= r["bound_test"]["bound"] * (1 + 1e-6)
    assert r["canaries"] == (central_images.INTENSITY_BINS if name == "intensity" else 1000)


@pytest.mark.parametrize("name", NEW)
def test_without_noise_the_release_fails(name, monkeypatch):
    no_noise(monkeypatch)
    r = audit_run(name)
    check = warmup_audit.warmup_check(r)
    assert r["verdict"] == "failed" and not r["noise_test"]["passed"] and "adds less noise than accounted" in check["detail"]


def test_an_unnormalised_histogram_fails_the_bound_test(monkeypatch):
    """Each record's histogram as raw pixel counts (not divided by its pixel count): a canary moves its bin by H·W·C."""
    def raw_counts(images, bins=central_images.INTENSITY_BINS):
        x = ((images.double() + 1) / 2).flatten(1).clamp(0, 1)
        idx = (x * bins).long().clamp(max=bins - 1)
        return torch.zeros(len(x), bins, dtype=torch.float64).scatter_add_(1, idx, torch.ones_like(x)).sum(0)

    monkeypatch.setattr(central_images, "intensity_sums", raw_counts)
    r = audit_run("intensity")
    assert r["verdict"] == "failed" and not r["bound_test"]["passed"]
    assert "not clipped" in warmup_audit.warmup_check(r)["detail"]


def test_unnormalised_polarity_features_fail_the_bound_test(monkeypatch):
    """f not scaled to norm 1 (a bright canary's spike then moves its group's sum far past C/√2): caught."""
    polarity = central_images.polarity
    monkeypatch.setattr(central_images, "polarity", lambda images: (lambda f, s: (f * 1e3, s))(*polarity(images)))
    r = audit_run("polarity")
    assert r["verdict"] == "failed" and not r["bound_test"]["passed"]


def test_canaries_join_the_audited_release_alone():
    from dpsynth.warmup import fit as warmup

    cfg = load_config(GENERIC)
    for name in NEW:
        if name == "intensity":
            images, labels, _ = warmup_audit.flat_records(16, (28, 28, 1), 10)
        else:
            images, labels, _ = warmup_audit.dirac_records(20, (28, 28, 1), 10, value=1.0)
        seen = {}
        warmup.release(cfg, torch.empty(0, 1, 28, 28), torch.empty(0, dtype=torch.long), num_classes=10,
                       randomness=MechanismRandomness(), trace=None, canaries=(name, images, labels),
                       observe=lambda release, noisy, query: seen.setdefault(release, query))
        assert list(seen) == ["intensity", "class_means", "polarity", "variations"]
        assert all(seen[r].abs().sum() == 0 for r in seen if r != name) and seen[name].abs().sum() > 0
