"""PodSecurity "restricted" (issue #34): every pod the chart renders — MLflow, the bundled PostgreSQL and MinIO, the
bucket Job, the helm test — and the stage pods Airflow builds pass the Pod Security Standards' restricted profile
(Kubernetes 1.33), checked here rule by rule as the admission controller states them (no cluster to admit them)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.deploy.test_chart import REPO, VARIANTS, find, render, tools

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


@tools
@pytest.mark.parametrize("stage", ["start", "partition", "warmstart", "train", "train-job", "audit", "finish", "import"])
def test_the_stage_pods_airflow_builds_are_restricted(monkeypatch, stage):
    pytest.importorskip("kubernetes")
    from kubernetes.client import ApiClient

    for k, v in find(render(*VARIANTS["gpu"]), "ConfigMap", "-airflow-env")["data"].items():
        monkeypatch.setenv(k, v)
    spec = importlib.util.spec_from_file_location("dpsynth_pods_psa", REPO / "pipelines" / "airflow" / "dags" / "dpsynth_pods.py")
    pods = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pods)
    kw = pods.pod_settings(stage)
    api = ApiClient()
    pod = {"securityContext": api.sanitize_for_serialization(kw["security_context"]),
           "containers": [{"name": "base", "securityContext": api.sanitize_for_serialization(kw["container_security_context"])}]}
    assert violations(pod) == []
