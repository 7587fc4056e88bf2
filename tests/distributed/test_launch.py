"""dpsynth train --launch torchrun | trainjob (dpsynth.distributed.launch): the train stage started on train.nodes ×
train.gpus_per_node ranks by the orchestrators.

The job launcher is checked two ways without a cluster, for both kinds the chart renders (trainJob.kind: a
Kubeflow Trainer TrainJob, or the older training operator's PyTorchJob): the job it builds from the chart's template
validates against that kind's CRD schema (as tests/deploy/test_trainjob.py does for the chart), and it drives a
local stand-in of the controller (:class:`LocalTrainer`: a TrainJob of one node runs its trainer command here on
its ranks, forked as torchrun would start them; a PyTorchJob runs each replica's torchrun with the rendezvous env the
training operator sets; the conditions follow those processes) from creation to the printed outcome.
"""

from __future__ import annotations

import copy
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dpsynth.config import load_config
from dpsynth.errors import ConfigError
from dpsynth.distributed import launch
from tests.deploy.test_chart import CHART, VARIANTS, helm, tools
from tests.methods import distributed_workers as workers
# the stage tests' fixtures, as in tests/stages (autouse there and here: ledger_with_budget, one_torch_thread)
from tests.stages.conftest import ledger_with_budget, one_torch_thread  # noqa: F401 (autouse fixtures)
from tests.stages.helpers import TINY, dpsynth, manifest, settings, stages
from tests.stages.test_no_raw_hashes import hits, sensitive_hashes

TORCHRUN = Path(sys.executable).with_name("torchrun")
TEMPLATE = {  # the shape of the chart's template (the chart's own is checked in test_trainjob_from_the_charts_template)
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "dpsynth-train"},
    "spec": {"runtimeRef": {"name": "torch-distributed"},
             "trainer": {"image": "dpsynth-stage:cpu", "command": ["torchrun", "-m", "dpsynth", "train"], "args": []}}}
PYTORCHJOB = {  # the shape of the chart's PyTorchJob template (trainJob.kind=PyTorchJob)
    "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "dpsynth-train"},
    "spec": {"nprocPerNode": "1", "pytorchReplicaSpecs": {"Master": {
        "replicas": 1, "restartPolicy": "Never", "template": {"spec": {"containers": [
            {"name": "pytorch", "image": "dpsynth-stage:cpu", "command": ["torchrun", "-m", "dpsynth", "train"],
             "args": []}]}}}}}}
TEMPLATES = {"TrainJob": TEMPLATE, "PyTorchJob": PYTORCHJOB}


def test_shape_fields_are_validated_and_in_no_fingerprint():
    from dpsynth.stages.protocol import fingerprint

    for field in ("train.nodes", "train.gpus_per_node"):
        with pytest.raises(ConfigError, match=f"^{field}: must be an integer >= 1, got 0"):
            load_config(overrides=[f"{field}=0"])
    one, many = load_config(), load_config(overrides=["train.nodes=2", "train.gpus_per_node=4"])
    assert launch.shape(one) == {"nodes": 1, "gpus_per_node": 1, "ranks": 1, "distributed": False}
    assert launch.shape(many) == {"nodes": 2, "gpus_per_node": 4, "ranks": 8, "distributed": True}
    assert launch.shape(load_config(overrides=["train.gpus_per_node=2"]))["distributed"]
    # a checkpoint (config fingerprint) and a stage's outputs (stage fingerprint) carry over between shapes
    assert one.fingerprint() == many.fingerprint()
    assert fingerprint(one, ("data", "train", "privacy")) == fingerprint(many, ("data", "train", "privacy"))
    assert one.fingerprint() != load_config(overrides=["train.steps=3"]).fingerprint()  # the others still count


def test_trainjob_names_are_rfc1035_labels_stable_and_distinct():
    ids = ["af-e2e", "manual__2026-11-24T14-00-00-00-00", "3f0c2a9e-1b7d-4c55-9a0e-5e2f6a7b8c9d", "X" * 300, "--",
           "ÜBER run", "manual__2026-11-24T14-00-00-00-01"]
    names = [launch.trainjob_name(i) for i in ids]
    assert all(re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", n) and len(n) <= 40 for n in names), names
    assert len(set(names)) == len(ids) and names == [launch.trainjob_name(i) for i in ids]


def test_stage_argv_drops_only_the_launch(tmp_path):
    from dpsynth.cli import build_parser

    argv = ["train", "--config", "c.yaml", "--set", "a.b=1", "--set", "c.d=x y", "--run-dir", "s3://b/r",
            "--parent-run-id", "P", "--pipeline-run-id", "R", "--force", "--json"]
    args = build_parser().parse_args([*argv[:1], "--launch", "trainjob", *argv[1:]])
    assert launch.stage_argv(args) == argv


@pytest.mark.parametrize("argv, field", [
    (["--launch", "trainjob"], "pipeline.run_dir"),  # not the stage
    (["--launch", "torchrun", "--run-dir", "{run}", "--set", "train.method=gswgan_federated"], "train.method"),
    (["--launch", "torchrun", "--run-dir", "{run}", "--set", "train.nodes=2"], "train.nodes"),  # one machine
    (["--launch", "trainjob", "--run-dir", "{run}"], launch.TEMPLATE_ENV),  # no template named
])
def test_launch_refusals_name_the_setting_and_start_nothing(tmp_path, monkeypatch, capsys, argv, field):
    monkeypatch.delenv(launch.TEMPLATE_ENV, raising=False)
    monkeypatch.setattr(launch, "Cluster", lambda: pytest.fail("no cluster may be contacted"))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("nothing may be started"))
    run = tmp_path / "run"
    code = dpsynth("train", *[a.format(run=run) for a in argv], "--set", "ledger.population_id=p")
    assert code == 2 and field in capsys.readouterr().err
    assert not run.exists()


# --- the TrainJob, against the CRD ---------------------------------------------------------------------------
def chart_template(*values: str) -> dict:
    out = helm("template", "dpsynth", str(CHART), "--namespace", "dpsynth", *values)
    [cm] = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith(
        "-trainjob")]
    return yaml.safe_load(cm["data"][launch.TEMPLATE_KEY])


def trainjob_for(template: dict, *overrides: str) -> tuple[dict, list[str]]:
    cfg = load_config(overrides=["train.nodes=2", "train.gpus_per_node=4", *overrides])
    argv = ["train", "--set", "data.uri=s3://b/d.parquet", "--run-dir", "s3://b/runs/r1", "--pipeline-run-id", "r1",
            "--json"]
    return launch.trainjob_manifest(template, cfg, argv, name=launch.trainjob_name("r1"), namespace="dpsynth",
                                    pipeline_run_id="r1"), argv


@tools
def test_trainjob_from_the_charts_template_validates_against_the_crd():
    from tests.deploy.test_trainjob import errors

    for variant in ("default", "gpu"):
        template = chart_template(*VARIANTS[variant])
        assert errors(template) == []  # the template as rendered is a valid TrainJob
        job, argv = trainjob_for(template)
        assert errors(job) == [], variant
        t = job["spec"]["trainer"]
        assert t["command"] == ["torchrun", "-m", "dpsynth"] and t["args"] == argv  # every rank: the stage itself
        assert (t["numNodes"], t["numProcPerNode"], t["resourcesPerNode"]["limits"]["nvidia.com/gpu"]) == (2, 4, "4")
        assert job["metadata"]["name"] == launch.trainjob_name("r1")
        assert job["metadata"]["annotations"][launch.ANNOTATION] == "r1"
        patches = {p["manager"]: p for p in job["spec"]["runtimePatches"]}
        patch = patches["dpsynth.io/chart"]  # the chart's GPU pool placement
        [node] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        pod = node["template"]["spec"]["template"]["spec"]
        assert pod["tolerations"] and pod["nodeSelector"]
        env = {e["name"] for e in t["env"]}
        assert {"DPSYNTH_LEDGER_URL", "MLFLOW_TRACKING_URI", "AWS_ACCESS_KEY_ID"} <= env
        cpu, _ = trainjob_for(template, "train.device=cpu")  # CPU ranks: no GPU, no GPU pool
        # the pod security patch stays (#55 item 2); the GPU pool's placement goes
        assert errors(cpu) == [] and [p["manager"] for p in cpu["spec"]["runtimePatches"]] == ["dpsynth.io/pod-security"]
        assert "nvidia.com/gpu" not in (cpu["spec"]["trainer"].get("resourcesPerNode") or {}).get("limits", {})
    bad = copy.deepcopy(job)
    bad["spec"]["trainer"]["numNodes"] = "two"
    assert errors(bad)  # the validation is not vacuous
    with pytest.raises(ConfigError, match=launch.TEMPLATE_ENV):
        launch.trainjob_manifest({"kind": "Pod"}, load_config(), [], name="x", namespace="n", pipeline_run_id="r")


@tools
@pytest.mark.parametrize("variant", ["default", "gpu"])
def test_pytorchjob_from_the_charts_template_validates_against_the_crd(variant):
    """trainJob.kind=PyTorchJob: the launcher's job for 1 and 2 nodes, GPU and CPU ranks, is a valid PyTorchJob whose
    Master replica is node 0 and whose replicas all run the stage under torchrun (rendezvous: the operator's env)."""
    from tests.deploy.test_trainjob import errors

    template = chart_template(*VARIANTS[variant], "--set", "trainJob.kind=PyTorchJob")
    assert template["kind"] == "PyTorchJob" and errors(template) == []
    for nodes, device in [(1, "cuda"), (2, "cuda"), (1, "cpu"), (2, "cpu")]:
        job, argv = trainjob_for(template, f"train.nodes={nodes}", f"train.device={device}")
        assert errors(job) == [], (variant, nodes, device)
        assert job["metadata"]["name"] == launch.trainjob_name("r1") and job["spec"]["nprocPerNode"] == "4"
        assert job["metadata"]["annotations"][launch.ANNOTATION] == "r1"
        replicas = job["spec"]["pytorchReplicaSpecs"]
        assert {k: r["replicas"] for k, r in replicas.items()} == ({"Master": 1, "Worker": nodes - 1} if nodes > 1
                                                                    else {"Master": 1})
        for r in replicas.values():
            pod = r["template"]["spec"]
            [c] = pod["containers"]
            assert c["name"] == "pytorch" and c["command"] == ["torchrun", "-m", "dpsynth"] and c["args"] == argv
            assert r["restartPolicy"] == "Never"
            assert {"DPSYNTH_LEDGER_URL", "MLFLOW_TRACKING_URI", "AWS_ACCESS_KEY_ID"} <= {e["name"] for e in c["env"]}
            limits = (c.get("resources") or {}).get("limits") or {}
            if device == "cuda":
                assert limits["nvidia.com/gpu"] == "4" and pod["nodeSelector"] and pod["tolerations"]
            else:
                assert "nvidia.com/gpu" not in limits and "nodeSelector" not in pod and "tolerations" not in pod
    bad = copy.deepcopy(job)
    bad["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "one"
    assert errors(bad)  # the validation is not vacuous
    with pytest.raises(ConfigError, match="no Master replica with a 'pytorch' container"):
        launch.trainjob_manifest({**PYTORCHJOB, "spec": {"pytorchReplicaSpecs": {}}}, load_config(), [], name="x",
                                 namespace="n", pipeline_run_id="r")


@pytest.mark.parametrize("template", [{"apiVersion": "kubeflow.org/v1", "kind": "MPIJob", "spec": {}},
                                      {**PYTORCHJOB, "apiVersion": "trainer.kubeflow.org/v1alpha1"}, ["a list"]])
def test_a_template_of_another_kind_is_refused_naming_the_chart_value(tmp_path, monkeypatch, template):
    cluster = LocalTrainer(tmp_path, template)
    monkeypatch.setenv(launch.TEMPLATE_ENV, "dpsynth-trainjob")
    from dpsynth.cli import build_parser

    args = build_parser().parse_args(["train", "--launch", "trainjob", "--run-dir", str(tmp_path / "run")])
    with pytest.raises(ConfigError, match=r"^trainJob.kind: .* not one of TrainJob \(trainer.kubeflow.org/v1alpha1\), "
                                          r"PyTorchJob \(kubeflow.org/v1\)"):
        launch.run_trainjob(load_config(overrides=list(TINY)), args, report=print, cluster=cluster)
    assert not cluster.created


def test_each_kind_finishes_on_its_own_conditions():
    """TrainJob: Complete / Failed; PyTorchJob (training operator v1, common_types.go): Succeeded / Failed, after
    Created and Running, which do not end it."""
    def job(kind, *conditions):
        return {"kind": kind, "status": {"conditions": [{"type": t, "status": v} for t, v in conditions]}}

    assert launch.condition(job("TrainJob", ("Complete", "True"))) == "Complete"
    assert launch.condition(job("TrainJob", ("Succeeded", "True"))) is None
    assert launch.condition(job("PyTorchJob", ("Created", "True"), ("Running", "True"))) is None
    assert launch.condition(job("PyTorchJob", ("Created", "True"), ("Running", "False"),
                                ("Succeeded", "True"))) == "Succeeded"
    assert launch.condition(job("PyTorchJob", ("Complete", "True"))) is None
    assert launch.condition(job("PyTorchJob", ("Restarting", "True"), ("Failed", "True"))) == "Failed"
    assert launch.condition(job("PyTorchJob", ("Failed", "False"))) is None


def test_the_clusters_calls_name_each_kinds_api_and_pods():
    """:class:`launch.Cluster` against recording fakes of the Kubernetes client: each kind's group, version and plural
    (kubeflow/trainer's trainjob_types.go; kubeflow/training-operator's pytorch_types.go) and the labels its controller
    puts on the first node's pod (JobSet's; the training operator's pytorchjob_controller.go, replica type in lower
    case)."""
    calls = []

    class Recorder:
        def __getattr__(self, method):
            def call(*args, **kwargs):
                calls.append((method, args, kwargs))
                return type("Pods", (), {"items": []})()
            return call

    cluster = launch.Cluster.__new__(launch.Cluster)
    cluster.objects, cluster.core, cluster.namespace = Recorder(), Recorder(), "ns"
    expected = {"TrainJob": (("trainer.kubeflow.org", "v1alpha1", "ns", "trainjobs"),
                             "jobset.sigs.k8s.io/jobset-name=j,batch.kubernetes.io/job-completion-index=0"),
                "PyTorchJob": (("kubeflow.org", "v1", "ns", "pytorchjobs"),
                               "training.kubeflow.org/job-name=j,training.kubeflow.org/replica-type=master,"
                               "training.kubeflow.org/replica-index=0")}
    for name, (api, selector) in expected.items():
        kind = launch.KINDS[name]
        calls.clear()
        cluster.get(kind, "j")
        cluster.create(kind, {"kind": name})
        cluster.delete(kind, "j")
        assert cluster.first_node_pod(kind, "j") is None
        assert [(m, a[:4]) for m, a, _ in calls[:3]] == [("get_namespaced_custom_object", api),
                                                         ("create_namespaced_custom_object", api),
                                                         ("delete_namespaced_custom_object", api)]
        assert calls[3][0] == "list_namespaced_pod" and calls[3][2]["label_selector"] == selector
        assert launch.KINDS[name].api_version == "/".join(api[:2])


# --- the launcher, against a local stand-in of the controllers ---------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalTrainer:
    """The API calls of :class:`dpsynth.distributed.launch.Cluster`, served here. A created job runs on this machine: a
    TrainJob of one node runs its trainer command on numProcPerNode ranks, forked from one warm interpreter
    (tests/methods/distributed_workers.py) in place of the runtime's torchrun and its fresh interpreters (a real
    torchrun job of that command: tests/distributed/test_train_torchrun.py); a PyTorchJob runs one process per replica (Master first, then the Workers),
    each its container's ``torchrun`` command with the environment the training operator v1 sets (PET_NNODES,
    PET_NODE_RANK: Master 0, Worker i → i + 1, PET_NPROC_PER_NODE, PET_MASTER_ADDR/PORT, MASTER_ADDR/PORT, WORLD_SIZE,
    RANK; the loopback address in place of the Master's service). The first node's log is its processes' output; the
    job's condition follows the processes: success once all exited 0, Failed (the others killed) once one failed."""

    namespace = "dpsynth"
    CONDITIONS = {"TrainJob": (("Complete", "JobsDone"), ("Failed", "TrainerFailed")),  # their controllers' words
                  "PyTorchJob": (("Succeeded", "PyTorchJobSucceeded"), ("Failed", "PyTorchJobFailed"))}

    def __init__(self, tmp: Path, template: dict = TEMPLATE):
        self.tmp, self._template, self.jobs, self.procs = tmp, template, {}, {}
        self.created, self.deleted = [], []

    def template(self, config_map: str) -> dict:
        assert config_map == "dpsynth-trainjob"
        return copy.deepcopy(self._template)

    def get(self, kind, name: str) -> dict | None:
        job = self.jobs.get(name)
        assert job is None or job["kind"] == kind.kind
        codes = [p.poll() for p in self.procs.get(name, [])]
        failed = next((c for c in codes if c not in (0, None)), None)
        if job is not None and codes and (failed is not None or all(c == 0 for c in codes)):
            for p in self.procs[name]:  # the others, e.g. a rank waiting for the failed one
                if p.poll() is None:
                    p.kill()
                    p.wait()
            type_, reason = self.CONDITIONS[job["kind"]][failed is not None]
            job["status"] = {"conditions": [{"type": type_, "status": "True", "reason": reason,
                                             "message": f"exit {failed or 0}"}]}
        return copy.deepcopy(job)

    def nodes(self, body: dict) -> list[tuple[list[str], dict]]:
        """The command line and extra environment of each node of the job, the first node first."""
        if body["kind"] == "TrainJob":
            t = body["spec"]["trainer"]
            assert t["numNodes"] == 1 and t["command"][0] == "torchrun"
            return [([str(TORCHRUN), "--standalone", "--nproc-per-node", str(t["numProcPerNode"]), *t["command"][1:],
                      *t["args"]], {})]
        spec, port = body["spec"], str(free_port())
        replicas = spec["pytorchReplicaSpecs"]
        assert replicas["Master"]["replicas"] == 1 and set(replicas) <= {"Master", "Worker"}
        pods = [replicas["Master"]] + [replicas.get("Worker")] * (replicas.get("Worker") or {}).get("replicas", 0)
        nproc = spec.get("nprocPerNode", "1")
        nodes = []
        for rank, replica in enumerate(pods):
            [c] = [c for c in replica["template"]["spec"]["containers"] if c["name"] == "pytorch"]
            assert c["command"][0] == "torchrun"
            env = {"PET_NNODES": str(len(pods)), "PET_NODE_RANK": str(rank), "PET_NPROC_PER_NODE": nproc,
                   "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": port, "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": port, "WORLD_SIZE": str(len(pods) * int(nproc)), "RANK": str(rank)}
            nodes.append(([str(TORCHRUN), *c["command"][1:], *c["args"]], env))
        return nodes

    def create(self, kind, body: dict) -> None:
        name = body["metadata"]["name"]
        assert name not in self.jobs and body["kind"] == kind.kind
        self.jobs[name] = copy.deepcopy(body)
        self.created.append(copy.deepcopy(body))
        self.procs[name] = []
        for i, (command, env) in enumerate(self.nodes(body)):
            log = self.tmp / (f"{name}.log" if i == 0 else f"{name}-{i}.log")
            if body["kind"] == "TrainJob":  # torchrun --standalone --nproc-per-node N -m dpsynth ARGS
                log.touch()  # `dpsynth ARGS` on N ranks of one job, forked as torchrun starts them; their output, the log
                self.procs[name].append(workers.start_ranks(int(command[3]), self.tmp, workers.cli_rank, str(self.tmp),
                                                            command[command.index("-m") + 2:], str(log)))
                continue
            with open(log, "wb") as out:
                self.procs[name].append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                                         env={**os.environ, "OMP_NUM_THREADS": "1", **env}))

    def delete(self, kind, name: str) -> None:
        self.deleted.append(name)
        for proc in self.procs.pop(name, []):
            proc.kill()
            proc.wait()
        self.jobs.pop(name, None)

    def first_node_pod(self, kind, name: str) -> str | None:
        return f"{name}-node-0-0" if name in self.procs else None

    def log_lines(self, pod: str):
        name = pod.removesuffix("-node-0-0")
        with open(self.tmp / f"{name}.log", "rb") as f:
            while True:
                line = f.readline()
                if line:
                    yield line.decode(errors="replace").rstrip("\n")
                elif self.procs[name][0].poll() is not None:
                    return
                else:
                    time.sleep(0.2)


def launched(tmp_path, monkeypatch, capsys, run: Path, source: str, cluster: LocalTrainer, *overrides: str):
    monkeypatch.setenv(launch.TEMPLATE_ENV, "dpsynth-trainjob")
    monkeypatch.setattr(launch, "Cluster", lambda: cluster)
    monkeypatch.setattr(launch, "run_trainjob",
                        lambda cfg, args, report, run=launch.run_trainjob: run(cfg, args, report=report, poll_s=0.5))
    capsys.readouterr()  # what came before
    code = dpsynth("train", "--launch", "trainjob", "--run-dir", run, "--pipeline-run-id", "r-1",
                   *settings(source, *overrides), "--json")
    out, err = capsys.readouterr()
    return code, out, err


SHAPES = {"TrainJob": ("train.nodes=1", "train.gpus_per_node=2"),  # the TrainJob stand-in runs one node
          "PyTorchJob": ("train.nodes=2", "train.gpus_per_node=1")}  # two replicas: Master (rank 0) and a Worker


@pytest.mark.parametrize("kind", ["TrainJob", pytest.param("PyTorchJob", marks=pytest.mark.slow)])  # ~30 s each
def test_trainjob_launch_end_to_end_on_a_local_stand_in(tmp_path, monkeypatch, capsys, source, ledger_with_budget,
                                                        kind):
    """A failed job left by an earlier attempt of the run is replaced; the new one (2 ranks, gloo: a TrainJob of
    1 node × 2 ranks, a PyTorchJob of 2 nodes × 1 rank meeting at the rendezvous its operator sets) trains the stage;
    the launcher copies rank 0's messages to stderr and prints the stage's outcome."""
    run = tmp_path / "run"
    stages(run, source, "partition", "pretrain", overrides=["partition.num_shards=1"])
    cluster = LocalTrainer(tmp_path, TEMPLATES[kind])
    name = launch.trainjob_name("r-1")
    cluster.jobs[name] = {**copy.deepcopy(TEMPLATES[kind]), "status": {"conditions": [
        {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "an earlier attempt"}]}}
    code, out, err = launched(tmp_path, monkeypatch, capsys, run, source, cluster, "partition.num_shards=1",
                              *SHAPES[kind], "train.device=cpu", "train.steps=6")
    assert code == 0, err[-4000:]
    assert cluster.deleted == [name] and [b["metadata"]["name"] for b in cluster.created] == [name]
    [job] = cluster.created
    [args] = {json.dumps(command[command.index("train"):]) for command, _ in cluster.nodes(job)}  # every node alike
    assert "--launch" not in json.loads(args) and len(cluster.nodes(job)) == (2 if kind == "PyTorchJob" else 1)
    outcome = json.loads(out)
    trained = manifest(run, "sensitive", "train")
    assert outcome["status"] == "succeeded" and trained["details"]["ranks"] == 2
    # what the orchestrators keep is the gated view (#52 item 1): the stage's ε and its files by keyed version ids,
    # never a raw hash of a shard, of the partition or pre-training manifest, nor a per-shard count
    assert outcome["manifest"]["privacy"] == trained["privacy"]
    assert {o["uri"] for o in outcome["manifest"]["outputs"]} == {o["uri"] for o in trained["outputs"]}
    assert hits({"launch --json": out.encode()}, sensitive_hashes(run)) == []
    assert all(i.get("rows") is None for i in outcome["manifest"]["inputs"] + outcome["manifest"]["outputs"])
    nodes = 2 if kind == "PyTorchJob" else 1
    assert outcome["trainjob"] == {"kind": kind, "name": name, "namespace": "dpsynth", "nodes": nodes,
                                   "gpus_per_node": 2 // nodes, "ranks": 2, "distributed": True}
    assert "train: succeeded" in err  # rank 0's own message, copied from its node's log
    assert json.loads((run / "sensitive" / "train" / "trace.json").read_text())["events"][-1]["count"] == 6
    (charged,) = ledger_with_budget.history("mnist600")  # one attempt for the 2-rank job
    assert charged["status"] == "committed"


@pytest.mark.parametrize("kind, reason", [("TrainJob", "TrainerFailed"),
                                          pytest.param("PyTorchJob", "PyTorchJobFailed", marks=pytest.mark.slow)])
def test_a_failed_trainjob_fails_the_launch_with_its_reason(tmp_path, monkeypatch, capsys, source, kind, reason):
    """No partition yet: the ranks fail, the job's Failed condition ends the launch with exit 2 and its reason. (One
    node of 2 ranks for both kinds: with 2 nodes a Worker may fail first, and the job's failure stops the first node
    before its rank 0 has written its own error.)"""
    cluster = LocalTrainer(tmp_path, TEMPLATES[kind])
    code, out, err = launched(tmp_path, monkeypatch, capsys, tmp_path / "run", source, cluster, "train.nodes=1",
                              "train.gpus_per_node=2", "train.device=cpu")
    assert code == 2 and out == ""
    assert f"{kind} {launch.trainjob_name('r-1')} failed: {reason}" in err
    assert "sensitive/partition/manifest.json" in err  # the rank's error, copied


@pytest.mark.parametrize("kind", ["TrainJob", "PyTorchJob"])
def test_a_stopped_launcher_deletes_its_trainjob(tmp_path, monkeypatch, kind):
    cluster = LocalTrainer(tmp_path, TEMPLATES[kind])
    cluster.create = lambda k, body: cluster.jobs.__setitem__(body["metadata"]["name"], body)

    def interrupted(k, name):
        raise launch.Stopped()

    cluster.first_node_pod = interrupted  # SIGTERM while following the TrainJob
    monkeypatch.setenv(launch.TEMPLATE_ENV, "dpsynth-trainjob")
    cfg = load_config(overrides=[*TINY, "train.gpus_per_node=2"])
    from dpsynth.cli import build_parser

    args = build_parser().parse_args(["train", "--launch", "trainjob", "--run-dir", str(tmp_path / "run"),
                                      "--pipeline-run-id", "r-2"])
    with pytest.raises(launch.StageError, match="stopped"):
        launch.run_trainjob(cfg, args, report=print, cluster=cluster, poll_s=0.01)
    assert cluster.deleted == [launch.trainjob_name("r-2")] and not cluster.jobs


def test_a_refusal_of_the_kubernetes_api_is_a_clear_error(tmp_path, monkeypatch):
    from kubernetes.client.exceptions import ApiException

    cluster = LocalTrainer(tmp_path)

    def forbidden(name):
        raise ApiException(status=403, reason="Forbidden")

    cluster.template = forbidden
    monkeypatch.setenv(launch.TEMPLATE_ENV, "dpsynth-trainjob")
    from dpsynth.cli import build_parser

    args = build_parser().parse_args(["train", "--launch", "trainjob", "--run-dir", str(tmp_path / "run")])
    with pytest.raises(launch.StageError, match="403 Forbidden: permission denied .*train-launcher Role"):
        launch.run_trainjob(load_config(overrides=list(TINY)), args, report=print, cluster=cluster)
    assert not cluster.created
