"""The stricter audit: the trace must be the recomputed plan, the generator bound to its trace, PRV
time-limited with an RDP fallback, and every audit states its adjacency and σ convention."""

import hashlib
import json
import math

import pytest
from opacus.accountants import RDPAccountant as OpacusRDP
from scipy.stats import binom

from dpsynth.config import load_config
from dpsynth.training import artifacts
from dpsynth.methods import registry
from dpsynth.privacy import MechanismEvent, MechanismTrace
from dpsynth.privacy.accountants import prv_bounds_or_rdp
from dpsynth.stages import audit
from tests.stages.helpers import manifest, release_files, stage

N = 60_000
OK = [{"name": "integrity", "passed": True, "detail": ""}]
METHOD_SETTINGS = {  # small, fast plans for every registered method
    "dpgan": ["train.batch_size=600", "train.steps=200"],
    "zhang": ["train.batch_size=600", "train.steps=200", "zhang.grouping=global", "zhang.adaptive_clipping=false"],
    "gswgan": ["partition.num_shards=100", "train.steps=200", "gswgan.batch_size=8"],
    "dpac": ["partition.num_shards=100", "train.steps=200", "gswgan.batch_size=8"],
    "gswgan_federated": ["partition.num_shards=100", "train.steps=200", "gswgan.batch_size=8", "train.n_d=2"],
    "private-evolution": ["warmup.central_images=false", "evolution.rounds=4", "evolution.candidates=20"],
}


def config(method, *extra):
    return load_config(overrides=[f"train.method={method}", "privacy.epsilon=4", "privacy.delta=1e-6",
                                  *METHOD_SETTINGS[method], *extra])


def planned(cfg):
    return registry.get(cfg.train.method).mechanism.plan(cfg, N).trace


def failed(report):
    return {c["name"] for c in report["checks"] if not c["passed"]}


@pytest.mark.parametrize("method", ["dpgan", "gswgan"])
@pytest.mark.parametrize("tamper", ["steps", "sigma", "rate"])
def test_a_trace_that_is_not_the_recomputed_plan_is_refused(method, tamper):
    cfg = config(method)
    trace = planned(cfg)
    report = audit.evaluate(cfg, trace_text=trace.to_json(), n=N, integrity=OK, prv_time_limit_s=60)
    assert "plan" not in failed(report), report["checks"]
    (event,) = trace.events  # calibrated σ, recomputed by the audit; tamper in the direction that hides ε
    changed = {"steps": event.with_count(event.count - 1),
               "sigma": event.with_noise(event.noise_multiplier * 1.01),
               "rate": MechanismEvent(event.sampling, event.sample_rate * 0.99, event.noise_multiplier,
                                      event.sensitivity, event.count)}[tamper]
    report = audit.evaluate(cfg, trace_text=MechanismTrace([changed]).to_json(), n=N, integrity=OK,
                            prv_time_limit_s=60)
    assert "plan" in failed(report) and report["decision"] == "failed"
    # each tampered trace *understates* ε, so only the plan check can catch it
    assert "epsilon" not in failed(report)


def test_the_warmup_release_must_open_dpgans_trace():
    cfg = config("dpgan", "warmup.central_images=true", "warmup.noise_multiplier=20")
    trace = planned(cfg)
    assert len(trace.events) == 2 and trace.events[0].sampling == "full_batch"
    without = MechanismTrace(trace.events[1:])
    report = audit.evaluate(cfg, trace_text=without.to_json(), n=N, integrity=OK, prv_time_limit_s=60)
    assert "plan" in failed(report) and report["decision"] == "failed"


def test_a_generator_bound_to_another_trace_is_refused(tmp_path, trained, source, capsys):
    """The generator file carries its trace's sha256 and steps; the audit refuses a mismatch even
    when the train manifest was updated to the swapped file's sha256."""
    gen = trained / "sensitive" / "train" / "generator.pt"
    state = __import__("torch").load(gen, weights_only=True)
    other = MechanismTrace([MechanismEvent("poisson", 0.05, 1.0, "add_remove", count=3)])
    gen.write_bytes(artifacts.generator_bytes(state["state_dict"], model=state["model"],
                                              privacy=state["privacy"], trace=other))
    mpath = trained / "sensitive" / "train" / "manifest.json"
    m = json.loads(mpath.read_text())
    next(o for o in m["outputs"] if o["role"] == "generator")["sha256"] = hashlib.sha256(gen.read_bytes()).hexdigest()
    mpath.write_text(json.dumps(m))
    assert stage("audit", trained, source) == 2
    report = json.loads((trained / "sensitive" / "audit" / "audit.json").read_text())
    assert failed(report) == {"generator_trace"}
    assert stage("sample", trained, source) == 2 and release_files(trained) == []


def test_an_audited_generator_is_bound_to_its_trace(trained, source):
    assert stage("audit", trained, source) == 0
    trace_bytes = (trained / "sensitive" / "train" / "trace.json").read_bytes()
    record = artifacts.generator_privacy(str(trained / "sensitive" / "train" / "generator.pt"))
    assert record["trace_sha256"] == hashlib.sha256(trace_bytes).hexdigest()
    assert record["trace_steps"] == sum(e["count"] for e in json.loads(trace_bytes)["events"])
    assert stage("sample", trained, source) == 0
    release = manifest(trained, "release", "sample")["details"]["release"]
    assert release["statement"]["adjacency"].startswith("add/remove one record")


def test_prv_past_its_time_limit_falls_back_to_rdp_an_upper_bound():
    trace = MechanismTrace([MechanismEvent("poisson", 0.01, 1.1, "add_remove", count=500)])
    prv = prv_bounds_or_rdp(trace, delta=1e-5, time_limit_s=60)
    assert "fallback" not in prv
    fallback = prv_bounds_or_rdp(trace, delta=1e-5, time_limit_s=0)
    assert fallback["fallback"] == "rdp" and "within 0 s" in fallback["reason"]
    ref = OpacusRDP()  # Opacus' own RDP accountant, independent of dpsynth's curves
    ref.history = [(1.1, 0.01, 500)]
    assert fallback["upper"] == pytest.approx(ref.get_epsilon(1e-5), rel=1e-6)
    assert fallback["upper"] >= prv["upper"]  # the fallback states more ε, never less
    cfg = config("dpgan")
    report = audit.evaluate(cfg, trace_text=planned(cfg).to_json(), n=N, integrity=OK, prv_time_limit_s=0,
                            claimed={"accountant": "prv", "epsilon": 3.9})
    assert report["epsilons"]["prv"]["fallback"] == "rdp" and report["decision"] == "passed", report["checks"]
    assert "RDP fallback" in audit.markdown({**report, "generator": {"sha256": "x"}, "claimed": {}})


@pytest.mark.parametrize("method", sorted(registry.METHODS))
def test_every_audit_names_its_adjacency_and_noise_convention(method):
    cfg = config(method)
    report = audit.evaluate(cfg, trace_text=planned(cfg).to_json(), n=N, integrity=OK, prv_time_limit_s=60)
    assert report["decision"] == "passed", report["checks"]
    md = audit.markdown({**report, "generator": {"sha256": "x"}, "claimed": {}})
    assert "**Adjacency.** add/remove one record" in md and "**Noise (σ convention).** σ·" in md
    if registry.get(method).pretrain == "shard":  # GS-WGAN family: rate 1/K, not replace-one at 1/K
        assert "rate 1/K = 0.01" in md and "two clients (rate 2/K)" in md or "two shards (rate 2/K)" in md
        assert "shard-state assumption" in md


def test_an_acknowledged_sensitive_slice_is_stated_unprotected():
    cfg = config("zhang", "data.public_fraction=0.02", "data.public_fraction_unprotected=true")
    report = audit.evaluate(cfg, trace_text=planned(cfg).to_json(), n=N, integrity=OK, prv_time_limit_s=60)
    md = audit.markdown({**report, "generator": {"sha256": "x"}, "claimed": {}})
    assert "**UNPROTECTED RECORDS.** data.public_fraction = 0.02" in md and "these records are unprotected" in md
    assert audit.statement_tags(report["statement"])[audit.TAG_UNPROTECTED].endswith("(ε, δ).")
    separate = config("zhang", "data.public_source=sklearn:digits")
    report = audit.evaluate(separate, trace_text=planned(separate).to_json(), n=N, integrity=OK, prv_time_limit_s=60)
    assert report["statement"]["unprotected"] is None and "sklearn:digits" in report["statement"]["assumptions"][0]


@pytest.mark.parametrize("method", ["gswgan", "gswgan_federated"])
def test_the_account_with_the_shard_choice_revealed(method):
    """Beside the amplified ε: the record's shard is drawn ≤ m* times (binomial tail δ/2), each a Gaussian
    release of sensitivity 2C; checked against Opacus' RDP of m* full-batch releases at δ/2."""
    cfg = config(method)
    plan = registry.get(method).mechanism.plan(cfg, N)
    report = audit.evaluate(cfg, trace_text=plan.trace.to_json(), n=N, integrity=OK)
    (account,) = report["statement"]["accounts"]
    m = account["iterations_bound"]
    assert binom.sf(m, plan.steps, 0.01) <= 0.5e-6 < binom.sf(m - 1, plan.steps, 0.01)
    ref = OpacusRDP()
    ref.history = [(plan.event.noise_multiplier / 2, 1.0, m)]
    assert account["epsilon"] == pytest.approx(ref.get_epsilon(0.5e-6), rel=1e-6)
    assert account["epsilon"] > report["epsilon_upper_bound"]  # no amplification: more ε
    if method == "gswgan_federated":
        assert account["against"].startswith("the server")
