"""Batch selection is the mechanism's (``Mechanism.select``): select → sanitize → event, one path through it. Each
method's mechanism draws its batch from the secret coins by its sampling scheme, and no trainer draws one itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from dpsynth.distributed import ranks as distributed
from dpsynth.mechanisms.randomness import MechanismRandomness
from dpsynth.methods import registry
from dpsynth.privacy.events import MechanismEvent
from dpsynth.privacy.plan import PrivacyPlan

REPO = Path(__file__).resolve().parents[2]


def plan(sampling: str, rate: float) -> PrivacyPlan:
    return PrivacyPlan(MechanismEvent(sampling=sampling, sample_rate=rate, noise_multiplier=1.0, sensitivity="add_remove"), steps=1, guard=None,
                       noise_multiplier=1.0)


@pytest.mark.parametrize("name", list(registry.METHODS))
def test_each_mechanism_selects_by_its_sampling_scheme_from_the_secret_coins(name):
    mechanism = registry.get(name).mechanism
    drawn, expected = MechanismRandomness(seed=3), MechanismRandomness(seed=3)
    if mechanism.sampling == "poisson":  # each record at rate q: the coins' mask, in one process or one rank of one
        got = mechanism.select(plan("poisson", 0.3), drawn, 100)
        assert torch.equal(got, expected.poisson_mask(100, 0.3))
        assert torch.equal(mechanism.select(plan("poisson", 0.3), drawn, 100, ranks=distributed.SINGLE),
                           expected.poisson_mask(100, 0.3))
    elif mechanism.sampling == "without_replacement":  # one shard (client) of K, uniformly
        assert [mechanism.select(plan("without_replacement", 0.2), drawn, 5) for _ in range(20)] == \
            [expected.choice(5) for _ in range(20)]
        assert mechanism.select(plan("without_replacement", 0.2), drawn, 5, ranks=distributed.SINGLE) == \
            expected.choice(5)
    else:  # full batch: every record, no coin drawn
        assert mechanism.sampling == "full_batch"
        assert mechanism.select(plan("full_batch", 1.0), drawn, 7) == slice(None)
        assert torch.equal(drawn.standard_normal((3,)), expected.standard_normal((3,)))


def test_no_method_draws_its_batch_itself():
    """The Poisson mask, the shard and the client are drawn only through ``Mechanism.select``: no file under
    methods/ calls the coins' ``poisson_mask`` / ``choice`` or the ranks' ``poisson_take`` (training/ neither)."""
    drawing = {"poisson_mask", "choice", "poisson_take"}
    offenders = []
    for folder in ("methods", "training"):
        for path in sorted((REPO / "components" / "dpsynth" / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in drawing:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.func.attr}")
    assert offenders == []
