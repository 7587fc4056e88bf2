"""One mechanism object per method (#35): its plans, refusals and statements are those of the per-method
privacy functions it replaced, for every shipped config and the variants beside them.

``data/mechanism_plans.json`` was written by ``data/capture_mechanism_plans.py`` from the old functions
(``plan_privacy`` / ``audit_plan`` / ``privacy_statement`` of each method module, through the registry's
``"module:attr"`` strings) before they were removed; it is not regenerated from the mechanisms. The warm-up's
sentences have since been rewritten to number each release as the trace's event, with its σ: for them the test
asks for the same releases in the same order."""

from __future__ import annotations

import json
import re
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
    expected = {k: before[k] for k in after}
    # the warm-up's sentences since name each release by its event number and σ (#32): the same releases in the
    # same order; everything else exactly: the same floats, the same words
    (after["statement"], named, numbers), (expected["statement"], named_before, _) = (
        without_warmup(x["statement"]) for x in (after, expected))
    assert named == named_before and numbers == list(range(len(named)))
    # every statement closes with what is public and what the settings were tuned on, in today's words (#52 added
    # the version history to what is public, #54 the records' arrival): compared as those constants (the golden
    # statements end with the older two), the rest word for word
    from dpsynth.privacy.statement import ARRIVAL, PUBLIC_FACTS, TUNING

    for x, closing_now in ((after, [ARRIVAL, PUBLIC_FACTS, TUNING]), (expected, None)):
        if x["statement"]:
            k = 2 if closing_now is None else len(closing_now)
            closing = x["statement"]["assumptions"][-k:]
            assert closing_now is None or closing == closing_now
            x["statement"] = {**x["statement"], "assumptions": x["statement"]["assumptions"][:-k]}
    assert after == expected
    assert mechanism.events(cfg, before["n"]) == plan.trace


WARMUP = " The private warm-up's"
NAMES = ("intensity histogram", "class-mean release", "polarity-shape release", "style release", "variation release")


def without_warmup(statement: dict | None) -> tuple[dict | None, list[str], list[int]]:
    """The statement with its noise text cut before the warm-up's sentences, the releases those name (in their
    order) and the event numbers they give them."""
    if not statement or WARMUP not in (statement.get("noise") or ""):
        return statement, [], []
    head, _, warm = statement["noise"].partition(WARMUP)
    named = [name for _, name in sorted((warm.index(name), name) for name in NAMES if name in warm)]
    return {**statement, "noise": head}, named, [int(i) for i in re.findall(r"#(\d+), the ", warm)]


def test_every_method_has_a_mechanism_and_each_mechanism_says_what_it_is():
    from dpsynth.mechanisms.mechanism import Mechanism

    for m in registry.METHODS.values():
        assert isinstance(m.mechanism, Mechanism)
        assert m.mechanism.sampling in ("poisson", "without_replacement", "full_batch") and m.mechanism.sampled
        assert m.mechanism.clipped in ("parameter_gradients", "input_gradients", "votes")
        # the empirical audit's white-box canaries sit where the mechanism clips (Private Evolution's: its votes,
        # each record's one vote being the query's sensitivity, nothing clipped)
        assert m.empirical_audit in (None, {"parameter_gradients": "gradient", "input_gradients": "input_gradient",
                                          "votes": "votes"}[m.mechanism.clipped])
    assert {m.mechanism.sampling for m in registry.METHODS.values()} == {"poisson", "without_replacement", "full_batch"}


def test_the_old_privacy_functions_are_gone_from_the_method_files():
    import importlib

    for module in ("dpgan", "gswgan", "dpac", "zhang", "gswgan_federated"):
        mod = importlib.import_module(f"dpsynth.methods.{module}")
        for name in ("plan_privacy", "audit_plan", "audit_invariants", "privacy_statement", "plan_federated_privacy"):
            assert not hasattr(mod, name), (module, name)
