"""The empirical audit of Private Evolution's histograms (audit/empirical.py, kind "votes"): honest code measures
below the accounted ε, and, the positive control, a mechanism that adds far less noise than planned is caught."""

from __future__ import annotations

import pytest

from dpsynth.audit import empirical
from dpsynth.config import load_config
from dpsynth.mechanisms import private_evolution as pe

CFG = ["train.method=private-evolution", "privacy.epsilon=2", "privacy.delta=1e-5", "evolution.rounds=3",
       "audit.canaries=400", "audit.empirical=quick"]


def test_honest_histograms_measure_below_the_accounted_epsilon():
    cfg = load_config(overrides=CFG)
    result = empirical.run_audit(cfg, n=5000, image_shape=[32, 32, 3], num_classes=10, mechanism_seed=1)
    (attack,) = result["attacks"]
    assert attack["name"] == "votes" and result["steps"] == 3 and result["sample_rate"] == 1.0
    assert result["accounted_epsilon"] <= 2.0
    assert 0.0 <= result["epsilon_lower"] <= result["accounted_epsilon"]
    assert result["ceiling"] > result["accounted_epsilon"]  # an audit this size could have failed: a real pass
    assert empirical.gate(result)["verdict"] == "passed"


def test_the_positive_control_a_histogram_with_little_noise_fails_the_audit(monkeypatch):
    """σ/50 on the bins, the plan's σ in the trace: the canaries' bins stand out, ε_lower > the accounted ε."""
    cfg = load_config(overrides=CFG)
    real = pe.noisy_votes
    monkeypatch.setattr(pe, "noisy_votes", lambda counts, *, noise_multiplier, randomness:
                        real(counts, noise_multiplier=noise_multiplier / 50, randomness=randomness))
    result = empirical.run_audit(cfg, n=5000, image_shape=[32, 32, 3], num_classes=10, mechanism_seed=1)
    assert result["epsilon_lower"] > result["accounted_epsilon"]
    assert empirical.gate(result)["verdict"] == "failed"


def test_a_query_of_larger_sensitivity_is_caught_too(monkeypatch):
    """A query in which every record's vote counts 4 times (sensitivity 4, accounted as 1) measures above the
    accounted ε."""
    cfg = load_config(overrides=[*CFG, "evolution.rounds=10"])
    real = pe.votes
    monkeypatch.setattr(pe, "votes", lambda *a, **k: 4 * real(*a, **k))
    result = empirical.run_audit(cfg, n=5000, image_shape=[32, 32, 3], num_classes=10, mechanism_seed=2)
    assert result["epsilon_lower"] > result["accounted_epsilon"]


@pytest.mark.parametrize("mode", ["auto"])
def test_auto_audits_private_evolution(mode):
    cfg = load_config(overrides=["train.method=private-evolution", f"audit.empirical={mode}"])
    assert empirical.mode_for(cfg) == "quick"
