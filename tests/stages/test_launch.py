"""dpsynth train --launch torchrun | trainjob (dpsynth.stages.launch): the train stage started on train.nodes ×
train.gpus_per_node ranks by the orchestrators.

The TrainJob launcher is checked two ways without a cluster: the TrainJob it builds from the chart's template
validates against the TrainJob CRD's schema (as tests/deploy/test_trainjob.py does for the chart), and it drives
a local stand-in of the Trainer controller (:class:`LocalTrainer`: a TrainJob of one node runs its trainer command
here, under torchrun --standalone, and its conditions follow that process) from creation to the printed outcome.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dpsynth.config import load_config
from dpsynth.errors import ConfigError
from dpsynth.stages import launch
from tests.deploy.test_chart import CHART, VARIANTS, helm, tools
from tests.stages.helpers import TINY, dpsynth, manifest, settings, stages

TORCHRUN = Path(sys.executable).with_name("torchrun")
TEMPLATE = {  # the shape of the chart's template (the chart's own is checked in test_trainjob_from_the_charts_template)
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "dpsynth-train"},
    "spec": {"runtimeRef": {"name": "torch-distributed"},
             "trainer": {"image": "dpsynth-stage:cpu", "command": ["torchrun", "-m", "dpsynth", "train"], "args": []}}}


def test_shape_fields_are_validated_and_in_no_fingerprint():
    from dpsynth.stages.common import fingerprint

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
        [patch] = job["spec"]["runtimePatches"]  # the chart's GPU pool placement
        [node] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        pod = node["template"]["spec"]["template"]["spec"]
        assert pod["tolerations"] and pod["nodeSelector"]
        env = {e["name"] for e in t["env"]}
        assert {"DPSYNTH_LEDGER_URL", "MLFLOW_TRACKING_URI", "AWS_ACCESS_KEY_ID"} <= env
        cpu, _ = trainjob_for(template, "train.device=cpu")  # CPU ranks: no GPU, no GPU pool
        assert errors(cpu) == [] and "runtimePatches" not in cpu["spec"]
        assert "nvidia.com/gpu" not in (cpu["spec"]["trainer"].get("resourcesPerNode") or {}).get("limits", {})
    bad = copy.deepcopy(job)
    bad["spec"]["trainer"]["numNodes"] = "two"
    assert errors(bad)  # the validation is not vacuous
    with pytest.raises(ConfigError, match=launch.TEMPLATE_ENV):
        launch.trainjob_manifest({"kind": "Pod"}, load_config(), [], name="x", namespace="n", pipeline_run_id="r")


# --- the launcher, against a local stand-in of the Trainer controller -------------------------------------------
class LocalTrainer:
    """The API calls of :class:`dpsynth.stages.launch.Cluster`, served here: a created TrainJob of one node runs its
    trainer command on this machine (``torchrun --standalone``, numProcPerNode ranks, in place of the runtime's
    rendezvous), its log is the process's output, and its condition follows the process's exit status."""

    namespace = "dpsynth"

    def __init__(self, tmp: Path, template: dict = TEMPLATE):
        self.tmp, self._template, self.jobs, self.procs = tmp, template, {}, {}
        self.created, self.deleted = [], []

    def template(self, config_map: str) -> dict:
        assert config_map == "dpsynth-trainjob"
        return copy.deepcopy(self._template)

    def get(self, name: str) -> dict | None:
        job = self.jobs.get(name)
        if job is not None and name in self.procs and (code := self.procs[name].poll()) is not None:
            kind = "Complete" if code == 0 else "Failed"
            job["status"] = {"conditions": [{"type": kind, "status": "True", "reason": "JobsDone" if code == 0
                                             else "TrainerFailed", "message": f"exit {code}"}]}
        return copy.deepcopy(job)

    def create(self, body: dict) -> None:
        name, t = body["metadata"]["name"], body["spec"]["trainer"]
        assert name not in self.jobs and t["numNodes"] == 1 and t["command"][0] == "torchrun"
        self.jobs[name] = copy.deepcopy(body)
        self.created.append(copy.deepcopy(body))
        command = [str(TORCHRUN), "--standalone", "--nproc-per-node", str(t["numProcPerNode"]), *t["command"][1:],
                   *t["args"]]
        log = open(self.tmp / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            env={**os.environ, "OMP_NUM_THREADS": "1"})

    def delete(self, name: str) -> None:
        self.deleted.append(name)
        if proc := self.procs.pop(name, None):
            proc.kill()
            proc.wait()
        self.jobs.pop(name, None)

    def first_node_pod(self, name: str) -> str | None:
        return f"{name}-node-0-0" if name in self.procs else None

    def log_lines(self, pod: str):
        name = pod.removesuffix("-node-0-0")
        with open(self.tmp / f"{name}.log", "rb") as f:
            while True:
                line = f.readline()
                if line:
                    yield line.decode(errors="replace").rstrip("\n")
                elif self.procs[name].poll() is not None:
                    return
                else:
                    time.sleep(0.2)


def launched(tmp_path, monkeypatch, capsys, run: Path, source: str, cluster: LocalTrainer, *overrides: str):
    monkeypatch.setenv(launch.TEMPLATE_ENV, "dpsynth-trainjob")
    monkeypatch.setattr(launch, "Cluster", lambda: cluster)
    monkeypatch.setattr(launch, "run_trainjob", lambda cfg, args, run=launch.run_trainjob: run(cfg, args, poll_s=0.5))
    capsys.readouterr()  # what came before
    code = dpsynth("train", "--launch", "trainjob", "--run-dir", run, "--pipeline-run-id", "r-1",
                   *settings(source, *overrides), "--json")
    out, err = capsys.readouterr()
    return code, out, err


def test_trainjob_launch_end_to_end_on_a_local_stand_in(tmp_path, monkeypatch, capsys, source, ledger_with_budget):
    """A failed TrainJob left by an earlier attempt of the run is replaced; the new one (1 node × 2 ranks, gloo)
    trains the stage; the launcher copies rank 0's messages to stderr and prints the stage's outcome."""
    run = tmp_path / "run"
    stages(run, source, "partition", "warmstart", overrides=["partition.num_shards=1"])
    cluster = LocalTrainer(tmp_path)
    name = launch.trainjob_name("r-1")
    cluster.jobs[name] = {**copy.deepcopy(TEMPLATE), "status": {"conditions": [
        {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "an earlier attempt"}]}}
    code, out, err = launched(tmp_path, monkeypatch, capsys, run, source, cluster, "partition.num_shards=1",
                              "train.gpus_per_node=2", "train.device=cpu", "train.steps=6")
    assert code == 0, err[-4000:]
    assert cluster.deleted == [name] and [b["metadata"]["name"] for b in cluster.created] == [name]
    [job] = cluster.created
    assert job["spec"]["trainer"]["numProcPerNode"] == 2 and "--launch" not in job["spec"]["trainer"]["args"]
    outcome = json.loads(out)
    trained = manifest(run, "sensitive", "train")
    assert outcome["status"] == "succeeded" and outcome["manifest"] == trained and trained["details"]["ranks"] == 2
    assert outcome["trainjob"] == {"name": name, "namespace": "dpsynth", "nodes": 1, "gpus_per_node": 2, "ranks": 2,
                                   "distributed": True}
    assert "train: succeeded" in err  # rank 0's own message, copied from its node's log
    assert json.loads((run / "sensitive" / "train" / "trace.json").read_text())["events"][-1]["count"] == 6
    (charged,) = ledger_with_budget.history("mnist600")  # one attempt for the 2-rank job
    assert charged["status"] == "committed"


def test_a_failed_trainjob_fails_the_launch_with_its_reason(tmp_path, monkeypatch, capsys, source):
    """No partition yet: the ranks fail, the TrainJob's Failed condition ends the launch with exit 2 and its reason."""
    cluster = LocalTrainer(tmp_path)
    code, out, err = launched(tmp_path, monkeypatch, capsys, tmp_path / "run", source, cluster,
                              "train.gpus_per_node=2", "train.device=cpu")
    assert code == 2 and out == ""
    assert "failed: TrainerFailed" in err and "sensitive/partition/manifest.json" in err  # the rank's error, copied


def test_a_stopped_launcher_deletes_its_trainjob(tmp_path, monkeypatch):
    cluster = LocalTrainer(tmp_path)
    cluster.create = lambda body: cluster.jobs.__setitem__(body["metadata"]["name"], body)

    def interrupted(name):
        raise launch.Stopped()

    cluster.first_node_pod = interrupted  # SIGTERM while following the TrainJob
    monkeypatch.setenv(launch.TEMPLATE_ENV, "dpsynth-trainjob")
    cfg = load_config(overrides=[*TINY, "train.gpus_per_node=2"])
    from dpsynth.cli import build_parser

    args = build_parser().parse_args(["train", "--launch", "trainjob", "--run-dir", str(tmp_path / "run"),
                                      "--pipeline-run-id", "r-2"])
    with pytest.raises(launch.StageError, match="stopped"):
        launch.run_trainjob(cfg, args, cluster=cluster, poll_s=0.01)
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
        launch.run_trainjob(load_config(overrides=list(TINY)), args, cluster=cluster)
    assert not cluster.created
