"""Every shipped ``configs/<method>-mnist-cpu.yaml``, shortened, through ``dpsynth pipeline run`` as a user runs
it: MLflow tracking on, the config's population with an explicit budget in the test's ledger. The audit
must pass and the release must exist (the audit rejects a pipeline whose MLflow runs hold an undeclared
key, so this also checks every stage's allow-list against what the method's stages really log)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from dpsynth import tracking
from dpsynth.config import load_config
from dpsynth.methods import registry
from tests.stages.helpers import dpsynth, manifest, release_files

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted(REPO.glob("configs/*-mnist-cpu.yaml"))
# Shorter and narrower, nothing else: each config keeps its method, mechanism, accounting and cadences.
# (600 records: the configs' δ = 1e-5 stays < 1/n; K = 3 shards so a shard holds a GS-WGAN batch.) The evaluation
# at its test size (as tests/pipelines/test_methods.py's): the membership attack and the ε curve still run and log
# their keys, on fewer records and samples (#53 item 5: about half of a run's evaluate stage).
SHORT = (
    "train.steps=10", "train.d_width=4", "train.g_width=4", "train.batch_size=32", "warmup.steps=5",
    "partition.num_shards=3", "gswgan.pretrain_iterations=2", "gswgan.d_width=4", "gswgan.g_width=4",
    "gswgan.batch_size=16", "train.n_d=2", "dpac.start_iteration=2", "dpac.n_f=2", "dpac.n_r=2",
    "dpac.c_width=4", "zhang.pretrain_iterations=2", "zhang.public_batch_size=16",
    "output.checkpoint_every=5", "output.sample_every=5", "output.log_every=2",
    "sample.num_samples=200", "evaluate.epochs=1", "evaluate.feature_steps=5",
    "evaluate.mia_records=50", "evaluate.mia_generated=200", "evaluate.curve_samples=200",
)


def test_every_shipped_config_names_a_registered_method():
    assert CONFIGS
    from dpsynth.config import AUTO

    assert {load_config(c).train.method for c in CONFIGS} <= set(registry.METHODS) | {AUTO}
    for c in CONFIGS:  # auto names a registered method for every schema
        assert {registry.resolve(load_config(c), channels=k).train.method for k in (1, 3)} <= set(registry.METHODS)


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name.split("-")[0])
def test_shipped_config_passes_its_audit_and_is_released(config, tmp_path, source, ledger_with_budget, capsys):
    from mlflow import MlflowClient

    cfg = load_config(config)
    population = cfg.ledger.population_id
    ledger_with_budget.set_budget(population, epsilon=100.0, delta=1e-3, reason="shipped-config test")
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = tmp_path / "run"
    overrides = (f"data.uri={source}", "tracking.enabled=true", f"tracking.uri={mlflow_uri}",
                 "tracking.experiment=shipped-configs", *SHORT)
    started = time.monotonic()
    code = dpsynth("pipeline", "run", "--config", config, "--run-dir", run, "--pipeline-run-id", f"ship-{cfg.train.method}",
                   *[a for o in overrides for a in ("--set", o)])
    seconds = time.monotonic() - started
    out, err = capsys.readouterr()
    print(f"{config.name}: pipeline run {seconds:.1f} s")  # shown with -s / in the report of a failure
    assert code == 0, err[-3000:]

    report = json.loads((run / "sensitive" / "audit" / "audit.json").read_text())
    assert report["decision"] == "passed", [c for c in report["checks"] if not c["passed"]]
    assert manifest(run, "sensitive", "train")["details"]["method"] == registry.resolve(cfg, channels=1).train.method  # MNIST: grey
    released = release_files(run)
    assert {"sample/generator.pt", "sample/synthetic.parquet", "sample/audit.json", "evaluate/manifest.json"} \
        <= set(released)
    # one attempt charged to the config's population, within the budget
    (charged,) = ledger_with_budget.history(population)
    assert charged["stage"] == "train" and charged["status"] == "committed"
    assert 0 < charged["epsilon_spent"] <= cfg.privacy.epsilon
    # the MLflow record: the pipeline's parent run finished with the audit's decision
    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("shipped-configs")
    runs = client.search_runs([exp.experiment_id],
                              f"tags.`{tracking.TAG_PIPELINE_RUN_ID}` = 'ship-{cfg.train.method}'")
    (parent,) = [r for r in runs if r.data.tags[tracking.TAG_STAGE] == "pipeline"]
    assert parent.info.status == "FINISHED" and parent.data.tags[tracking.TAG_AUDIT] == "passed"
    assert {r.data.tags[tracking.TAG_STAGE] for r in runs} >= {"partition", "pretrain", "train", "audit", "sample"}
