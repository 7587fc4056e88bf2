"""dpsynth pipeline run: six stages in order, one MLflow parent run with a child per stage; also on S3."""

import json

import pytest

from dpsynth import storage, tracking
from dpsynth.data import read_parquet
from tests.s3_fixtures import moto_endpoint, s3_bucket, s3_env  # noqa: F401 (fixtures)
from tests.stages.helpers import dpsynth, manifest, release_files, settings

STAGES = ["partition", "warmstart", "train", "audit", "sample", "evaluate"]
RELEASE = sorted([f"sample/{n}" for n in ("audit.json", "audit.md", "generator.pt", "manifest.json", "samples.png",
                                          "synthetic.parquet")] + ["evaluate/manifest.json", "evaluate/report.json"])


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def pipeline(run_dir, source, mlflow_uri, run_id, *overrides):
    tracked = ("tracking.enabled=true", f"tracking.uri={mlflow_uri}", "tracking.experiment=stages-test")
    return dpsynth("pipeline", "run", "--run-dir", run_dir, "--pipeline-run-id", run_id,
                   *settings(source, *tracked, *overrides))


def runs_of(mlflow_uri, pipeline_run_id):
    """(parent, {stage: child}) of one pipeline run."""
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("stages-test")
    runs = client.search_runs([exp.experiment_id], f"tags.`{tracking.TAG_PIPELINE_RUN_ID}` = '{pipeline_run_id}'")
    (parent,) = [r for r in runs if r.data.tags[tracking.TAG_STAGE] == "pipeline"]
    children = {r.data.tags[tracking.TAG_STAGE]: r for r in runs if r is not parent}
    assert len(children) == len(runs) - 1
    return client, parent, children


def test_parent_and_child_runs(tmp_path, source, mlflow_uri, capsys):
    run = tmp_path / "run"
    assert pipeline(run, source, mlflow_uri, "p1") == 0
    out = capsys.readouterr().out
    assert all(f"| {s} | succeeded |" in out for s in STAGES) and "audit passed" in out and "mlflow ui" in out

    client, parent, children = runs_of(mlflow_uri, "p1")
    assert sorted(children) == sorted(STAGES)
    train_eps = manifest(run, "sensitive", "train")["privacy"]["epsilon"]
    dataset = manifest(run, "sensitive", "partition")["dataset_sha256"]
    for stage, child in children.items():
        tags = child.data.tags
        assert tags["mlflow.parentRunId"] == parent.info.run_id and child.info.status == "FINISHED"
        assert tags[tracking.TAG_DATASET_SHA256] == dataset and tags[tracking.TAG_CODE_VERSION]
        assert tags[tracking.TAG_DELTA] == "0.0001" and tags[tracking.TAG_ACCOUNTANT]
        assert float(tags[tracking.TAG_EPSILON_SPENT]) == pytest.approx(train_eps if stage == "train" else 0, rel=1e-5)
        zone = "release" if stage in ("sample", "evaluate") else "sensitive"
        assert manifest(run, zone, stage)["mlflow_run_id"] == child.info.run_id
        assert "manifest.json" in [a.path for a in client.list_artifacts(child.info.run_id)]
    assert children["audit"].data.tags[tracking.TAG_AUDIT] == "passed"
    assert {i.dataset.name for i in children["train"].inputs.dataset_inputs}  # lineage of the training data
    assert {i.dataset.name for i in children["evaluate"].inputs.dataset_inputs} == {"synthetic", "heldout"}

    parent = client.get_run(parent.info.run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags[tracking.TAG_AUDIT] == "passed"
    assert parent.data.metrics["epsilon_total"] == pytest.approx(train_eps)
    assert float(parent.data.tags[tracking.TAG_EPSILON_SPENT]) == pytest.approx(train_eps, rel=1e-5)
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "pipeline")}
    assert artifacts == {"pipeline/stages.json", "pipeline/stages.md"}
    import mlflow

    mlflow.set_tracking_uri(mlflow_uri)
    models = mlflow.search_logged_models(experiment_ids=[parent.info.experiment_id], output_format="list")
    assert [m.source_run_id for m in models] == [children["sample"].info.run_id]  # only the audited generator

    assert sorted(release_files(run)) == RELEASE  # nothing sensitive in the release zone
    real_ids = {r for o in manifest(run, "sensitive", "partition")["outputs"] for r in read_parquet(o["uri"]).record_ids}
    assert not real_ids & set(read_parquet(run / "release" / "sample" / "synthetic.parquet").record_ids)

    # Re-running the same pipeline reuses every stage's outputs: six skipped child runs, no new ε.
    assert pipeline(run, source, mlflow_uri, "p2") == 0
    out = capsys.readouterr().out
    assert all(f"| {s} | skipped |" in out for s in STAGES), out
    _, parent2, children2 = runs_of(mlflow_uri, "p2")
    assert sorted(children2) == sorted(STAGES)
    assert {c.data.tags["dpsynth.stage_status"] for c in children2.values()} == {"skipped"}
    assert {c.data.tags[tracking.TAG_EPSILON_SPENT] for c in children2.values()} == {"0"}
    assert children2["train"].data.tags["dpsynth.reused_run_id"] == children["train"].info.run_id


def test_stops_at_the_first_failing_stage(tmp_path, source, mlflow_uri, capsys):
    assert pipeline(tmp_path / "run", source, mlflow_uri, "p3", "privacy.delta=0.01") == 2  # δ ≥ 1/n: train refuses
    captured = capsys.readouterr()
    assert "| train | failed |" in captured.out and "| audit | not run |" in captured.out
    assert "stage train failed" in captured.err and "delta" in captured.err
    _, parent, children = runs_of(mlflow_uri, "p3")
    assert sorted(children) == ["partition", "warmstart"] and parent.info.status == "FAILED"
    assert release_files(tmp_path / "run") == []


def test_on_s3(s3_bucket, source, capsys):
    src = f"s3://{s3_bucket}/data/mnist600.parquet"
    storage.copy(source, src)
    run = f"s3://{s3_bucket}/runs/r1"
    assert dpsynth("pipeline", "run", "--run-dir", run, "--json", *settings(src)) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [r["status"] for r in summary["stages"]] == ["succeeded"] * 6 and summary["audit"] == "passed"
    assert sorted(release_files(run)) == RELEASE
    for stage in STAGES:
        m = manifest(run, "release" if stage in ("sample", "evaluate") else "sensitive", stage)
        assert all(o["uri"].startswith(f"{run}/") for o in m["outputs"])
    assert storage.exists(f"{run}/sensitive/train/generator.pt")
    assert dpsynth("partition", "--run-dir", run, "--json", *settings(src)) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "skipped"


def test_orchestrator_path_start_stages_finish(tmp_path, source, mlflow_uri, capsys):
    """What Airflow/KFP will do: open the parent run, call each stage entrypoint with its id, finish."""
    tracked = settings(source, "tracking.enabled=true", f"tracking.uri={mlflow_uri}", "tracking.experiment=stages-test")
    run = tmp_path / "run"
    capsys.readouterr()
    assert dpsynth("pipeline", "start", "--run-dir", run, "--pipeline-run-id", "p4", *tracked) == 0
    ids = json.loads(capsys.readouterr().out)
    assert ids["pipeline_run_id"] == "p4" and ids["parent_run_id"]
    for stage in STAGES:
        assert dpsynth(stage, "--run-dir", run, "--parent-run-id", ids["parent_run_id"], "--pipeline-run-id", "p4",
                       *tracked) == 0
    capsys.readouterr()
    assert dpsynth("pipeline", "finish", "--run-dir", run, "--parent-run-id", ids["parent_run_id"],
                   "--pipeline-run-id", "p4", "--json", *tracked) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["succeeded"] and summary["audit"] == "passed"
    _, parent, children = runs_of(mlflow_uri, "p4")
    assert sorted(children) == sorted(STAGES) and parent.info.status == "FINISHED"
    assert parent.data.metrics["epsilon_total"] == pytest.approx(summary["epsilon_total"])
