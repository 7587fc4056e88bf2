"""Every MLflow key a stage logs is on its declared allow-list, and the audit checks it; GS-WGAN end to end
(its pre-training logs shard counts and timings) now passes its own audit and releases. Nothing before the
gate: no image or model on the train run, no raw content hash in MLflow or the release zone.

The end-to-end checks (:func:`check_keys_and_release`) run on the quick tier's one tracked pipeline run of each
method: DPGAN's `pipeline run` in tests/stages/test_pipeline.py, GS-WGAN's orchestrated run (the egress walk's) in
tests/stages/test_egress.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from dpsynth import storage, tracking
from dpsynth.methods.gswgan import GSWGANTrainer
from dpsynth.stages.audit import logged_keys
from tests.stages.helpers import release_files

EVALUATE = ("evaluate.mia_records=50", "evaluate.mia_generated=200", "evaluate.feature_steps=5",
            "evaluate.curve_samples=0", "sample.num_samples=200")
METHODS = {"dpgan": ("output.log_every=2",)}  # the tracked DPGAN run's own (GS-WGAN's: the egress walk's settings)


def pipeline_runs(uri, experiment, pipeline_run_id):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client, client.search_runs([exp.experiment_id], f"tags.`{tracking.TAG_PIPELINE_RUN_ID}` = '{pipeline_run_id}'")


# The checks below (check_keys_and_release) run on the quick tier's one tracked pipeline run of each method:
# DPGAN's `pipeline run` (tests/stages/test_pipeline.py::test_every_key_the_dpgan_pipeline_logs_is_declared_and_
# nothing_passes_the_gate) and GS-WGAN's orchestrated run, the egress walk's (tests/stages/test_egress.py::
# test_every_key_the_gswgan_pipeline_logs_is_declared_and_nothing_passes_the_gate).


def check_keys_and_release(uri, experiment, run_dir, method, pipeline_run_id, *, source, mnist600, tmp_path):
    """The audit of the tracked pipeline run PIPELINE_RUN_ID (METHOD's) passed and released; every key each stage's
    MLflow run holds is declared, with its reason; nothing before the gate (no image or model on the train run, no raw
    content hash in MLflow or the release zone); its generator is registered once (:func:`assert_released_once`)."""
    audit = json.loads(storage.read_bytes(f"{run_dir}/sensitive/audit/audit.json"))
    assert audit["decision"] == "passed", [c for c in audit["checks"] if not c["passed"]]
    assert {"sample/generator.pt", "sample/synthetic.parquet"} <= set(release_files(run_dir))

    client, runs = pipeline_runs(uri, experiment, pipeline_run_id)
    by_stage: dict[str, list] = {}  # a stage's runs (an orchestrator's launcher adds a train run of its own)
    for r in runs:
        by_stage.setdefault(r.data.tags[tracking.TAG_STAGE], []).append(r)
    assert set(by_stage) == {"pipeline", "partition", "pretrain", "train", "audit", "sample", "evaluate"}
    for stage, stage_runs in by_stage.items():
        declared = logged_keys(stage, method)
        for run in stage_runs:
            assert declared.undeclared(metrics=run.data.metrics, params=run.data.params) == [], stage
            for name in [*run.data.metrics]:  # every declaration says why
                assert any(reason for key, reason in declared.metrics.items()
                           if key == name or (key.endswith("*") and name.startswith(key[:-1])))
    if method == "gswgan":  # the pre-training's shard count and whole-stage time, but no per-shard time (#52 item 8)
        assert any({"shards", "fan_in_seconds"} <= set(r.data.metrics) for r in by_stage["pretrain"])
        assert not [k for r in by_stage["pretrain"] for k in r.data.metrics if k.startswith("shard_seconds")]
    assert any(len(r.data.metrics) >= 2 and len(r.data.params) > 20 for r in by_stage["train"])
    (sample_run,), (parent_run,) = by_stage["sample"], by_stage["pipeline"]

    # nothing before the gate: the train run holds no image and no model (the sample stage logs them)
    def artifact_paths(run_id, path=None):
        for a in client.list_artifacts(run_id, path):
            yield from artifact_paths(run_id, a.path) if a.is_dir else [a.path]

    train_artifacts = [p for r in by_stage["train"] for p in artifact_paths(r.info.run_id)]
    assert not [p for p in train_artifacts if p.endswith((".png", ".jpg", ".pt", ".pth", ".pkl", "MLmodel"))]
    assert any(p.endswith(".png") for p in artifact_paths(sample_run.info.run_id))
    # no raw content hash (the dataset's, the source file's, the shard files') in any tag, param, input
    # digest or artifact of the pipeline's runs, or in any file of the release zone
    partition = json.loads(storage.read_bytes(f"{run_dir}/sensitive/partition/manifest.json"))
    raw = {mnist600.content_sha256(), hashlib.sha256(Path(source).read_bytes()).hexdigest(),
           *(o["sha256"] for o in partition["outputs"])}
    assert partition["inputs"][0]["content_sha256"] in raw  # the sensitive manifest does hold it
    texts = []
    for run in runs:
        texts.append(json.dumps([run.data.tags, run.data.params, [i.dataset.digest for i in run.inputs.dataset_inputs]]))
        local = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / "artifacts" / run.info.run_id)))
        texts += [p.read_bytes().decode("latin-1") for p in local.rglob("*") if p.is_file()]
    release = Path(run_dir) / "release"
    texts += [p.read_bytes().decode("latin-1") for p in release.rglob("*") if p.is_file()]
    leaks = [h for h in raw for t in texts if h in t or h[:32] in t]
    assert leaks == []
    import mlflow

    mlflow.set_tracking_uri(uri)  # the registered model is loaded by its models:/ URI
    assert_released_once(client, run_dir, method=method, sample_run=sample_run, pipeline_run_id=pipeline_run_id,
                         parent_run=parent_run, audit=audit, partition=partition)


def assert_released_once(client, run_dir, *, method, sample_run, pipeline_run_id, parent_run, audit, partition):
    """The passed audit's generator is in the Model Registry once, as dpsynth-mnist600-METHOD@released, its tags
    read back against the files and runs themselves, and it generates what the released generator.pt does."""
    import mlflow
    import torch

    from dpsynth.training.artifacts import load_generator

    (model,) = client.search_registered_models()
    assert model.name == f"dpsynth-mnist600-{method}" and model.tags[tracking.TAG_POPULATION] == "mnist600"
    (version,) = client.search_model_versions(f"name = '{model.name}'")
    assert str(client.get_model_version_by_alias(model.name, tracking.RELEASED_ALIAS).version) == str(version.version) == "1"
    assert client.get_model_version(model.name, version.version).aliases == [tracking.RELEASED_ALIAS]
    assert version.run_id == sample_run.info.run_id
    t = version.tags
    sha = lambda path: hashlib.sha256(Path(path).read_bytes()).hexdigest()  # noqa: E731
    assert float(t[tracking.TAG_EPSILON_SPENT]) == pytest.approx(audit["epsilon_upper_bound"], rel=1e-5)
    assert float(t[tracking.TAG_EPSILON_SPENT]) <= 10 and float(t[tracking.TAG_DELTA]) == 1e-4
    assert t[tracking.TAG_ACCOUNTANT] == "+".join(audit["epsilons"]) and t[tracking.TAG_AUDIT] == "passed"
    assert t[tracking.TAG_TRACE_SHA256] == sha(f"{run_dir}/sensitive/train/trace.json")
    assert t[tracking.TAG_GENERATOR_SHA256] == sha(f"{run_dir}/release/sample/generator.pt") \
        == sha(f"{run_dir}/sensitive/train/generator.pt")
    assert t[tracking.TAG_DATASET_VERSION] == partition["dataset_sha256"] == sample_run.data.tags[tracking.TAG_DATASET_VERSION]
    assert t[tracking.TAG_PIPELINE_RUN_ID] == pipeline_run_id and t[tracking.TAG_PARENT_RUN_ID] == parent_run.info.run_id
    assert t[tracking.TAG_METHOD] == method
    # the registered model is the audited generator: same images for the same (z, y)
    registered = mlflow.pytorch.load_model(f"models:/{model.name}@{tracking.RELEASED_ALIAS}")
    generator, _ = load_generator(f"{run_dir}/release/sample/generator.pt")
    z, y = torch.randn(6, generator.latent_dim, generator=torch.Generator().manual_seed(0)), torch.arange(6) % 10
    with torch.no_grad():
        torch.testing.assert_close(registered(z, y), generator.eval()(z, y))


def test_a_key_no_stage_declared_fails_the_audit_whatever_its_name(tmp_path, source):
    from dpsynth.config import load_config
    from dpsynth.stages import audit

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_config(overrides=["tracking.enabled=true", f"tracking.uri={uri}"])
    with tracking.start_run(tracking_uri=uri, experiment="keys-audit", stage="train") as run:
        import mlflow

        mlflow.log_metric("epsilon", 1.0)
        mlflow.log_param("train.seed", 0)
    assert audit.mlflow_check(cfg, tracking_uri=uri, run_ids=[run.info.run_id], parent_run_id=None)["passed"]
    with tracking.start_run(tracking_uri=uri, experiment="keys-audit", stage="train") as leaky:
        mlflow.log_metric("epsilon", 1.0)
        mlflow.log_metric("rows_seen", 31.0)  # a name no deny-list pattern would have caught
    check = audit.mlflow_check(cfg, tracking_uri=uri, run_ids=[leaky.info.run_id], parent_run_id=None)
    assert not check["passed"] and f"train run {leaky.info.run_id}: metric rows_seen" in check["detail"]
    with tracking.start_run(tracking_uri=uri, experiment="keys-audit", stage="debug") as unknown:
        pass
    assert not audit.mlflow_check(cfg, tracking_uri=uri, run_ids=[unknown.info.run_id], parent_run_id=None)["passed"]


def test_trainers_declare_what_their_runs_hold():
    keys = GSWGANTrainer.MLFLOW_KEYS
    assert keys.undeclared(metrics=["epsilon"], params=["gswgan.batch_size", "derived.records"]) == []
    assert keys.undeclared(metrics=["shard_index"], params=["derived.shard"]) == ["metric shard_index",
                                                                                 "param derived.shard"]
