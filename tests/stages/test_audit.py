"""dpsynth audit: ε recomputed from the trace alone by two accountants; any failed check fails the release."""

import hashlib
import json

import pytest
from opacus.accountants import RDPAccountant

from tests.stages.helpers import manifest, release_files, stage


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
    assert {c["name"] for c in report["checks"]} >= {"trace_sha256", "generator_sha256", "delta", "steps", "epsilon"}
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
    assert failed == {"epsilon"} and report["epsilon_upper_bound"] > 10
    assert stage("sample", trained, source) == 2
    assert "did not pass" in capsys.readouterr().err
    assert stage("evaluate", trained, source) == 2
    assert release_files(trained) == []


def test_each_failed_check_fails_the_audit(trained, source):
    def failed_checks():
        return {c["name"] for c in read(trained, "audit.json")["checks"] if not c["passed"]}

    assert stage("audit", trained, source, "privacy.delta=0.01") == 2  # δ must be < 1/n
    assert "delta" in failed_checks()
    rewrite_trace(trained, lambda t: t.update(steps=6) or t["events"][0].update(count=6), update_manifest=False)
    assert stage("audit", trained, source) == 2  # not the trace training recorded (and understating it)
    assert failed_checks() == {"trace_sha256"}
    assert release_files(trained) == []
