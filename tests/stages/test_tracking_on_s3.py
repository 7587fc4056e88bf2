"""MLflow artifacts on S3 (tracking.artifact_location), against a real moto_server over loopback:
the pipeline's parent run and a stage's child run keep their artifacts in the bucket, and MLflow
lists and reads them back from there."""

import json

import mlflow
import pytest
from mlflow import MlflowClient

from dpsynth import tracking
from tests.stages.helpers import dpsynth, settings


def test_stage_and_parent_artifacts_land_in_the_bucket(tmp_path, source, s3_bucket, s3_env, moto_endpoint,
                                                        monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", moto_endpoint)
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracked = settings(source, "tracking.enabled=true", f"tracking.uri={mlflow_uri}", "tracking.experiment=s3-art",
                       f"tracking.artifact_location=s3://{s3_bucket}/mlflow")
    run = tmp_path / "run"
    assert dpsynth("pipeline", "start", "--run-dir", run, "--pipeline-run-id", "s3a", *tracked) == 0
    parent_id = json.loads(capsys.readouterr().out)["parent_run_id"]
    assert dpsynth("partition", "--run-dir", run, "--parent-run-id", parent_id, "--pipeline-run-id", "s3a",
                   "--json", *tracked) == 0
    child_id = json.loads(capsys.readouterr().out)["mlflow_run_id"]

    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("s3-art")
    assert exp.artifact_location == f"s3://{s3_bucket}/mlflow"
    assert exp.tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"  # MLflow 3 UI: training runs
    child = client.get_run(child_id)
    assert child.info.artifact_uri.startswith(f"s3://{s3_bucket}/mlflow/")
    assert child.data.tags[tracking.TAG_STAGE] == "partition"
    assert child.data.tags["mlflow.parentRunId"] == parent_id
    [dataset] = [i.dataset for i in child.inputs.dataset_inputs]
    assert dataset.source_type == "local" and json.loads(dataset.source)["uri"] == f"file://{source}"
    names = {a.path for a in client.list_artifacts(child_id)}
    assert {"config.yaml", "manifest.json"} <= names, names
    local = client.download_artifacts(child_id, "manifest.json", str(tmp_path))
    assert json.loads(open(local).read())["stage"] == "partition"

    keys = [o["Key"] for o in s3_env.list_objects_v2(Bucket=s3_bucket, Prefix="mlflow/")["Contents"]]
    assert any(k.endswith(f"{child_id}/artifacts/manifest.json") for k in keys), keys
    assert any(k.endswith(f"{parent_id}/artifacts/config.yaml") for k in keys), keys
    assert not (tmp_path / "mlartifacts").exists()  # nothing fell back to local files


def test_runs_nest_by_parent_run_id_and_s3_inputs_are_s3_sources(tmp_path):
    """tracking.start_run nests with mlflow.start_run(parent_run_id=...) (MLflow checks the parent exists);
    an s3:// dataset is logged as an "s3" dataset source (no S3 access: only its URI is recorded); an
    experiment made before dpsynth tagged its kind gets the tag."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    old = mlflow.create_experiment("older")
    parent = tracking.create_parent_run(tracking_uri=uri, experiment="older", run_name="p", tags={})
    with tracking.start_run(tracking_uri=uri, experiment="older", stage="train", parent_run_id=parent) as run:
        tracking.log_dataset_input(uri="s3://bucket/data/mnist.parquet", digest="ab" * 32, name="train")
    client = MlflowClient(uri)
    child = client.get_run(run.info.run_id)
    assert child.data.tags["mlflow.parentRunId"] == parent
    [dataset] = [i.dataset for i in child.inputs.dataset_inputs]
    assert dataset.source_type == "s3" and json.loads(dataset.source)["uri"] == "s3://bucket/data/mnist.parquet"
    assert client.get_experiment(old).tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"
    with pytest.raises(mlflow.exceptions.MlflowException):
        with tracking.start_run(tracking_uri=uri, experiment="older", stage="train", parent_run_id="0" * 32):
            pass
