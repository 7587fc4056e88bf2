"""dpsynth audit: ε recomputed from the trace alone by two accountants; any failed check fails the release."""

import hashlib
import json
import re

import pytest
from opacus.accountants import RDPAccountant

from dpsynth import tracking
from dpsynth.config import load_config
from dpsynth.privacy import MechanismEvent, MechanismTrace
from dataclasses import replace

from dpsynth.methods import registry
from dpsynth.stages import audit
from tests.privacy.test_without_replacement import autodp_mechanism_epsilon
from tests.stages.helpers import manifest, release_files, stage, stages


def read(run, name):
    return json.loads((run / "sensitive" / "audit" / name).read_text())


def rewrite_trace(run, change, *, update_manifest: bool):
    """Edit the trace; with ``update_manifest``, also the train manifest's record of its sha256
    (a trainer whose own trace says it spent more than the budget)."""
    path = run / "sensitive" / "train" / "trace.json"
    trace = json.loads(path.read_text())
    change(trace)
    path.write_text(json.dumps(trace))
    if update_manifest:
        mpath = run / "sensitive" / "train" / "manifest.json"
        m = json.loads(mpath.read_text())
        next(o for o in m["outputs"] if o["role"] == "trace")["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        mpath.write_text(json.dumps(m))


def test_passes_with_both_accountants_recomputed_from_the_trace(trained, source):
    assert stage("audit", trained, source) == 0
    report, m = read(trained, "audit.json"), manifest(trained, "sensitive", "audit")
    assert report["decision"] == "passed" and m["status"] == "succeeded" and m["privacy"]["epsilon"] == 0
    (event,) = json.loads((trained / "sensitive" / "train" / "trace.json").read_text())["events"]
    ref = RDPAccountant()  # Opacus' own RDP accountant
    ref.history = [(event["noise_multiplier"], event["sample_rate"], event["count"])]
    assert report["epsilons"]["rdp"] == pytest.approx(ref.get_epsilon(1e-4), rel=1e-6)
    from prv_accountant import PoissonSubsampledGaussianMechanism, PRVAccountant  # Microsoft's, independent

    msr = PRVAccountant(prvs=[PoissonSubsampledGaussianMechanism(noise_multiplier=event["noise_multiplier"],
                                                                  sampling_probability=event["sample_rate"])],
                        max_self_compositions=[event["count"]], eps_error=0.01, delta_error=1e-7)
    _, est, up = msr.compute_epsilon(delta=1e-4, num_self_compositions=[event["count"]])
    assert report["epsilons"]["prv"]["upper"] == pytest.approx(up, abs=0.02)
    assert report["epsilon_upper_bound"] == max(report["epsilons"]["rdp"], report["epsilons"]["prv"]["upper"]) <= 10
    assert {c["name"] for c in report["checks"]} >= {"trace_sha256", "generator_sha256", "delta", "plan", "epsilon",
                                                     "noise", "sampling", "accounting", "claim", "mlflow"}
    assert report["claimed"]["accountant"] == "rdp" and report["claimed"]["epsilon"] == pytest.approx(
        ref.get_epsilon(1e-4), rel=1e-6)  # the trainer's claim agrees with the independent recomputation
    assert (trained / "sensitive" / "audit" / "audit.md").read_text().startswith("# Privacy audit: PASSED")
    assert release_files(trained) == []  # the audit itself releases nothing


def test_a_trace_over_the_target_fails_and_nothing_is_released(trained, source, capsys):
    def halve_the_noise(trace):
        trace["events"][0]["noise_multiplier"] /= 2

    rewrite_trace(trained, halve_the_noise, update_manifest=True)
    assert stage("audit", trained, source) == 2
    assert "audit failed" in capsys.readouterr().err
    report, m = read(trained, "audit.json"), manifest(trained, "sensitive", "audit")
    assert report["decision"] == "failed" and m["status"] == "failed"
    failed = {c["name"] for c in report["checks"] if not c["passed"]}
    # over the target, not the plan, and not the trace the generator file is bound to
    assert failed == {"epsilon", "claim", "plan", "generator_trace"} and report["epsilon_upper_bound"] > 10
    assert stage("sample", trained, source) == 2
    assert "did not pass" in capsys.readouterr().err
    assert stage("evaluate", trained, source) == 2
    assert release_files(trained) == []


def test_each_failed_check_fails_the_audit(trained, source, capsys):
    def failed_checks():
        return {c["name"] for c in read(trained, "audit.json")["checks"] if not c["passed"]}

    assert stage("audit", trained, source, "privacy.delta=0.01") == 2  # δ must be < 1/n
    assert "delta" in failed_checks()
    rewrite_trace(trained, lambda t: t.update(steps=6) or t["events"][0].update(count=6), update_manifest=False)
    capsys.readouterr()
    assert stage("audit", trained, source) == 2  # not the trace training recorded (and understating it)
    # and the trainer's ε, the plan and the generator's trace binding no longer match it
    assert failed_checks() == {"trace_sha256", "claim", "plan", "generator_trace"}
    err = capsys.readouterr().err  # the refusal names the files and the checks, never a hash (#52 item 3)
    assert "trace_sha256" in err and not re.search(r"[0-9a-f]{64}", err)
    assert release_files(trained) == []


def test_as_published_accounting_never_passes(trained, source):
    def failed_checks():
        return {c["name"] for c in read(trained, "audit.json")["checks"] if not c["passed"]}

    assert stage("audit", trained, source, "privacy.accounting=as_published") == 2
    assert failed_checks() == {"accounting"}
    rewrite_trace(trained, lambda t: t.update(accounting="as_published"), update_manifest=True)
    assert stage("audit", trained, source) == 2  # the trace itself says so
    assert failed_checks() == {"accounting", "generator_trace"}  # (and it is no longer the trace G was bound to)
    assert "never be released" in (trained / "sensitive" / "audit" / "audit.md").read_text()
    assert release_files(trained) == []


def test_noise_and_sampling_must_match_the_accountant(trained, source):
    def as_shards(trace):  # the same steps claimed as shard sampling under add/remove adjacency
        trace["events"][0].update(sampling="without_replacement")

    rewrite_trace(trained, as_shards, update_manifest=True)
    assert stage("audit", trained, source) == 2
    failed = {c["name"] for c in read(trained, "audit.json")["checks"] if not c["passed"]}
    assert {"sampling", "epsilon"} <= failed
    rewrite_trace(trained, lambda t: t["events"][0].update(sampling="poisson", noise_multiplier=0.0),
                  update_manifest=True)
    assert stage("audit", trained, source) == 2
    failed = {c["name"] for c in read(trained, "audit.json")["checks"] if not c["passed"]}
    assert {"noise", "epsilon"} <= failed


@pytest.fixture
def tracked(tmp_path, source):
    """partition, pretrain and train with MLflow on (metrics every 2 steps), under a pipeline parent run."""
    from dpsynth.runner.run import start

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = ("tracking.enabled=true", f"tracking.uri={uri}", "tracking.experiment=audit-test",
                 "output.log_every=2")
    run_dir = tmp_path / "run"
    cfg = load_config(overrides=[f"data.uri={source}", "train.d_width=4", "train.g_width=4", "train.latent_dim=8",
                                 "train.batch_size=32", "train.steps=12", "train.n_d=2", "privacy.epsilon=10",
                                 "privacy.delta=1e-4", "output.sample_every=0", "output.checkpoint_every=0",
                                 "ledger.population_id=mnist600", "data.num_classes=10", *overrides])
    ctx = start(cfg, run_dir=str(run_dir), pipeline_run_id="audit-mlflow")
    flags = ["--parent-run-id", ctx.parent_run_id, "--pipeline-run-id", "audit-mlflow"]
    for name in ("partition", "pretrain", "train"):
        assert stage(name, run_dir, source, *overrides, flags=flags) == 0, name
    return run_dir, uri, overrides, flags, ctx.parent_run_id


def test_a_logged_batch_size_series_fails_the_audit(tracked, source):
    from mlflow import MlflowClient

    run_dir, uri, overrides, flags, parent = tracked
    client = MlflowClient(uri)
    train_run = manifest(run_dir, "sensitive", "train")["mlflow_run_id"]
    logged = set(client.get_run(train_run).data.metrics)
    assert {"epsilon", "n_d", "d_accuracy_fake", "g_loss"} <= logged  # what DPGAN logs passes
    assert stage("audit", run_dir, source, *overrides, flags=flags) == 0
    (check,) = [c for c in read(run_dir, "audit.json")["checks"] if c["name"] == "mlflow"]
    assert check["passed"] and re.match(r"[4-9] MLflow runs", check["detail"]), check
    assert client.get_run(train_run).data.tags[tracking.TAG_AUDIT] == "passed"
    assert client.get_run(parent).data.tags[tracking.TAG_AUDIT] == "passed"
    assert client.get_run(train_run).data.tags[audit.TAG_ADJACENCY].startswith("add/remove one record")
    audit_run = manifest(run_dir, "sensitive", "audit")["mlflow_run_id"]
    assert {"audit.json", "audit.md"} <= {a.path for a in client.list_artifacts(audit_run)}

    for step, size in enumerate([29, 35, 31]):  # a trainer that leaks its actual Poisson batch sizes
        client.log_metric(train_run, "actual_batch_size", size, step=step)
    assert stage("audit", run_dir, source, *overrides, flags=["--force", *flags]) == 2
    report = read(run_dir, "audit.json")
    (check,) = [c for c in report["checks"] if c["name"] == "mlflow"]
    assert not check["passed"] and f"train run {train_run}: metric actual_batch_size" in check["detail"]
    assert {c["name"] for c in report["checks"] if not c["passed"]} == {"mlflow"}
    assert client.get_run(train_run).data.tags[tracking.TAG_AUDIT] == "failed"
    assert stage("sample", run_dir, source, *overrides, flags=flags) == 2
    assert release_files(run_dir) == []


def test_the_train_allow_list_of_dpgan():
    from dpsynth.stages.train import logged_keys

    keys = ["epsilon", "n_d", "d_accuracy_fake", "d_accuracy_fake_ema", "g_loss", "generator_steps", "noise_multiplier",
            "sample_rate", "epsilon_spent", "actual_batch_size", "shard_index", "per_example_norm", "grad_norm_mean",
            "d_loss_real"]
    assert logged_keys("dpgan").undeclared(metrics=keys) == [f"metric {k}" for k in sorted(keys[9:])]
    assert logged_keys("dpgan").undeclared(params=["train.batch_size", "partition.num_shards", "derived.batch_count"]) \
        == ["param derived.batch_count"]


def wor_trace(sigma, steps, q=0.01):
    return MechanismTrace([MechanismEvent(sampling="without_replacement", sample_rate=q, noise_multiplier=sigma,
                                          sensitivity="replace_one", count=steps)])


def test_without_replacement_traces_are_recomputed_with_the_wor_bound_only():
    cfg = load_config(overrides=["privacy.epsilon=4", "privacy.delta=1e-5", "train.steps=1000"])
    ok = [{"name": "integrity", "passed": True, "detail": ""}]
    report = audit.evaluate(cfg, trace_text=wor_trace(3.0, 1000).to_json(), n=60_000, integrity=ok)
    assert list(report["epsilons"]) == ["wor"] and "only the Wang–Balle–Kasiviswanathan" in report["accountants_note"]
    ref = autodp_mechanism_epsilon([(0.01, 3.0, 1000)], delta=1e-5)  # autodp, independent
    assert report["epsilons"]["wor"] == pytest.approx(ref, rel=1e-3) and ref < 4
    (eps_check,) = [c for c in report["checks"] if c["name"] == "epsilon"]
    assert eps_check["passed"]
    # DPGAN's plan is Poisson sampling, so this trace still fails for a DPGAN run
    failed = [c["name"] for c in report["checks"] if not c["passed"]]
    assert report["decision"] == "failed" and failed == ["plan"]
    # over the target by the independent reference: fails the epsilon check
    loud = audit.evaluate(cfg, trace_text=wor_trace(1.0, 1000).to_json(), n=60_000, integrity=ok)
    assert autodp_mechanism_epsilon([(0.01, 1.0, 1000)], delta=1e-5) > 4
    assert not next(c for c in loud["checks"] if c["name"] == "epsilon")["passed"]


def test_the_audit_asks_the_registered_mechanism_for_the_plan_and_the_statement(monkeypatch):
    from dpsynth.errors import PrivacyError
    from dpsynth.mechanisms.discriminator import DPGAN, DiscriminatorDPSGD
    from dpsynth.privacy.plan import PrivacyPlan

    cfg = load_config(overrides=["privacy.epsilon=4", "privacy.delta=1e-5", "train.steps=1000"])
    calls = []

    class Recording(DiscriminatorDPSGD):
        def plan(self, cfg, n):
            calls.append(n)
            (event,) = wor_trace(3.0, 1000).events
            return PrivacyPlan(event=event.with_count(1), steps=1000, guard=None, noise_multiplier=3.0)

        def statement(self, cfg, plan, n):
            return {"adjacency": "recorded", "noise": "recorded", "assumptions": [], "accounts": [], "unprotected": None}

    recording = Recording(**{f: getattr(DPGAN, f) for f in ("sampled", "sampling", "clipped", "fold", "noise")})
    monkeypatch.setitem(registry.METHODS, "dpgan", replace(registry.METHODS["dpgan"], mechanism=recording))
    report = audit.evaluate(cfg, trace_text=wor_trace(3.0, 1000).to_json(), n=60_000, integrity=[])
    assert calls == [60_000] and report["statement"]["adjacency"] == "recorded"
    assert [c["name"] for c in report["checks"] if not c["passed"]] == []  # the trace is that mechanism's plan

    class Refusing(Recording):
        def plan(self, cfg, n):
            raise PrivacyError("privacy.epsilon: no plan")

    refusing = Refusing(**{f: getattr(DPGAN, f) for f in ("sampled", "sampling", "clipped", "fold", "noise")})
    monkeypatch.setitem(registry.METHODS, "dpgan", replace(registry.METHODS["dpgan"], mechanism=refusing))
    report = audit.evaluate(cfg, trace_text=wor_trace(3.0, 1000).to_json(), n=60_000, integrity=[])
    (check,) = [c for c in report["checks"] if c["name"] == "plan"]
    assert not check["passed"] and "privacy.epsilon: no plan" in check["detail"] and report["decision"] == "failed"
