"""One mechanism object per method (#35): its plans, refusals and statements are those of the per-method
privacy functions it replaced, for every shipped config and the variants beside them.

``data/mechanism_plans.json`` was written by ``data/capture_mechanism_plans.py`` from the old functions
(``plan_privacy`` / ``audit_plan`` / ``privacy_statement`` of each method module, through the registry's
``"module:attr"`` strings) before they were removed; it is not regenerated from the mechanisms. The warm-up's
sentences have since been rewritten to number each release as the trace's event, with its σ: for them the test
asks for the same releases in the same order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpsynth.config import load_config
from dpsynth.methods import registry

REPO = Path(__file__).resolve().parents[2]
BEFORE = json.loads((Path(__file__).parent / "data" / "mechanism_plans.json").read_text())


def as_dict(event):
    return None if event is None else event.to_dict()


@pytest.mark.parametrize("case", sorted(BEFORE))
def test_the_mechanism_plans_and_states_what_the_old_functions_did(case):
    before = BEFORE[case]
    cfg = load_config(REPO / before["config"], overrides=before["overrides"])
    mechanism = registry.get(cfg.train.method).mechanism
    if "error" in before:
        with pytest.raises(Exception) as refused:
            mechanism.plan(cfg, before["n"])
        # the same refusal, naming the same setting (DPGAN's and dp-GAN's one plan now end their refusal alike)
        assert f"{type(refused.value).__name__}: {refused.value}".split("; raise")[0] == before["error"].split("; raise")[0]
        return
    plan = mechanism.plan(cfg, before["n"])
    after = {"trace": plan.trace.to_dict(), "steps": plan.steps, "noise_multiplier": plan.noise_multiplier,
             "releases": plan.releases, "published_event": as_dict(plan.published_event),
             "published_epsilon": plan.published_epsilon, "guard_event": as_dict(plan.guard.event) if plan.guard else None,
             "prefix": [as_dict(e) for e in plan.prefix], "statement": mechanism.statement(cfg, plan, before["n"])}
    after = json.loads(json.dumps(after, sort_keys=True, ensure_ascii=False))
    before = {k: before[k] for k in after}
    # the warm-up's sentences since name each release by its event number and σ (#32): the same releases in the
    # same order; everything else exactly: the same floats, the same words
    warm_after, warm_before = (warmup_sentences(x["statement"]) for x in (after, before))
    assert [name for _, name in warm_after] == [name for _, name in warm_before]
    assert [i for i, _ in warm_after] == list(range(len(warm_after)))
    assert after == before


WARMUP = " The private warm-up's"
NAMES = ("intensity histogram", "class-mean release", "polarity-shape release", "style release", "variation release")


def warmup_sentences(statement: dict) -> list[tuple[int | None, str]]:
    """Cut the warm-up's part off the statement's noise text (in place); returns (event number or None, release name)
    of each release it names, in its order."""
    noise = statement.get("noise") if isinstance(statement, dict) else None
    if not noise or WARMUP not in noise:
        return []
    statement["noise"], warm = noise.split(WARMUP, 1)
    found = sorted((warm.index(name), name) for name in NAMES if name in warm)
    numbered = {name: int(warm[:at].rsplit("#", 1)[1].split(",")[0]) if "#" in warm[:at] else None for at, name in found}
    return [(numbered[name], name) for _, name in found]
    assert mechanism.events(cfg, before["n"]) == plan.trace


def test_every_method_has_a_mechanism_and_each_mechanism_says_what_it_is():
    from dpsynth.mechanisms.mechanism import Mechanism

    for m in registry.METHODS.values():
        assert isinstance(m.mechanism, Mechanism)
        assert m.mechanism.sampling in ("poisson", "without_replacement") and m.mechanism.sampled
        assert m.mechanism.clipped in ("parameter_gradients", "input_gradients")
        # the empirical audit's white-box canaries sit where the mechanism clips
        assert m.empirical_audit in ("", {"parameter_gradients": "gradient", "input_gradients": "input_gradient"}[
            m.mechanism.clipped])


def test_the_old_privacy_functions_are_gone_from_the_method_files():
    import importlib

    for module in ("dpgan", "gswgan", "dpac", "zhang", "gswgan_federated"):
        mod = importlib.import_module(f"dpsynth.methods.{module}")
        for name in ("plan_privacy", "audit_plan", "audit_invariants", "privacy_statement", "plan_federated_privacy"):
            assert not hasattr(mod, name), (module, name)
