"""dpsynth evaluate: utility, quality and membership inference of the released generator, with
the report (JSON, HTML) in the release zone and the reference-data policy applied."""

import io
import json
from pathlib import Path
import shutil

import numpy as np
import pytest
import torch

from dpsynth.data import read_parquet, write_parquet
from tests.stages.helpers import manifest, stage, stages

FAST = ("evaluate.epochs=1", "evaluate.feature_steps=5", "evaluate.mia_generated=200")


@pytest.fixture(scope="module")
def released(tmp_path_factory, source):
    from dpsynth.ledger.store import Ledger

    home = tmp_path_factory.mktemp("evaluate")
    run = home / "run"
    url = f"sqlite:///{home / 'ledger.db'}"  # module-scoped: set up before conftest's per-test ledger
    Ledger(url).set_budget("mnist600", epsilon=100.0, delta=1e-3, reason="tests/stages/test_evaluate.py")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPSYNTH_LEDGER_URL", url)
        stages(run, source, "partition", "pretrain", "train", "audit", "sample")
    return run


def report_of(run) -> dict:
    return json.loads((run / "release" / "evaluate" / "report.json").read_text())


@pytest.mark.parametrize("classifier", ["logreg", "cnn"])
def test_accuracy_on_heldout_records(released, source, classifier):
    assert stage("evaluate", released, source, f"evaluate.classifier={classifier}", *FAST) == 0
    m = manifest(released, "release", "evaluate")
    report = report_of(released)
    heldout = next(o for o in manifest(released, "sensitive", "partition")["outputs"] if o["role"] == "heldout")
    roles = [i["role"] for i in m["inputs"]]
    assert roles[:8] == ["sample_manifest", "partition_manifest", "audit_manifest", "train_manifest", "synthetic",
                         "heldout", "generator", "report"] and set(roles[8:]) == {"shard"}
    assert [o["role"] for o in m["outputs"]] == ["report", "report_html"]
    assert {o["zone"] for o in m["outputs"]} == {"release"} and m["privacy"]["epsilon"] == 0
    acc = report["classifier_accuracy"]
    assert acc["classifier"] == classifier and 0 <= acc["accuracy"] <= 1
    # the reference (held-out) records split into a real training half and a test half
    split = report["reference"]["split"]
    assert split["fit"] + split["test"] == heldout["rows"] == report["reference"]["records"]
    assert report["test"]["records"] == split["test"]
    assert report["train"]["records"] == 180  # 200 synthetic minus 10% held out for model selection
    test_ids = set(read_parquet(heldout["uri"]).record_ids)
    assert len(test_ids) == heldout["rows"]
    rows = report["utility"]["classifiers"]  # the headline classifier first, then the quick extra (logreg)
    assert [r["classifier"] for r in rows] == list(dict.fromkeys([classifier, "logreg"]))
    row = rows[0]
    assert row["gen2real"] == acc["accuracy"] and row["calibrated"] == pytest.approx(row["gen2real"] / row["real"])
    assert "no model selection" in report["heldout_data"]
    assert report["labels"] == {"utility": "releasable", "quality": "releasable", "membership_inference": "internal"}
    assert report["privacy"]["audit"] == "passed" and report["privacy"]["epsilon"] <= 10 * (1 + 1e-9)
    if classifier == "cnn":
        assert row["model_selection"]["selection"] == "best epoch on held-out generated data"


def operator_of(run) -> dict:
    return json.loads((run / "sensitive" / "evaluate" / "operator.json").read_text())


def test_per_class_accuracies_stay_with_the_operator(released, source):
    """No per-class figure is released (a null there says which class has no held-out record, #52): the per-class
    accuracies are in the operator's report in the sensitive zone, and they add up to the released accuracy."""
    assert stage("evaluate", released, source, *FAST) == 0
    report = report_of(released)
    released_text = "".join(p.read_text() for p in (released / "release" / "evaluate").glob("*.*"))
    assert "per_class" not in released_text
    assert report["operator"]["status"] == "internal"
    assert Path(report["operator"]["kept_in"]) == released / "sensitive" / "evaluate" / "operator.json"
    # recover the test half's labels: every reference record is in the fit half or the test half
    heldout = next(o for o in manifest(released, "sensitive", "partition")["outputs"] if o["role"] == "heldout")
    labels = read_parquet(heldout["uri"]).labels
    order = np.random.default_rng(0).permutation(len(labels))
    test_labels = labels[order[int(np.ceil(len(labels) / 2)):]]
    counts = np.bincount(test_labels, minlength=10)
    per_class = operator_of(released)["gen2real_per_class"]["cnn"]
    weighted = sum(a * c for a, c in zip(per_class, counts) if a is not None) / counts.sum()
    assert weighted == pytest.approx(report["classifier_accuracy"]["accuracy"])


def test_the_released_report_passes_the_gate(released, source, monkeypatch):
    """report.json and report.html in the release zone are the gate's view (egress.EVALUATION), as MLflow's copy is:
    a field the allow-list does not name is not written there (it was, before: only MLflow's copy was gated)."""
    from dpsynth.stages import evaluate

    real = evaluate.evaluate
    monkeypatch.setattr(evaluate, "evaluate", lambda *a, **k: {**real(*a, **k), "planted_record_count": 123457})
    assert stage("evaluate", released, source, *FAST, "evaluate.classifier=logreg", flags=["--force"]) == 0
    released_text = "".join(p.read_text() for p in (released / "release" / "evaluate").glob("*.*"))
    assert "planted_record_count" not in released_text and "123457" not in released_text
    assert report_of(released)["classifier_accuracy"]["classifier"] == "logreg"


def test_the_ceiling_is_trained_on_the_training_records(released, source):
    """The operator's ceiling: the headline classifier trained on the private training records (not on the few
    held-out ones), tested on the same held-out test half as gen2real, the release a share of it."""
    assert stage("evaluate", released, source, *FAST, "evaluate.classifier=logreg", flags=["--force"]) == 0
    report, c = report_of(released), operator_of(released)["ceiling"]
    part = manifest(released, "sensitive", "partition")
    assert c["classifier"] == "logreg" and c["records"]["train"] + c["records"]["validation"] == \
        part["details"]["training_records"]
    assert c["records"]["test"] == report["reference"]["split"]["test"]
    assert c["release_gen2real"] == report["classifier_accuracy"]["accuracy"]
    assert c["share"] == pytest.approx(c["release_gen2real"] / c["accuracy"]) and c["accuracy"] > 0.5
    assert "ceiling" not in json.dumps(report).replace(report["operator"]["note"], "")
    page = (released / "release" / "evaluate" / "report.html").read_text()
    assert "operator.json" in page and f"{c['accuracy']:.3f}" not in page


def test_quality_and_mia_sections(released, source):
    assert stage("evaluate", released, source, *FAST, flags=["--force"]) == 0
    report = report_of(released)
    q = report["quality"]
    assert q["frechet"]["name"] == "fid_classifier" and q["frechet"]["value"] >= 0  # no Inception weights here
    assert 1 <= q["inception_score"]["mean"] <= 10
    assert q["js_score"]["js_score"] >= 0
    # membership inference reads training records: its numbers stay in the sensitive zone
    kept = report["membership_inference"]
    assert kept["status"] == "internal" and set(kept) == {"status", "kept_in", "note"}
    assert Path(kept["kept_in"]) == released / "sensitive" / "evaluate" / "membership_inference.json"
    m = json.loads(Path(kept["kept_in"]).read_text())
    assert m["status"] == "internal" and 0 <= m["auc"] <= 1 and 0 <= m["tpr_at_1pct_fpr"] <= 1
    assert m["records"]["generated"] == 200 and m["records"]["held_in"] == m["records"]["held_out"]
    released_text = "".join(p.read_text() for p in (released / "release" / "evaluate").glob("*.*"))
    assert "tpr_at_1pct_fpr" not in released_text and "auc" not in json.dumps(report["membership_inference"])
    page = (released / "release" / "evaluate" / "report.html").read_text()
    assert "fid_classifier" in page and "internal" in page and "data:image/png;base64," in page
    assert ">FID<" not in page


def test_sensitive_reference_labels_metrics_internal(released, source, tmp_path, mnist600):
    ref = tmp_path / "ref.parquet"
    write_parquet(mnist600.subset(np.arange(100)), ref)  # records the generator may have trained on
    assert stage("evaluate", released, source, *FAST, f"evaluate.reference_uri={ref}",
                 "evaluate.reference_kind=sensitive", "evaluate.mia=false") == 0
    report = report_of(released)
    assert report["labels"] == {"utility": "internal", "quality": "internal", "membership_inference": "internal"}
    assert report["reference"]["records"] == 100 and report["reference"]["kind"] == "sensitive"
    assert "skipped" in report["membership_inference"]
    m = manifest(released, "release", "evaluate")
    assert "reference" in [i["role"] for i in m["inputs"]] and "internal" in m["privacy"]["note"]


def test_reference_kind_needs_a_reference_uri(released, source, capsys):
    assert stage("evaluate", released, source, "evaluate.reference_kind=public") == 2
    assert "evaluate.reference_kind" in capsys.readouterr().err


def test_needs_the_released_sample(tmp_path, source, capsys):
    stages(tmp_path / "run", source, "partition")
    assert stage("evaluate", tmp_path / "run", source) == 2
    assert "no manifest" in capsys.readouterr().err


def test_metrics_and_report_in_the_mlflow_run(released, source, tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracked = ("tracking.enabled=true", f"tracking.uri={uri}", "tracking.experiment=evaluate-test")
    assert stage("evaluate", released, source, *FAST, *tracked, flags=["--force"]) == 0
    run_id = manifest(released, "release", "evaluate")["mlflow_run_id"]
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    metrics = run.data.metrics
    report = report_of(released)
    rows = {r["classifier"]: r for r in report["utility"]["classifiers"]}
    assert metrics["gen2real.logreg"] == rows["logreg"]["gen2real"] and metrics["gen2real.cnn"] == rows["cnn"]["gen2real"]
    assert metrics["accuracy"] == rows["cnn"]["gen2real"]  # the headline: the CNN (evaluate.classifier)
    assert not [k for k in metrics if k.startswith("accuracy_class")]  # no per-class figure leaves (the operator's report holds them)
    assert metrics["fid_classifier"] == report["quality"]["frechet"]["value"] and "fid" not in metrics
    assert not any(k.startswith("mia") for k in metrics)  # membership inference never reaches MLflow
    assert {"inception_score", "js_score", "real2gen.logreg", "calibrated.average", "epsilon_spent"} <= set(metrics)
    assert run.data.tags["dpsynth.evaluate.reference"] == "heldout" and run.data.tags["dpsynth.evaluate.frechet"] == "fid_classifier"
    artifacts = {a.path for a in client.list_artifacts(run_id)} | {a.path for a in client.list_artifacts(run_id, "grids")}
    assert {"report.html", "report.json", "manifest.json", "grids/synthetic_by_class.png"} <= artifacts
    page = open(client.download_artifacts(run_id, "report.html", str(tmp_path))).read()
    assert page == (released / "release" / "evaluate" / "report.html").read_text()


def test_epsilon_curve_from_generator_snapshots(released, source, tmp_path):
    """The train manifest may list generator snapshots (role generator_snapshot, dpsynth.generator/1
    files whose privacy record says the ε spent so far): one point of the curve each, by ε."""
    from dpsynth import storage
    from dpsynth.stages import manifest as manifests

    run = tmp_path / "run"
    shutil.copytree(released, run)  # manifests keep naming the original files, which stay unchanged
    train_manifest = run / "sensitive" / "train" / "manifest.json"
    m = json.loads(train_manifest.read_text())
    generator = next(o for o in m["outputs"] if o["role"] == "generator")
    state = torch.load(io.BytesIO(storage.read_bytes(generator["uri"])), weights_only=True)
    for eps in (5.0, 2.0):
        state["privacy"] = {**state["privacy"], "epsilon": eps}
        path = run / "sensitive" / "train" / f"snapshot-eps{eps:g}.pt"
        torch.save(state, path)
        m["outputs"].append({**manifests.entry(str(path), role="generator_snapshot"), "zone": "sensitive"})
    train_manifest.write_text(json.dumps(m))
    assert stage("evaluate", run, source, *FAST, "evaluate.curve_samples=100", "evaluate.mia=false") == 0
    curve = report_of(run)["epsilon_curve"]
    assert [p["epsilon"] for p in curve] == [2.0, 5.0]
    assert set(curve[0]) == {"epsilon", "fid_classifier", "inception_score", "gen2real.cnn"}
    assert curve[0]["fid_classifier"] == pytest.approx(curve[1]["fid_classifier"])  # the same weights twice
    assert "ε vs metrics" in (run / "release" / "evaluate" / "report.html").read_text()
    roles = [i["role"] for i in manifest(run, "release", "evaluate")["inputs"]]
    assert roles.count("generator_snapshot") == 2
