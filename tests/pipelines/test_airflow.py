"""The Airflow DAGs (pipelines/airflow/dags), run in the Airflow venv from the stage venv's pytest.

Airflow and the stage stack live in two venvs; these tests call the Airflow one as a subprocess
with AIRFLOW_HOME in a temporary directory (SQLite, no examples).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
AIRFLOW_BIN = REPO / ".venv" / "airflow" / "bin"
DAGS = REPO / "pipelines" / "airflow" / "dags"
STAGES = ["partition", "warmstart", "train", "audit", "sample", "evaluate"]
RELEASE = sorted([f"sample/{n}" for n in ("audit.json", "audit.md", "generator.pt", "manifest.json", "samples.png",
                                          "synthetic.parquet")] + ["evaluate/manifest.json", "evaluate/report.html", "evaluate/report.json"])
TINY = ["train.d_width=4", "train.g_width=4", "train.latent_dim=8", "train.batch_size=32", "sample.num_samples=200",
        "output.log_every=0", "output.sample_every=0", "output.checkpoint_every=0", "tracking.experiment=airflow-test"]

pytestmark = pytest.mark.skipif(not (AIRFLOW_BIN / "airflow").exists(),
                                reason=".venv/airflow is missing: `make test` creates it from requirements/airflow.lock")

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: dummy, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: dummy, user: {token: dummy}}]
contexts: [{name: dummy, context: {cluster: dummy, user: dummy}}]
current-context: dummy
"""


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory) -> dict:
    home = tmp_path_factory.mktemp("airflow_home")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "DPSYNTH_"))}
    env.update(AIRFLOW_HOME=str(home), AIRFLOW__CORE__DAGS_FOLDER=str(DAGS), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
               DPSYNTH_STAGE_BIN=str(Path(sys.executable).with_name("dpsynth")), PYTHONUNBUFFERED="1")
    return env


def in_airflow(code: str, env: dict) -> dict:
    """Run CODE with the Airflow venv's python; it prints one JSON document as its last line."""
    proc = subprocess.run([str(AIRFLOW_BIN / "python"), "-c", textwrap.dedent(code)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


LOAD = """
    import json
    from airflow.dag_processing.dagbag import DagBag
    bag = DagBag()
    assert not bag.import_errors, bag.import_errors
"""


def test_dags_import_and_the_form_rejects_bad_values(airflow_env):
    out = in_airflow(LOAD + """
    import copy
    from airflow.sdk.exceptions import ParamValidationError
    def rejected(**values):  # as the trigger form and `dags trigger --conf` do
        try:
            params = copy.deepcopy(bag.dags["dpsynth_train"].params)
            params.update(values)
            params.validate()
        except ParamValidationError:
            return True
        return False
    train, retrain = bag.dags["dpsynth_train"], bag.dags["dpsynth_retrain_on_new_data"]
    print(json.dumps({
        "dags": sorted(bag.dags), "tasks": sorted(t.task_id for t in train.tasks),
        "mapped": [t.task_id for t in train.tasks if getattr(t, "is_mapped", False) or type(t).__name__ == "MappedOperator"],
        "ok": not rejected(epsilon=3.5, delta=1e-6, num_shards=4, n_d="5"),
        "bad": {k: rejected(**{k: v}) for k, v in [("epsilon", -1), ("epsilon", 0), ("delta", 1), ("delta", 0),
                ("method", "wgan"), ("n_d", "sometimes"), ("num_shards", 0), ("steps", 0)]},
        "retrain_schedule": type(retrain.timetable).__name__,
        "retrain_assets": [a.uri for a in retrain.timetable.asset_condition.objects],
        "outlets": [o.uri for o in bag.dags["dpsynth_import_data"].get_task("import_data").outlets],
    }))
    """, airflow_env)
    assert out["dags"] == ["dpsynth_import_data", "dpsynth_retrain_on_new_data", "dpsynth_train"]
    assert out["tasks"] == sorted(["plan", "start", *STAGES, "shards", "warmstart_shard", "finish"])
    assert out["mapped"] == ["warmstart_shard"]
    assert out["ok"] and all(out["bad"].values()), out["bad"]
    assert out["retrain_schedule"] == "AssetTriggeredTimetable"
    dataset = (REPO / "outputs" / "data" / "mnist.parquet").as_uri()  # DPSYNTH_DATASET_URI's default
    assert out["outlets"] == [dataset] and out["retrain_assets"] == [dataset]


def test_kubernetes_pods_request_gpus_for_warmstart_and_train_only(airflow_env, tmp_path):
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    env = {**airflow_env, "DPSYNTH_EXECUTOR": "kubernetes", "DPSYNTH_K8S_CONFIG_FILE": str(tmp_path / "kubeconfig"),
           "DPSYNTH_STAGE_IMAGE": "registry.example/dpsynth-stage:test",
           "DPSYNTH_GPU_NODE_SELECTOR": '{"pool": "gpu"}',
           "DPSYNTH_GPU_TOLERATIONS": '[{"key": "gpu", "operator": "Equal", "value": "a100", "effect": "NoSchedule"}]'}
    out = in_airflow(LOAD + """
    from kubernetes.client import ApiClient
    dag = bag.dags["dpsynth_train"]
    ops = [t for t in dag.tasks if type(t).__name__ == "KubernetesPodOperator"]
    mapped = [t for t in dag.tasks if type(t).__name__ == "MappedOperator"]
    print(json.dumps({"pods": {t.task_id: ApiClient().sanitize_for_serialization(t.build_pod_request_obj()) for t in ops},
                      "mapped": {t.task_id: [t.operator_class.__name__ if hasattr(t.operator_class, "__name__")
                                             else t.operator_class["task_type"], sorted(t.expand_input.value)]
                                 for t in mapped},
                      "mapped_gpu": {t.task_id: str(t.partial_kwargs["container_resources"].limits) for t in mapped}}))
    """, env)
    assert out["mapped"] == {"warmstart_shard": ["KubernetesPodOperator", ["arguments"]]}  # one pod per shard
    assert "nvidia.com/gpu" in out["mapped_gpu"]["warmstart_shard"]
    pods = out["pods"]
    assert sorted(pods) == sorted(["start", *STAGES, "finish"])
    for task_id, pod in pods.items():
        spec = pod["spec"]
        container = next(c for c in spec["containers"] if c["name"] == "base")  # beside it: the XCom sidecar
        assert container["image"] == "registry.example/dpsynth-stage:test" and pod["metadata"]["namespace"] == "dpsynth"
        assert container["command"] == ["sh", "-c"] and "/airflow/xcom/return.json" in container["args"][0]
        limits = container["resources"].get("limits", {})
        if task_id in ("warmstart", "train"):
            assert limits["nvidia.com/gpu"] == "1"
            assert spec["nodeSelector"] == {"pool": "gpu"}
            assert {"key": "gpu", "operator": "Equal", "value": "a100", "effect": "NoSchedule"} in spec["tolerations"]
        else:
            assert "nvidia.com/gpu" not in limits and not spec.get("nodeSelector")
            assert not any(t.get("key") == "gpu" for t in spec.get("tolerations") or [])
    train = next(c for c in pods["train"]["spec"]["containers"] if c["name"] == "base")
    assert "['shell']['train']" in train["args"][0] and "--parent-run-id" in train["args"][0]


def test_train_dag_end_to_end(airflow_env, tmp_path):
    """`airflow dags test dpsynth_train` with K=2 on 600 MNIST records: every task succeeds, the run
    directory holds the release, and MLflow has the parent run with one child per stage."""
    from mlflow import MlflowClient

    from dpsynth import tracking
    from dpsynth.data import import_source, write_parquet

    source = tmp_path / "mnist600.parquet"
    write_parquet(import_source(REPO / "data" / "mnist").subset(np.arange(600)), source)
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    conf = {"dataset_uri": str(source), "method": "dpgan", "epsilon": 10, "delta": 1e-4, "steps": 10, "num_shards": 2,
            "n_d": "2", "seed": 0, "run_root": str(tmp_path / "runs"), "config": None, "tracking_uri": mlflow_uri,
            "pipeline_run_id": "af-e2e", "overrides": TINY}
    airflow = str(AIRFLOW_BIN / "airflow")
    subprocess.run([airflow, "db", "migrate"], env=airflow_env, check=True, capture_output=True, timeout=120)
    proc = subprocess.run([airflow, "dags", "test", "dpsynth_train", "-c", json.dumps(conf)], env=airflow_env,
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "DagRun Finished: dag_id=dpsynth_train" in log and "state=success" in log, log[-6000:]
    assert log.count("running task <TaskInstance: dpsynth_train.warmstart_shard") == 2  # mapped over K=2 shards

    release = tmp_path / "runs" / "af-e2e" / "release"
    assert sorted(str(p.relative_to(release)) for p in release.rglob("*") if p.is_file()) == RELEASE
    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("airflow-test")
    runs = client.search_runs([exp.experiment_id], f"tags.`{tracking.TAG_PIPELINE_RUN_ID}` = 'af-e2e'")
    (parent,) = [r for r in runs if r.data.tags[tracking.TAG_STAGE] == "pipeline"]
    children = [r for r in runs if r is not parent]
    assert sorted(r.data.tags[tracking.TAG_STAGE] for r in children) == sorted(STAGES)
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in children)
    assert parent.info.status == "FINISHED" and parent.data.tags[tracking.TAG_AUDIT] == "passed"
    assert 0 < parent.data.metrics["epsilon_total"] <= 10
