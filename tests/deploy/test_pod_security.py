"""PodSecurity "restricted" (issue #34): every pod the chart renders — MLflow, the bundled PostgreSQL and MinIO, the
bucket Job, the helm test — and the stage pods Airflow builds pass the Pod Security Standards' restricted profile
(Kubernetes 1.33), checked here rule by rule as the admission controller states them (no cluster to admit them)."""

from __future__ import annotations

import functools
import json

import pytest

from tests.deploy.test_chart import VARIANTS, find, render, tools

VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}


def violations(spec: dict) -> list[str]:
    """What the restricted profile refuses in a pod spec (its rules for pods of a Linux node)."""
    bad, pod_sc = [], spec.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            bad.append(key)
    for v in spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= VOLUMES:
            bad.append(f"volume {v['name']}: {kinds - VOLUMES}")
    for c in [*(spec.get("initContainers") or []), *spec["containers"]]:
        sc, name = c.get("securityContext") or {}, c["name"]
        if sc.get("privileged"):
            bad.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{name}: allowPrivilegeEscalation must be false")
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            bad.append(f"{name}: runAsNonRoot must be true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            bad.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{name}: seccompProfile {seccomp}")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            bad.append(f"{name}: capabilities must drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            bad.append(f"{name}: adds {caps['add']}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            bad.append(f"{name}: hostPort")
    return bad


def pod_specs(docs: list[dict]) -> dict[str, dict]:
    out = {}
    for d in docs:
        if d["kind"] == "Pod":
            out[f"Pod/{d['metadata']['name']}"] = d["spec"]
        elif d["kind"] in ("Deployment", "StatefulSet", "Job", "DaemonSet"):
            out[f"{d['kind']}/{d['metadata']['name']}"] = d["spec"]["template"]["spec"]
    return out


def test_the_check_refuses_what_restricted_refuses():
    ok = {"securityContext": {"runAsNonRoot": True, "runAsUser": 999, "seccompProfile": {"type": "RuntimeDefault"}},
          "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": False,
                                                           "capabilities": {"drop": ["ALL"]}}}]}
    assert violations(ok) == []
    assert violations({**ok, "securityContext": {"fsGroup": 999}})  # the old PostgreSQL pod: root, no seccomp
    assert violations({**ok, "volumes": [{"name": "h", "hostPath": {"path": "/"}}]})
    assert violations({**ok, "containers": [{"name": "c"}]})


@tools
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rendered_pod_is_restricted(variant):
    specs = pod_specs(render(*VARIANTS[variant]))
    if variant != "external":
        assert {k.split("/")[0] + "/" + k.split("-")[-1] for k in specs} >= {
            "StatefulSet/postgresql", "Deployment/minio", "Job/buckets", "Deployment/mlflow"}, specs.keys()
    assert {name: violations(spec) for name, spec in specs.items() if violations(spec)} == {}


@functools.cache
def _airflow_home(kubeconfig: str) -> str:
    """One Airflow home (and kubeconfig) for the test process: the variants' snippets then differ only in their
    DPSYNTH_* settings and share one Airflow fork server (``in_airflow``) instead of an Airflow import each."""
    import tempfile

    home = tempfile.mkdtemp(prefix="psa-airflow-")
    with open(f"{home}/kubeconfig", "w") as f:
        f.write(kubeconfig)
    return home


def airflow_pods(env: dict) -> dict[str, dict]:
    """Every pod the Airflow DAGs create on Kubernetes, as the KubernetesPodOperator itself builds it (its
    ``build_pod_request_obj``: the base container and the XCom sidecar it adds), in the Airflow venv with the chart's
    rendered Airflow env: {task id: pod spec}."""
    from tests.airflow_fixtures import AIRFLOW_BIN, DAGS, KUBECONFIG, in_airflow

    if not (AIRFLOW_BIN / "airflow").exists():
        pytest.skip(".venv/airflow is missing")
    home = _airflow_home(KUBECONFIG)
    env = {**{k: v for k, v in __import__("os").environ.items() if not k.startswith(("AIRFLOW", "DPSYNTH_"))}, **env,
           "AIRFLOW_HOME": home, "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db", "DPSYNTH_K8S_CONFIG_FILE": f"{home}/kubeconfig"}
    return in_airflow("""
    import copy, json
    from airflow.dag_processing.dagbag import DagBag
    from kubernetes.client import ApiClient
    bag = DagBag()
    assert not bag.import_errors, bag.import_errors
    out = {}
    for dag in bag.dags.values():
        for task in dag.tasks:
            cls = getattr(task, "operator_class", type(task))  # a mapped task: its operator's class
            if getattr(cls, "__name__", "") != "StagePodOperator":
                continue
            if hasattr(task, "partial_kwargs"):  # mapped (per shard): one of its pods
                kwargs = {k: v for k, v in task.partial_kwargs.items() if k not in ("map_index_template",)}
                op = cls(task_id=task.task_id, arguments=["dpsynth", "x"], **kwargs)
            else:
                op = copy.copy(task)
                op.arguments = ["dpsynth", "x"]  # the argv comes from an XCom at run time
            pod = op.build_pod_request_obj(context=None)
            out[f"{dag.dag_id}.{task.task_id}"] = ApiClient().sanitize_for_serialization(pod)["spec"]
            out[f"{dag.dag_id}.{task.task_id}"]["x-pool"] = op.pool
    print(json.dumps(out))
    """, env)


@tools
@pytest.mark.parametrize("variant", ["default", "gpu"])
def test_every_pod_the_airflow_dags_create_is_restricted_sidecar_included(variant):
    """#55 item 2: every container of every stage pod, the XCom sidecar included (it had no securityContext; the
    check before looked at the base container only), passes restricted; GPU stages take the CUDA image, the GPU
    pool and the node pool's placement; the partition pod alone gets the partition key's Secret."""
    env = find(render(*VARIANTS[variant], "--set", "imagePullSecrets={regcred}"), "ConfigMap", "-airflow-env")["data"]
    pods = airflow_pods(env)
    train = {k.split(".", 1)[1]: v for k, v in pods.items() if k.startswith("dpsynth_train.")}
    assert set(train) == {"start", "partition", "pretrain_shard", "pretrain", "train", "train_job", "audit", "sample",
                          "evaluate", "finish"}
    assert "dpsynth_import_data.import_data" in pods
    for name, spec in pods.items():
        assert [c["name"] for c in spec["containers"]] == ["base", "airflow-xcom-sidecar"], name
        assert violations(spec) == [], name
        assert spec["imagePullSecrets"] == [{"name": "regcred"}], name
    gpu_stages = env["DPSYNTH_GPU_STAGES"].split(",")
    for task, spec in train.items():
        stage = {"pretrain_shard": "pretrain", "train_job": "train-job"}.get(task, task)
        gpu = stage in gpu_stages
        assert spec["containers"][0]["image"] == (env["DPSYNTH_GPU_IMAGE"] if gpu else env["DPSYNTH_STAGE_IMAGE"]), task
        assert spec["x-pool"] == ("dpsynth_gpu" if gpu else "default_pool"), task
        if gpu:
            assert spec["nodeSelector"] == json.loads(env["DPSYNTH_GPU_NODE_SELECTOR"]), task
        names = {e["name"]: e for e in spec["containers"][0].get("env") or []}
        assert ("DPSYNTH_PARTITION_KEY" in names) == (task == "partition"), task
    key = {e["name"]: e for e in train["partition"]["containers"][0]["env"]}
    assert key["DPSYNTH_PARTITION_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "dpsynth-partition-key"
    assert key["DPSYNTH_REQUIRE_PARTITION_KEY"]["value"] == "true"


@tools
@pytest.mark.parametrize("variant", ["default", "gpu"])
def test_the_trainjob_pods_are_restricted(variant):
    """#55 item 2: the TrainJob's pods (the chart's template, after the launcher filled it in, CPU ranks included)
    carry the restricted securityContext through their own runtime patch."""
    from dpsynth.config import load_config
    from dpsynth.distributed import launch
    from tests.distributed.test_launch import chart_template

    template = chart_template(*VARIANTS[variant])
    for device in ("cuda", "cpu"):
        cfg = load_config(overrides=["train.nodes=2", f"train.device={device}"])
        job = launch.trainjob_manifest(template, cfg, ["train"], name="x", namespace="dpsynth", pipeline_run_id="r")
        [security] = [p for p in job["spec"]["runtimePatches"] if p["manager"] == "dpsynth.io/pod-security"]
        [node] = security["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        pod = node["template"]["spec"]["template"]["spec"]
        assert violations(pod) == [], (variant, device)
