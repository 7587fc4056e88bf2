"""The chart's Kubeflow jobs (charts/dpsynth/templates/trainjob.yaml, of the kind ``trainJob.kind``): the Kubeflow
Trainer TrainJob and the older training operator's PyTorchJob, validated offline against their CRDs' own schemas
(tests/deploy/crds/trainjob-v1alpha1.json, copied from kubeflow/trainer, and pytorchjob-v1.json, copied from
kubeflow/training-operator's release-1.9; each file's ``source`` names the commit), with unknown fields refused as
``kubectl apply`` (strict field validation) refuses them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from tests.deploy.test_chart import CHART, VARIANTS, helm, tools

CRDS = {c["kind"]: c for c in (json.loads((Path(__file__).parent / "crds" / f).read_text())
                                for f in ("trainjob-v1alpha1.json", "pytorchjob-v1.json"))}


def strict(schema: dict) -> dict:
    """The CRD's structural schema as JSON Schema, refusing fields it does not declare (as the API server's strict
    field validation does) and taking int-or-string where the CRD says so."""
    s = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if schema.get("x-kubernetes-int-or-string"):
        s.pop("type", None)
        s["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable") and "type" in s:
        s["type"] = [s["type"], "null"]
    if "properties" in s:
        s["properties"] = {k: strict(v) for k, v in s["properties"].items()}
        if "additionalProperties" not in s and not schema.get("x-kubernetes-preserve-unknown-fields"):
            s["additionalProperties"] = False
    if isinstance(s.get("additionalProperties"), dict):
        s["additionalProperties"] = strict(s["additionalProperties"])
    if "items" in s:
        s["items"] = strict(s["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            s[key] = [strict(x) for x in schema[key]]
    return s


def errors(doc: dict) -> list[str]:
    import jsonschema

    crd = CRDS[doc["kind"]]
    assert doc["apiVersion"] == f"{crd['group']}/{crd['version']}"
    validator = jsonschema.Draft7Validator(strict(crd["openAPIV3Schema"]))
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def trainjob(*args: str, kind: str = "TrainJob") -> dict:
    out = helm("template", "dpsynth", str(CHART), "--namespace", "dpsynth", "--set", "trainJob.enabled=true",
               *(["--set", f"trainJob.kind={kind}"] if kind != "TrainJob" else []), *args)
    [doc] = [d for d in yaml.safe_load_all(out) if d and d["kind"] in CRDS]
    assert doc["kind"] == kind
    return doc


@tools
@pytest.mark.parametrize("kind", CRDS)
def test_no_trainjob_unless_enabled(kind):
    out = helm("template", "dpsynth", str(CHART), "--namespace", "dpsynth", "--set", f"trainJob.kind={kind}")
    assert all(d["kind"] not in CRDS for d in yaml.safe_load_all(out) if d)


@tools
@pytest.mark.parametrize("variant", ["default", "gpu"])
def test_trainjob_validates_against_the_crd(variant):
    doc = trainjob(*VARIANTS[variant], "--set", "trainJob.numNodes=2",
                   "--set", "trainJob.args={--set,data.uri=s3://bucket/mnist.parquet}")
    assert errors(doc) == []
    t = doc["spec"]["trainer"]
    assert t["command"] == ["torchrun", "-m", "dpsynth", "train"] and t["numNodes"] == 2
    assert t["args"][-2:] == ["--set", "data.uri=s3://bucket/mnist.parquet"]
    env = {e["name"]: e["valueFrom"] for e in t["env"]}
    assert env["DPSYNTH_LEDGER_URL"]["secretKeyRef"]["name"].endswith("-stage")  # the job's one ledger, rank 0 charges
    assert env["MLFLOW_TRACKING_URI"]["configMapKeyRef"]["name"].endswith("-stage-config")
    assert doc["spec"]["runtimeRef"]["name"] == "torch-distributed"


@tools
def test_gpu_trainjob_requests_gpus_and_the_gpu_pool():
    doc = trainjob(*VARIANTS["gpu"], "--set", "trainJob.gpusPerNode=4", "--set", "trainJob.numProcPerNode=4")
    assert errors(doc) == []
    t = doc["spec"]["trainer"]
    assert t["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "4" and t["numProcPerNode"] == 4
    assert t["args"][:2] == ["--set", "train.device=cuda"]
    security, patch = doc["spec"]["runtimePatches"]
    assert security["manager"] == "dpsynth.io/pod-security" and patch["manager"] == "dpsynth.io/chart"
    assert t["image"] == "dpsynth-stage:cuda"  # GPU ranks: the CUDA image
    [node] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    assert node["name"] == "node" and pod["nodeSelector"]["dpsynth.io/pool"] == "gpu"
    assert {t["key"] for t in pod["tolerations"]} == {"nvidia.com/gpu", "dpsynth.io/pool"}
    cpu = trainjob()  # no GPU: no GPU limit, no pool
    assert "resourcesPerNode" not in cpu["spec"]["trainer"] and cpu["spec"]["trainer"]["image"] == "dpsynth-stage:cpu"
    assert [p["manager"] for p in cpu["spec"]["runtimePatches"]] == ["dpsynth.io/pod-security"]


def changed(job: dict, path: tuple, value) -> dict:
    """A copy of ``job`` with the field at ``path`` set to ``value``."""
    job = copy.deepcopy(job)
    node = job
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return job


@tools
def test_the_crd_validation_is_not_vacuous():
    good = trainjob()
    for path, value in [(("spec", "trainer", "numProcsPerNode"), 2),  # a typo'd field
                        (("spec", "trainer", "numNodes"), "two"),  # a wrong type
                        (("spec", "runtimeRef", "name"), "")]:  # below minLength
        assert errors(changed(good, path, value)), path


@tools
def test_values_schema_refuses_a_bad_trainjob():
    import subprocess

    from tests.deploy.test_chart import HELM

    proc = subprocess.run([str(HELM), "lint", "--strict", str(CHART), "--set", "trainJob.numProcPerNode=0"],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "numProcPerNode" in proc.stdout + proc.stderr


@tools
def test_the_pipelines_trainjob_template_and_its_launcher():
    """Rendered always: the TrainJob template ConfigMap the orchestrators' launcher fills (a valid TrainJob on the GPU
    pool), named in the stage ConfigMap; the launcher's ServiceAccount (named in Airflow's env) and a Role that may
    manage TrainJobs and read pod logs, bound to extra subjects too (e.g. the KFP run's service account)."""
    out = helm("template", "dpsynth", str(CHART), "--namespace", "dpsynth", *VARIANTS["gpu"],
               "--set-json", f"trainJob.launcher.extraSubjects=[{{\"kind\": \"ServiceAccount\", \"name\": \"default-editor\", "
               "\"namespace\": \"kubeflow-user\"}]")
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}
    template = yaml.safe_load(docs[("ConfigMap", "dpsynth-trainjob")]["data"]["trainjob.yaml"])
    assert errors(template) == [] and template["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "1"
    assert docs[("ConfigMap", "dpsynth-trainjob")]["metadata"]["namespace"] == "dpsynth-stages"  # values-gpu's
    assert docs[("ConfigMap", "dpsynth-stage-config")]["data"]["DPSYNTH_TRAINJOB_TEMPLATE"] == "dpsynth-trainjob"
    assert docs[("ConfigMap", "dpsynth-airflow-env")]["data"]["DPSYNTH_TRAIN_LAUNCHER_SERVICE_ACCOUNT"] == \
        "dpsynth-train-launcher"
    assert ("ServiceAccount", "dpsynth-train-launcher") in docs
    rules = {(r["apiGroups"][0], tuple(r["resources"])): r for r in docs[("Role", "dpsynth-train-launcher")]["rules"]}
    assert {"create", "get", "delete"} <= set(rules[("trainer.kubeflow.org", ("trainjobs",))]["verbs"])
    assert rules[("", ("configmaps",))]["resourceNames"] == ["dpsynth-trainjob"]
    assert "pods/log" in rules[("", ("pods", "pods/log"))]["resources"]
    subjects = docs[("RoleBinding", "dpsynth-train-launcher")]["subjects"]
    assert [s["name"] for s in subjects] == ["dpsynth-train-launcher", "default-editor"]


# --- trainJob.kind=PyTorchJob: the older Kubeflow training operator (kubeflow.org/v1) -----------------------------
@tools
@pytest.mark.parametrize("variant", ["default", "gpu"])
@pytest.mark.parametrize("nodes, gpus", [(1, 0), (2, 0), (1, 2), (2, 2)])
def test_pytorchjob_validates_against_the_crd(variant, nodes, gpus):
    """The standalone PyTorchJob: a Master replica (node 0, so rank 0) and nodes − 1 Workers, each one ``pytorch``
    container running torchrun (its rendezvous from the PET_* env the operator sets), the stage's settings as env, and
    with GPUs their limit and the GPU pool's placement."""
    doc = trainjob(*VARIANTS[variant], "--set", f"trainJob.numNodes={nodes}", "--set", f"trainJob.gpusPerNode={gpus}",
                   "--set", "trainJob.numProcPerNode=2", "--set", "trainJob.args={--set,data.uri=s3://b/mnist.parquet}",
                   kind="PyTorchJob")
    assert errors(doc) == []
    spec = doc["spec"]
    assert spec["nprocPerNode"] == "2" and spec["runPolicy"]["cleanPodPolicy"] == "Running"
    replicas = spec["pytorchReplicaSpecs"]
    assert {k: r["replicas"] for k, r in replicas.items()} == {"Master": 1, **({"Worker": 1} if nodes == 2 else {})}
    for r in replicas.values():
        assert r["restartPolicy"] == "Never"
        pod = r["template"]["spec"]
        [c] = pod["containers"]
        assert c["name"] == "pytorch" and c["command"] == ["torchrun", "-m", "dpsynth", "train"]
        device = ["--set", "train.device=cuda"] if gpus else []
        assert c["args"] == [*device, "--set", "data.uri=s3://b/mnist.parquet"]
        env = {e["name"]: e["valueFrom"] for e in c["env"]}
        assert env["DPSYNTH_LEDGER_URL"]["secretKeyRef"]["name"].endswith("-stage")
        assert env["MLFLOW_TRACKING_URI"]["configMapKeyRef"]["name"].endswith("-stage-config")
        if gpus:
            assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
            assert pod["nodeSelector"] and {t["key"] for t in pod["tolerations"]} >= {"nvidia.com/gpu"}
        else:
            assert "resources" not in c and "nodeSelector" not in pod and "tolerations" not in pod


@tools
def test_the_pytorchjob_crd_validation_is_not_vacuous():
    good = trainjob("--set", "trainJob.numNodes=2", kind="PyTorchJob")
    assert errors(good) == []
    container = ("spec", "pytorchReplicaSpecs", "Worker", "template", "spec", "containers", 0)
    for path, value in [(("spec", "numProcPerNode"), 2),  # the TrainJob's field name
                        (("spec", "nprocPerNode"), 2),  # a string in the CRD
                        (("spec", "pytorchReplicaSpecs", "Master", "replicas"), "one"),
                        ((*container, "imagePullPolcy"), "Always")]:  # a typo deep in the pod template
        assert errors(changed(good, path, value)), path


@tools
def test_values_schema_refuses_an_unknown_kind():
    import subprocess

    from tests.deploy.test_chart import HELM

    proc = subprocess.run([str(HELM), "lint", "--strict", str(CHART), "--set", "trainJob.kind=MPIJob"],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "/trainJob/kind" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    helm("lint", "--strict", str(CHART), "--set", "trainJob.kind=PyTorchJob")


@tools
def test_the_launchers_role_follows_the_kind():
    out = helm("template", "dpsynth", str(CHART), "--namespace", "dpsynth", "--set", "trainJob.kind=PyTorchJob")
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}
    template = yaml.safe_load(docs[("ConfigMap", "dpsynth-trainjob")]["data"]["trainjob.yaml"])
    assert template["kind"] == "PyTorchJob" and errors(template) == []
    rules = {(r["apiGroups"][0], tuple(r["resources"])): r for r in docs[("Role", "dpsynth-train-launcher")]["rules"]}
    assert {"create", "get", "delete"} <= set(rules[("kubeflow.org", ("pytorchjobs",))]["verbs"])
    assert not any(group == "trainer.kubeflow.org" for group, _ in rules)
