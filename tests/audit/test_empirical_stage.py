"""The audit stage's empirical step (audit.empirical): ε_lower beside the accounted ε in the report, the
gate in the decision, and ``dpsynth audit empirical`` on its own."""

import json

import pytest
import torch

from dpsynth.mechanisms.randomness import MechanismRandomness
# the stage tests' fixtures, as in tests/stages (autouse there and here: ledger_with_budget, one_torch_thread)
from tests.stages.conftest import ledger_with_budget, one_torch_thread  # noqa: F401 (autouse fixtures)
from tests.stages.helpers import TINY, dpsynth, manifest, pristine_run, release_files, settings, stage, stages

# ε = 0.5 over 50 steps: low enough that a sanitizer without noise is caught with 1,000 canaries (ε_lower ≈ 2.2 against
# the 1.25 asked below; tests/audit/test_empirical.py's tiny() measures the same run)
AUDITED = ("privacy.epsilon=0.5", "train.steps=50", "audit.empirical=full", "audit.canaries=1000")


@pytest.fixture(scope="module")
def trained_at_half_once(tmp_path_factory, source):
    return pristine_run(tmp_path_factory, source, "partition", "pretrain", "train", overrides=AUDITED)


@pytest.fixture
def trained_at_half(trained_at_half_once):
    """A run trained at ε = 0.5 over 50 steps, the test's to change (a fresh copy of one module-wide run)."""
    return trained_at_half_once()


def report(run_dir):
    return json.loads((run_dir / "sensitive" / "audit" / "audit.json").read_text())


def test_the_audit_reports_epsilon_lower_and_passes(trained_at_half, source):
    assert stage("audit", trained_at_half, source, *AUDITED) == 0
    r = report(trained_at_half)
    e = r["empirical"]  # {verdict, epsilon_lower, canaries, confidence, mode, components: [{name, verdict, ...}]}
    (t,) = e["components"]  # the training steps (no warm-up here)
    assert r["decision"] == "passed" and e["canaries"] == 1000 and e["confidence"] == 0.95 and t["steps"] == 50
    assert e["verdict"] == t["verdict"] and e["verdict"] in ("passed", "inconclusive") and t["name"] == "training"
    assert e["epsilon_lower"] == t["epsilon_lower"] <= t["accounted_epsilon"] <= r["epsilon_upper_bound"] <= 0.5
    assert "public stand-in" in t["privacy_cost"] and [a["name"] for a in t["attacks"]] == ["gradient", "discriminator"]
    (check,) = [c for c in r["checks"] if c["name"] == "empirical"]
    assert check["verdict"] == e["verdict"] and check["passed"] is {"passed": True, "inconclusive": None}[e["verdict"]]
    md = (trained_at_half / "sensitive" / "audit" / "audit.md").read_text()
    assert "## Empirical audit" in md and "ε_lower" in md and "What makes them comparable" in md
    assert "| discriminator |" in md  # the black-box attack's row beside the white-box one
    assert manifest(trained_at_half, "sensitive", "audit")["details"]["epsilon_lower"] == e["epsilon_lower"]


def test_a_sanitizer_without_noise_fails_the_release(trained_at_half, source, monkeypatch, capsys):
    monkeypatch.setattr(MechanismRandomness, "standard_normal",
                        lambda self, shape, dtype=None: torch.zeros(shape, dtype=dtype))
    assert stage("audit", trained_at_half, source, *AUDITED) == 2
    assert "does not implement the accounted mechanism" in capsys.readouterr().err
    r = report(trained_at_half)
    assert r["decision"] == "failed" and {c["name"] for c in r["checks"] if not c["passed"]} == {"empirical"}
    assert r["empirical"]["verdict"] == "failed"
    assert r["empirical"]["epsilon_lower"] > 2.5 * r["empirical"]["components"][0]["accounted_epsilon"]
    assert stage("sample", trained_at_half, source, *AUDITED) == 2
    assert release_files(trained_at_half) == []


def test_on_by_default_and_off_when_asked(trained_at_half, source):
    """#33: a quick audit in every default run, its verdict in audit.json, audit.md and the manifest."""
    items = (f"data.uri={source}", *(t for t in TINY if not t.startswith("audit.")), "privacy.epsilon=0.5",
             "train.steps=50")  # the tiny settings without their audit.empirical=off: the default
    assert dpsynth("audit", "--run-dir", trained_at_half, *(a for item in items for a in ("--set", item))) == 0
    e = report(trained_at_half)["empirical"]
    assert e["mode"] == "quick" and e["verdict"] in ("passed", "inconclusive") and e["canaries"] == 1000
    assert manifest(trained_at_half, "sensitive", "audit")["details"]["empirical"] == e["verdict"]
    md = (trained_at_half / "sensitive" / "audit" / "audit.md").read_text()
    assert f"Verdict: **{e['verdict'].upper()}**" in md
    assert stage("audit", trained_at_half, source, "privacy.epsilon=0.5", "train.steps=50", "audit.empirical=off",
                 flags=["--force"]) == 0
    assert report(trained_at_half)["empirical"] is None
    assert manifest(trained_at_half, "sensitive", "audit")["details"]["empirical"] == "not run"


def test_the_command(trained_at_half, source, capsys):
    assert dpsynth("audit", "empirical", "--run-dir", trained_at_half, *settings(source, *AUDITED), "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] in ("passed", "inconclusive") and out["canaries"] == 1000 and out["mode"] == "full"
    assert out["components"][0]["check"]["verdict"] == out["verdict"]
    # without a run directory: the shape by hand; bad input names the option
    assert dpsynth("audit", "empirical", "--records", "600", "--image-shape", "28x28", "--num-classes", "10",
                   *settings(source, *AUDITED)) == 2
    assert "--image-shape" in capsys.readouterr().err


def test_the_command_audits_gswgan_by_its_own_accountant(source, capsys):
    """GS-WGAN's input-gradient canaries, without a run directory: both attacks, the wor accountant."""
    gswgan = ("train.method=gswgan", "partition.num_shards=5", "gswgan.batch_size=8", "gswgan.d_width=4",
              "gswgan.g_width=4", "train.n_d=1", "train.steps=40", "privacy.epsilon=1", "audit.empirical=quick",
              "audit.quick_steps=20", "audit.canaries=500")
    assert dpsynth("audit", "empirical", "--records", "600", "--image-shape", "28x28x1", "--num-classes", "10",
                   *settings(source, *gswgan)) == 0
    out = capsys.readouterr().out
    assert "input_gradient: ε_lower" in out and "generator: ε_lower" in out and "(wor)" in out and "passed" in out


def test_tracked_the_figures_reach_mlflow_the_release_and_the_ledger_page(tmp_path, source, capsys, ledger_with_budget):
    from mlflow import MlflowClient

    from dpsynth import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # 20 steps, not AUDITED's 50: this test follows the figures, not the canaries' power (the tests above)
    tracked = (*AUDITED, "train.steps=20", "tracking.enabled=true", f"tracking.uri={uri}",
               "tracking.experiment=empirical")
    run_dir = tmp_path / "run"
    assert dpsynth("pipeline", "start", "--run-dir", run_dir, "--pipeline-run-id", "emp", *settings(source, *tracked)) == 0
    parent = json.loads(capsys.readouterr().out)["parent_run_id"]
    ids = ["--run-dir", run_dir, "--parent-run-id", parent, "--pipeline-run-id", "emp"]
    for name in ("partition", "pretrain", "train", "audit", "sample"):
        assert dpsynth(name, *ids, *settings(source, *tracked)) == 0, name
    r = report(run_dir)
    lower = r["empirical"]["epsilon_lower"]
    client = MlflowClient(uri)
    audit_run = client.get_run(manifest(run_dir, "sensitive", "audit")["mlflow_run_id"])
    assert audit_run.data.metrics["epsilon_lower_empirical"] == pytest.approx(lower)
    assert audit_run.data.metrics["epsilon_accounted_empirical"] == pytest.approx(
        r["empirical"]["components"][0]["accounted_epsilon"])
    assert {c["name"]: c["passed"] for c in r["checks"]}["mlflow"]  # the new metrics are on the allow-list
    sample_run = client.get_run(manifest(run_dir, "release", "sample")["mlflow_run_id"])
    for run in (client.get_run(parent), audit_run, sample_run):
        assert float(run.data.tags[tracking.TAG_EPSILON_LOWER]) == pytest.approx(lower, abs=1e-3)
        assert "m=1000, 95% confidence" in run.data.tags[tracking.TAG_EMPIRICAL_AUDIT]
        assert run.data.tags[tracking.TAG_EMPIRICAL_VERDICT] == r["empirical"]["verdict"]
    assert manifest(run_dir, "release", "sample")["details"]["release"]["epsilon_lower"] == lower

    ledger_view = pytest.importorskip("dpsynth_mlflow.ledger_view")  # pip install --no-deps -e mlflow_plugins
    row = ledger_view._run(ledger_with_budget.reservations(pipeline_run_id="emp"),
                           ledger_view._mlflow_part(client, client.get_run(parent)), {})
    assert float(row["mlflow"]["epsilon_lower"]) == pytest.approx(lower, abs=1e-3)
    page = ledger_view.render({"populations": [{"population_id": "p", "budget": 10, "committed": 1, "reserved": 0,
                                                "remaining": 9, "delta": 1e-3, "delta_used": 1e-4, "runs": [row]}]})
    assert f"<td data-field='epsilon-lower' title='m=1000, 95% confidence" in page
