"""One privacy plan per mechanism: frozen, and its event is the plan's σ folded over its releases."""

import dataclasses
import math

import pytest

from dpsynth.config import load_config
from dpsynth.privacy import MechanismEvent
from dpsynth.privacy.plan import PrivacyPlan


def event(sigma):
    return MechanismEvent(sampling="without_replacement", sample_rate=0.01, noise_multiplier=sigma,
                          sensitivity="replace_one")


def test_the_event_folds_the_releases_and_the_plan_is_frozen():
    plan = PrivacyPlan(event=event(2.0), steps=10, guard=None, noise_multiplier=8.0, releases=16)  # 8/√16 = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.steps = 11
    with pytest.raises(ValueError, match="releases"):
        PrivacyPlan(event=event(2.0), steps=10, guard=None, noise_multiplier=8.0, releases=4)  # 8/√4 = 4 ≠ 2


@pytest.mark.parametrize("method", ["dpgan", "gswgan", "zhang"])
def test_every_method_plans_with_the_one_plan(method):
    from dpsynth.methods import registry

    cfg = load_config(overrides=[f"train.method={method}", "privacy.noise_multiplier=4.0", "train.steps=10",
                                 "privacy.epsilon=1000", "privacy.delta=1e-5", "gswgan.batch_size=16",
                                 "zhang.grouping=weight_bias", "partition.num_shards=100"])
    plan = registry.get(method).mechanism.plan(cfg, 60_000)
    assert isinstance(plan, PrivacyPlan) and plan.steps == 10 and plan.noise_multiplier == 4.0
    releases = {"dpgan": 1, "gswgan": 16, "zhang": 2}[method]
    assert plan.releases == releases and plan.event.noise_multiplier == pytest.approx(4.0 / math.sqrt(releases))
