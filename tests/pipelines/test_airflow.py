"""The Airflow DAGs (pipelines/airflow/dags), run in the Airflow venv from the stage venv's pytest (its fixtures and
``in_airflow``: tests/airflow_fixtures.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.airflow_fixtures import AIRFLOW_BIN, KUBECONFIG, LOAD, REPO, in_airflow

STAGES = ["partition", "pretrain", "train", "audit", "sample", "evaluate"]
RELEASE = sorted([f"sample/{n}" for n in ("audit.json", "audit.md", "generator.pt", "manifest.json", "samples.png",
                                          "synthetic.parquet")] + ["evaluate/manifest.json", "evaluate/report.html", "evaluate/report.json"])
TINY = ["train.d_width=4", "train.g_width=4", "train.latent_dim=15", "warmup.steps=20", "train.batch_size=32", "sample.num_samples=200",
        "output.log_every=0", "output.sample_every=0", "output.checkpoint_every=0",
        "evaluate.epochs=1", "evaluate.feature_steps=5", "evaluate.mia_generated=200"]
# the platform's settings of these runs (DPSYNTH_STAGE_CONFIG, the chart's stage.config): no trigger's to give (#55)
PLATFORM = {"tracking": {"experiment": "airflow-test"}, "partition": {"key": "dpsynth-partition-v1"},
            "data": {"num_classes": 10}}

pytestmark = pytest.mark.skipif(not (AIRFLOW_BIN / "airflow").exists(),
                                reason=".venv/airflow is missing: `make test` creates it from requirements/airflow.lock")


def test_dags_import_and_the_form_rejects_bad_values(airflow_env):
    out = in_airflow(LOAD + """
    import copy
    from airflow.sdk.exceptions import ParamValidationError
    import dpsynth_pods
    def refused(call):  # what a caller that skips the form's validation gets
        try:
            call()
        except Exception as exc:  # AirflowFailException: a verdict on the trigger, not retried
            return str(exc)
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
        "ok": not rejected(epsilon=3.5, delta=1e-6, num_shards=4, n_d="5", population_id="mnist600",
                           audit_empirical="quick"),
        "bad": {k: rejected(**{k: v}) for k, v in [("epsilon", -1), ("epsilon", 0), ("delta", 1), ("delta", 0),
                ("method", "wgan"), ("n_d", "sometimes"), ("num_shards", 0), ("steps", 0),
                ("population_id", ""), ("population_id", "x" * 201), ("audit_empirical", "fast")]},
        "audit_sets": [[s for s in dpsynth_pods.overrides({**train.params.dump(), "audit_empirical": v})
                        if s.startswith("audit.")] for v in (None, "full")],
        "audit_refused": refused(lambda: dpsynth_pods.overrides({**train.params.dump(), "audit_empirical": "x"})),
        "population_default": train.params["population_id"],
        "retrain_schedule": type(retrain.timetable).__name__,
        "retrain_assets": [a.uri for a in retrain.timetable.asset_condition.objects],
        "outlets": [o.uri for o in bag.dags["dpsynth_import_data"].get_task("import_data").outlets],
        "settings": {f"{d.dag_id}.{t.task_id}": [t.retries, t.retry_delay.total_seconds(),
                                                 t.execution_timeout.total_seconds()]
                     for d in bag.dags.values() for t in d.tasks},
        "map_index_template": train.get_task("pretrain_shard").map_index_template,
        "parallelism": train.get_task("pretrain_shard").max_active_tis_per_dagrun,
    }))
    """, airflow_env)
    assert out["dags"] == ["dpsynth_import_data", "dpsynth_retrain_on_new_data", "dpsynth_train"]
    assert out["tasks"] == sorted(["plan", "start", "data_changed", *STAGES, "shards", "pretrain_shard", "finish"])
    assert out["mapped"] == ["pretrain_shard"]
    assert out["ok"] and all(out["bad"].values()), out["bad"]
    assert out["audit_sets"] == [[], ["audit.empirical=full"]]  # empty: the config's; one --set argument
    assert out["audit_refused"].startswith("audit_empirical (audit.empirical): must be one of auto, off, quick, full")
    assert out["population_default"] is None  # no DPSYNTH_POPULATION_ID: the config's (never a made-up one)
    assert out["retrain_schedule"] == "AssetTriggeredTimetable"
    dataset = (REPO / "outputs" / "data" / "mnist.parquet").as_uri()  # DPSYNTH_DATASET_URI's default
    assert out["outlets"] == [dataset] and out["retrain_assets"] == [dataset]
    for task, (retries, delay, timeout) in out["settings"].items():  # default_args: stages are idempotent
        assert retries == (0 if task.endswith((".finish", ".audit")) else 2) and delay == 120 and timeout == 12 * 3600, task
    assert out["map_index_template"] == "shard {{ task.op_kwargs['shard'] }}"
    assert out["parallelism"] == 8  # DPSYNTH_PRETRAIN_PARALLELISM: at most 8 shards of a run at once


def test_the_form_fields_come_from_the_config_schema_and_the_platform_settings(airflow_env):
    """Each form field that is a setting has the models' bounds, choices and description; the platform's
    settings (DPSYNTH_STAGE_CONFIG, the chart's stage.config) are the defaults, and those without a field the
    extra settings, which must name settings the models know."""
    import typing

    from dpsynth.config import TrainConfig, setting_schema

    platform = {"privacy": {"epsilon": 3}, "train": {"n_d": 5, "lr_g": 1e-4}, "warmup": {"central_images": True}}
    out = in_airflow(LOAD + """
    import copy, dpsynth_pipeline, dpsynth_pods
    from airflow.sdk.exceptions import ParamValidationError
    def refused(call):
        try:
            call()
        except Exception as exc:
            return str(exc)
    def rejected(**values):
        try:
            params = copy.deepcopy(bag.dags["dpsynth_train"].params)
            params.update(values)
            params.validate()
        except ParamValidationError:
            return True
        return False
    form = bag.dags["dpsynth_train"].params
    print(json.dumps({
        "form": {k: form.get_param(k).serialize() for k in form},
        "retrain": {k: p.serialize() for k, p in bag.dags["dpsynth_retrain_on_new_data"].params.items()},
        "settings": dpsynth_pipeline.SETTINGS,
        # the form checks an item's shape; which settings a run may name, the plan task (one line each, below)
        "overrides": {o: rejected(overrides=[o]) for o in ["train.steps 3", "Train.steps=3", "warmup.styles=3",
                                                           "privacy.noise_multiplier=2", "ledger.url=sqlite:///x.db"]},
        "plan": {o: refused(lambda: dpsynth_pods.overrides({"overrides": [o]}))
                 for o in ["train.stepz=3", "bogus.x=1", "warmup.styles=3", "privacy.noise_multiplier=2",
                           "ledger.url=sqlite:///x.db", "tracking.uri=x", "privacy.accounting=x",
                           "ledger.population_id=x", "privacy.epsilon=x"]},
    }))
    """, {**airflow_env, "DPSYNTH_STAGE_CONFIG": json.dumps(platform)})
    form, settings = out["form"], out["settings"]
    # every field but the dataset nullable: empty keeps the base config's value (#34)
    expected = {"data.uri": {"type": "string", "minLength": 1},
                "ledger.population_id": {"type": ["null", "string"], "minLength": 1, "maxLength": 200, "pattern": "\\S"},
                "train.method": {"type": ["null", "string"],
                                 "enum": [None, *typing.get_args(typing.get_type_hints(TrainConfig)["method"])]},
                "privacy.epsilon": {"type": ["null", "number"], "exclusiveMinimum": 0},
                "privacy.delta": {"type": ["null", "number"], "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                "train.steps": {"type": ["null", "integer"], "minimum": 1},
                "partition.num_shards": {"type": ["null", "integer"], "minimum": 1},
                "train.n_d": {"type": ["null", "string"], "pattern": "^(adaptive|[1-9][0-9]*)$"},
                "train.seed": {"type": ["null", "integer"], "minimum": 0},
                # nullable: empty keeps the config's setting (the config's default is auto, #33)
                "audit.empirical": {"type": ["null", "string"], "enum": [None, "auto", "off", "quick", "full"]}}
    assert sorted(settings.values()) == sorted(expected)
    for name, field in settings.items():
        schema = {k: v for k, v in form[name]["schema"].items() if k != "title"}
        assert schema == expected[field], name
        assert form[name]["description"].startswith(setting_schema(field)["description"]), name
    assert {k: form[k]["value"] for k in ("epsilon", "n_d", "delta", "steps", "method")} == {
        "epsilon": 3, "n_d": "5", "delta": None, "steps": None, "method": None}  # platform, else the config's
    assert form["overrides"]["value"] == ["train.lr_g=0.0001", "warmup.central_images=true"]
    assert out["overrides"] == {"train.steps 3": True, "Train.steps=3": True, "warmup.styles=3": False,
                                "privacy.noise_multiplier=2": False, "ledger.url=sqlite:///x.db": False}
    refused = {k: v for k, v in out["plan"].items() if v}
    assert sorted(refused) == ["bogus.x=1", "ledger.population_id=x", "ledger.url=sqlite:///x.db",
                               "privacy.accounting=x", "tracking.uri=x", "train.stepz=3"]
    assert refused["train.stepz=3"] == "extra settings: train.stepz: no such setting (`dpsynth config schema` lists them)"
    assert refused["tracking.uri=x"].startswith("extra settings: tracking.uri: not a run's setting; the platform (")
    assert out["retrain"] == form


def test_task_settings_come_from_airflow_variables_else_the_environment(airflow_env, tmp_path):
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    env = {**airflow_env, "DPSYNTH_EXECUTOR": "kubernetes", "DPSYNTH_K8S_CONFIG_FILE": str(tmp_path / "kubeconfig"),
           "AIRFLOW_VAR_DPSYNTH_TASK_RETRIES": "5",  # an Airflow Variable (environment secrets backend)
           "DPSYNTH_TASK_RETRIES": "3",               # loses to the Variable
           "DPSYNTH_K8S_STARTUP_TIMEOUT_SECONDS": "1800", "DPSYNTH_TASK_TIMEOUT_SECONDS": "600"}
    out = in_airflow(LOAD + """
    dag = bag.dags["dpsynth_train"]
    pods = [t for t in dag.tasks if type(t).__name__ == "StagePodOperator"]
    shard = dag.get_task("pretrain_shard")
    print(json.dumps({
        "pods": {t.task_id: [t.deferrable, t.startup_timeout_seconds, t.schedule_timeout_seconds, t.retries,
                             t.execution_timeout.total_seconds()] for t in pods},
        "shard": [shard.partial_kwargs["deferrable"], shard.partial_kwargs["startup_timeout_seconds"],
                  shard.map_index_template, shard.max_active_tis_per_dagrun]}))
    """, {**env, "DPSYNTH_PRETRAIN_PARALLELISM": "3"})
    assert sorted(out["pods"]) == sorted(["start", *STAGES, "train_job", "finish"])
    for task_id, settings in out["pods"].items():
        assert settings == [True, 1800, 1800, 0 if task_id in ("finish", "audit") else 5, 600], task_id
    assert out["shard"] == [True, 1800, "shard {{ task.arguments[-1] }}", 3]  # the chart's stage.pretrainParallelism


def hostile_values(tmp: Path) -> list[str]:
    """Trigger-form values that would run a command (creating a file in TMP) if a shell parsed them."""
    return [f"; touch {tmp}/semicolon", f"$(touch {tmp}/dollar)", f"`touch {tmp}/backtick`",
            f"x'; touch {tmp}/quote1; echo '", f'x"; touch {tmp}/quote2; echo "', f"x\ntouch {tmp}/newline",
            f"x && touch {tmp}/and | tee {tmp}/pipe > {tmp}/redirect", "--help", "{{ 7 * 7 }}", "a b\tc"]


FAKE_DPSYNTH = """\
import json, os, sys
with open(os.environ["FAKE_ARGV_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
print(json.dumps({"parent_run_id": "PARENT", "uri": "x", "sha256": "0" * 64, "rows": 1, "changed": True,
                  "version": "v1", "versioned_uri": "outputs/data/mnist/v1.parquet"}))
"""


@pytest.fixture
def fake_dpsynth(tmp_path) -> tuple[Path, Path]:
    """An executable standing in for ``dpsynth``: it appends its argv (JSON) to a log and prints JSON."""
    fake, log = tmp_path / "fake-dpsynth", tmp_path / "argv.jsonl"
    fake.write_text(f"#!{AIRFLOW_BIN / 'python'}\n" + FAKE_DPSYNTH)
    fake.chmod(0o755)
    return fake, log


def test_kubernetes_pods_request_gpus_for_pretrain_and_train_only(airflow_env, tmp_path):
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    env = {**airflow_env, "DPSYNTH_EXECUTOR": "kubernetes", "DPSYNTH_K8S_CONFIG_FILE": str(tmp_path / "kubeconfig"),
           "DPSYNTH_STAGE_IMAGE": "registry.example/dpsynth-stage:test",
           "DPSYNTH_GPU_NODE_SELECTOR": '{"pool": "gpu"}',
           "DPSYNTH_GPU_TOLERATIONS": '[{"key": "gpu", "operator": "Equal", "value": "a100", "effect": "NoSchedule"}]'}
    out = in_airflow(LOAD + """
    from kubernetes.client import ApiClient
    import dpsynth_pipeline, dpsynth_pods
    dag = bag.dags["dpsynth_train"]
    plan = dpsynth_pods.plan({**dag.params.dump(), "config": None}, "run-1")
    argv = {**dpsynth_pipeline.start_command.function(plan),
            **dpsynth_pipeline.stage_commands.function(plan, {"parent_run_id": "PARENT"})}
    ops = [t for t in dag.tasks if type(t).__name__ == "StagePodOperator"]
    sources = {t.task_id: [t.arguments.operator.task_id, t.arguments.key] for t in ops}
    for t in ops:  # as the XComArg resolves at run time
        t.arguments = argv[t.task_id]
    mapped = [t for t in dag.tasks if type(t).__name__ == "MappedOperator"]
    print(json.dumps({"pods": {t.task_id: ApiClient().sanitize_for_serialization(t.build_pod_request_obj()) for t in ops},
                      "sources": sources, "argv": argv, "pod_cmds": dpsynth_pods.POD_CMDS,
                      "mapped": {t.task_id: [t.operator_class.__name__ if hasattr(t.operator_class, "__name__")
                                             else t.operator_class["task_type"], sorted(t.expand_input.value)]
                                 for t in mapped},
                      "mapped_gpu": {t.task_id: str(t.partial_kwargs["container_resources"].limits) for t in mapped}}))
    """, env)
    assert out["mapped"] == {"pretrain_shard": ["StagePodOperator", ["arguments"]]}  # one pod per shard
    assert "nvidia.com/gpu" in out["mapped_gpu"]["pretrain_shard"]
    pods = out["pods"]
    assert sorted(pods) == sorted(["start", *STAGES, "train_job", "finish"])
    assert out["sources"] == {t: ["start_command" if t == "start" else "stage_commands", t] for t in pods}
    for task_id, pod in pods.items():
        spec = pod["spec"]
        container = next(c for c in spec["containers"] if c["name"] == "base")  # beside it: the XCom sidecar
        assert container["image"] == "registry.example/dpsynth-stage:test" and pod["metadata"]["namespace"] == "dpsynth"
        assert container["command"] == out["pod_cmds"] and "/airflow/xcom/return.json" in container["command"][2]
        assert container["args"] == out["argv"][task_id] and container["args"][0] == "dpsynth"
        limits = container["resources"].get("limits", {})
        if task_id in ("pretrain", "train"):
            assert limits["nvidia.com/gpu"] == "1"
            assert spec["nodeSelector"] == {"pool": "gpu"}
            assert {"key": "gpu", "operator": "Equal", "value": "a100", "effect": "NoSchedule"} in spec["tolerations"]
        else:
            assert "nvidia.com/gpu" not in limits and not spec.get("nodeSelector")
            assert not any(t.get("key") == "gpu" for t in spec.get("tolerations") or [])
    train = out["argv"]["train"]
    assert train[:2] == ["dpsynth", "train"] and train[train.index("--parent-run-id") + 1] == "PARENT"


def test_the_train_stage_on_several_ranks(airflow_env, tmp_path, fake_dpsynth):
    """`start` reports the train stage's shape; with more than one rank the local train task adds `--launch
    torchrun`, and on Kubernetes train_launch picks the train_job pod (CPU, the launcher's service account,
    `--launch trainjob`) instead of the GPU pod; audit follows whichever ran."""
    fake, log = fake_dpsynth
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    env = {**airflow_env, "DPSYNTH_EXECUTOR": "kubernetes", "DPSYNTH_K8S_CONFIG_FILE": str(tmp_path / "kubeconfig"),
           "DPSYNTH_TRAIN_LAUNCHER_SERVICE_ACCOUNT": "dpsynth-train-launcher"}
    several, one = {"parent_run_id": "P", "train": {"distributed": True}}, {"parent_run_id": "P", "train": {
        "distributed": False}}
    out = in_airflow(LOAD + f"""
    from kubernetes.client import ApiClient
    import dpsynth_pipeline, dpsynth_pods
    dag = bag.dags["dpsynth_train"]
    plan = dpsynth_pods.plan({{**dag.params.dump(), "config": None}}, "run-1")
    argv = dpsynth_pipeline.stage_commands.function(plan, {several!r})
    job = dag.get_task("train_job")
    job.arguments = argv["train_job"]
    print(json.dumps({{"argv": argv, "pod": ApiClient().sanitize_for_serialization(job.build_pod_request_obj()),
                      "choice": [dpsynth_pipeline.train_launch.function(i) for i in ({several!r}, {one!r}, {{}})],
                      "branch": sorted(dag.get_task("train_launch").downstream_task_ids),
                      "job_up": sorted(job.upstream_task_ids), "audit_up": sorted(dag.get_task("audit").upstream_task_ids),
                      "audit_rule": dag.get_task("audit").trigger_rule.value}}))
    """, env)
    assert out["argv"]["train_job"] == [*out["argv"]["train"], "--launch", "trainjob"]
    assert out["choice"] == ["train_job", "train", "train"]
    assert out["branch"] == ["train", "train_job"] and "pretrain" in out["job_up"]
    assert {"train", "train_job"} <= set(out["audit_up"]) and out["audit_rule"] == "none_failed_min_one_success"
    spec = out["pod"]["spec"]
    container = next(c for c in spec["containers"] if c["name"] == "base")
    assert spec["serviceAccountName"] == "dpsynth-train-launcher" and not spec.get("nodeSelector")
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {}) and container["args"] == out["argv"]["train_job"]

    local = {**airflow_env, "DPSYNTH_STAGE_BIN": str(fake), "FAKE_ARGV_LOG": str(log)}
    in_airflow(LOAD + f"""
    import dpsynth_pods
    dag = bag.dags["dpsynth_train"]
    plan = dpsynth_pods.plan({{**dag.params.dump(), "config": None}}, "run-1")
    for ids in ({several!r}, {one!r}):
        dag.get_task("train").python_callable(plan=plan, ids=ids)
    print(json.dumps({{}}))
    """, local)
    launched, single = (json.loads(line) for line in log.read_text().splitlines())
    assert launched == [*single, "--launch", "torchrun"] and single[0] == "train"


def run_pod_command(pod_cmds: list[str], args: list[str], fake: Path, log: Path, xcom: Path) -> None:
    """What the container runtime does with command + args: exec them (no shell around them), with
    ``dpsynth`` replaced by the fake and the XCom file by XCOM."""
    cmds = [c.replace("/airflow/xcom/return.json", str(xcom)) for c in pod_cmds]
    subprocess.run([*cmds, str(fake), *args[1:]], check=True, timeout=30, env={**os.environ, "FAKE_ARGV_LOG": str(log)})


def test_trigger_form_values_reach_stage_commands_as_inert_arguments(airflow_env, tmp_path, fake_dpsynth):
    """Hostile trigger-form values (shell metacharacters, quotes, newlines, Jinja) in every string field
    end up as single argv elements of the stage pods and of the import command, local and on Kubernetes;
    running the pods' command line executes none of them."""
    fake, log = fake_dpsynth
    marks = tmp_path / "marks"
    marks.mkdir()
    hostile = hostile_values(marks)
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    k8s = {**airflow_env, "DPSYNTH_EXECUTOR": "kubernetes", "DPSYNTH_K8S_CONFIG_FILE": str(tmp_path / "kubeconfig")}
    out = in_airflow(LOAD + f"""
    import dpsynth_pipeline, dpsynth_pods
    hostile = {hostile!r}
    train, imp = bag.dags["dpsynth_train"], bag.dags["dpsynth_import_data"]
    runs = []
    for h in hostile:
        params = {{**train.params.dump(), "dataset_uri": h, "run_root": h, "config": h, "tracking_uri": h,
                  "population_id": h, "overrides": ["train.seed=" + h]}}
        plan = dpsynth_pods.plan(params, "run-1")
        argv = {{**dpsynth_pipeline.start_command.function(plan),
                 **dpsynth_pipeline.stage_commands.function(plan, {{"parent_run_id": h}})}}
        op = imp.get_task("import_data")
        runs.append({{"argv": argv, "import": op.render_template(op.arguments, {{"params": {{"source": h}}}})}})
    print(json.dumps({{"runs": runs, "pod_cmds": dpsynth_pods.POD_CMDS}}))
    """, k8s)
    dataset = "outputs/data/mnist.parquet"  # DPSYNTH_DATASET_URI's default
    for h, run in zip(hostile, out["runs"]):
        assert run["import"] == ["dpsynth", "data", "import", "--json", "--outside", "--versioned", "--", h, dataset]
        for name, argv in run["argv"].items():
            assert h in argv and f"data.uri={h}" in argv and f"train.seed={h}" in argv, (name, argv)
            assert f"ledger.population_id={h}" in argv, (name, argv)
        for args in (run["import"], run["argv"]["train"]):
            log.unlink(missing_ok=True)
            xcom = tmp_path / "return.json"
            run_pod_command(out["pod_cmds"], args, fake, log, xcom)
            assert [json.loads(line) for line in log.read_text().splitlines()] == [args[1:]]
            assert json.loads(xcom.read_text())["parent_run_id"] == "PARENT"  # stdout went to the XCom file

    # the local executor: the import task's callable runs the stage CLI as an argv list
    local = {**airflow_env, "DPSYNTH_STAGE_BIN": str(fake), "FAKE_ARGV_LOG": str(log)}
    log.unlink(missing_ok=True)
    in_airflow(LOAD + f"""
    from airflow.sdk.execution_time.context import OutletEventAccessors
    op = bag.dags["dpsynth_import_data"].get_task("import_data")
    for h in {hostile!r}:
        op.python_callable(params={{"source": h}}, outlet_events=OutletEventAccessors())
    print(json.dumps({{}}))
    """, local)
    assert [json.loads(line) for line in log.read_text().splitlines()] == [
        ["data", "import", "--json", "--outside", "--versioned", "--", h, dataset] for h in hostile]
    assert not list(marks.iterdir()), "a hostile value ran a command"


# The real `dpsynth` behind a wrapper: it logs its argv (as FAKE_DPSYNTH does) and adds a digest and a count of the
# records to the JSON it prints, which the import task must keep out of its asset event (#33)
LEAKY_DPSYNTH = """\
import json, os, subprocess, sys
with open(os.environ["FAKE_ARGV_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
proc = subprocess.run([os.environ["REAL_DPSYNTH"], *sys.argv[1:]], stdout=subprocess.PIPE, text=True)
if proc.returncode:
    sys.exit(proc.returncode)
out = json.JSONDecoder().raw_decode(proc.stdout[proc.stdout.index("{"):])[0]
print(json.dumps({**out, "sha256": "0" * 64, "rows": 100}))
"""


@pytest.fixture(scope="module")
def deployed_and_imported(airflow_env, migrated_db, tmp_path_factory) -> dict:
    """A fresh metadata database used as a deployment first uses it (one `airflow dags test` and one
    dag-processor pass for the three tests below: each costs an Airflow start and, for `dags test`, its in-process
    execution API): `airflow variables set DPSYNTH_TASK_RETRIES 7`; one pass of the real dag-processor (what first
    stores the DAGs); then `airflow dags test dpsynth_import_data` with the real `dpsynth data import` of 100 MNIST
    records (behind LEAKY_DPSYNTH). What each step left, read right after it."""
    import sqlite3
    import zlib

    from dpsynth.data import import_source, write_parquet

    home = tmp_path_factory.mktemp("airflow_deployed")
    source, dst, log = home / "a.parquet", home / "data" / "mnist.parquet", home / "argv.jsonl"
    write_parquet(import_source(REPO / "data" / "mnist").subset(np.arange(100)), source)
    wrapper = home / "leaky-dpsynth"
    wrapper.write_text(f"#!{sys.executable}\n" + LEAKY_DPSYNTH)
    wrapper.chmod(0o755)
    env = {**airflow_env, "AIRFLOW_HOME": str(home),
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
           # a DAG file's parse was seen to take over the default 50 s on the busy 2-core machine: the processor
           # then kills it and serializes nothing (the test failed with no DAGs)
           "AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT": "300", "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "300",
           "DPSYNTH_DATASET_URI": str(dst), "DPSYNTH_STAGE_BIN": str(wrapper), "FAKE_ARGV_LOG": str(log),
           "REAL_DPSYNTH": airflow_env["DPSYNTH_STAGE_BIN"]}
    airflow = str(AIRFLOW_BIN / "airflow")
    shutil.copyfile(migrated_db, home / "airflow.db")  # `airflow db migrate`'s database, not yet used
    for args in (["variables", "set", "DPSYNTH_TASK_RETRIES", "7"], ["dag-processor", "-n", "1"]):
        subprocess.run([airflow, *args], env=env, cwd=REPO, check=True, capture_output=True, timeout=300)
    db = sqlite3.connect(home / "airflow.db")
    retries = {}
    for dag_id, data, compressed in db.execute("SELECT dag_id, data, data_compressed FROM serialized_dag"):
        dag = json.loads(data or zlib.decompress(compressed))["dag"]
        retries[dag_id] = {t["__var"]["task_id"]: t["__var"].get("retries", 0) for t in dag["tasks"]}  # 0: omitted
    paused = dict(db.execute("SELECT dag_id, is_paused FROM dag WHERE dag_id LIKE 'dpsynth_%'").fetchall())
    proc = subprocess.run([airflow, "dags", "test", "dpsynth_import_data", "-c", json.dumps({"source": str(source)})],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    return {"retries": retries, "paused": paused, "dst": dst, "proc": proc, "argv": log.read_text(),
            "events": db.execute("SELECT e.extra, a.uri, a.name FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                                 "WHERE e.source_dag_id = 'dpsynth_import_data'").fetchall(),
            "queued": db.execute("SELECT q.target_dag_id, a.name FROM asset_dag_run_queue q "
                                 "JOIN asset a ON a.id = q.asset_id").fetchall()}


def test_a_variable_in_the_metadata_db_reaches_dag_parsing(deployed_and_imported):
    """`airflow variables set DPSYNTH_TASK_RETRIES 7`, then one pass of the real dag-processor: the
    serialized DAGs carry retries=7 (Airflow 3 serves Variables to parsing through its supervisor)."""
    retries = deployed_and_imported["retries"]
    assert sorted(retries) == ["dpsynth_import_data", "dpsynth_retrain_on_new_data", "dpsynth_train"]
    assert retries["dpsynth_train"]["train"] == 7 and retries["dpsynth_train"]["finish"] == 0
    assert retries["dpsynth_import_data"]["import_data"] == 7


def test_dags_start_unpaused_and_an_import_queues_the_retrain(deployed_and_imported):
    """#55 item 3: the DAGs are unpaused on deploy, so an import's asset event queues the retrain.

    A paused DAG gets no queued run from an asset event (Airflow's AssetManager queues only DAGs that are not
    paused), and Airflow pauses every new DAG by default (``[core] dags_are_paused_at_creation``): a fresh cluster
    dropped the import's events and never retrained. Here, on a fresh metadata database: the DAGs as the DAG processor
    first stores them are unpaused, and ``airflow dags test dpsynth_import_data`` with the real ``dpsynth data
    import`` leaves a queued run of ``dpsynth_retrain_on_new_data`` for the dataset's asset (what the scheduler turns
    into the retrain's DAG run). The upstream chart's values say the same (values-airflow.yaml)."""
    run = deployed_and_imported
    assert run["paused"] == {"dpsynth_import_data": 0, "dpsynth_retrain_on_new_data": 0, "dpsynth_train": 0}
    assert run["proc"].returncode == 0, (run["proc"].stdout + run["proc"].stderr)[-5000:]
    assert run["queued"] == [("dpsynth_retrain_on_new_data", str(run["dst"]))]


def test_the_upstream_charts_values_unpause_and_log_in():
    import yaml

    values = yaml.safe_load((REPO / "charts" / "dpsynth" / "values-airflow.yaml").read_text())
    core = values["config"]["core"]
    assert core["dags_are_paused_at_creation"] == "False"
    assert core["auth_manager"].endswith("SimpleAuthManager") and core["simple_auth_manager_all_admins"] == "False"


def test_import_emits_the_dataset_version_and_retrain_reads_it(deployed_and_imported, airflow_env):
    """`airflow dags test dpsynth_import_data` (the real import, its output given a digest and a count): its asset
    event carries the versioned dataset URI and version as ``extra`` and no digest or count of the records (#33:
    Airflow's database is outside the sensitive zone); the retrain DAG's plan takes it from triggering_asset_events."""
    run = deployed_and_imported
    proc = run["proc"]
    assert proc.returncode == 0 and "state=success" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-5000:]
    [(extra, uri, name)] = run["events"]
    assert uri == run["dst"].as_uri() and name == str(run["dst"])  # DPSYNTH_DATASET_URI's asset
    [argv] = [json.loads(line) for line in run["argv"].splitlines()]
    assert argv[:2] == ["data", "import"] and "--outside" in argv  # no digest or count into the task's log and XCom
    extra = json.loads(extra)
    assert sorted(extra) == ["dataset_uri", "version"]  # the wrapper's sha256 and rows are not carried
    version = extra["version"]
    assert extra["dataset_uri"] == str(run["dst"].parent / "mnist" / f"{version}.parquet")
    assert Path(extra["dataset_uri"]).is_file() and len(version) == 32  # the keyed id the real import wrote

    out = in_airflow(LOAD + """
    import datetime
    from types import SimpleNamespace
    import dpsynth_pipeline
    from airflow.sdk import Asset
    dag = bag.dags["dpsynth_retrain_on_new_data"]
    asset = dag.timetable.asset_condition.objects[0]
    t = lambda h: datetime.datetime(2026, 1, 1, h, tzinfo=datetime.timezone.utc)
    events = {asset: [SimpleNamespace(timestamp=t(2), extra={"dataset_uri": "s3://b/new.parquet", "sha256": "new"}),
                      SimpleNamespace(timestamp=t(1), extra={"dataset_uri": "s3://b/old.parquet", "sha256": "old"})]}
    plan = dpsynth_pipeline.plan.function(params={**dag.params.dump(), "config": None}, run_id="r1",
                                          triggering_asset_events=events)
    print(json.dumps({"update": plan["dataset_update"], "train": plan["argv"]["train"]}))
    """, airflow_env)
    assert out["update"] == {"dataset_uri": "s3://b/new.parquet", "sha256": "new"}
    assert "data.uri=s3://b/new.parquet" in out["train"]


# Slow tier (#35 item 5: ~4 min of one worker). In the quick tier: a real `dpsynth_train` DAG run (its stages,
# MLflow's parent with one child per stage and its ε, the ledger's charge, the released model) is
# tests/platform/test_ui.py::test_trigger_from_the_ui_and_see_epsilon_per_stage_in_mlflow, triggered from the UI;
# the same stage chain end to end with its release files and card is tests/pipelines/test_kfp.py::
# test_local_pipeline_end_to_end[1]; the shard mapping and its map_index_template are
# test_task_settings_come_from_airflow_variables_else_the_environment and
# test_kubernetes_pods_request_gpus_for_pretrain_and_train_only. Here: that run through `airflow dags test`, K=2.
@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])  # 2: the train task under torchrun
def test_train_dag_end_to_end(airflow_db, tmp_path, ranks):
    """`airflow dags test dpsynth_train` with K=2 on 600 MNIST records: every task succeeds, the run
    directory holds the release, MLflow has the parent run with one child per stage, and the ledger beside
    the MLflow store (where `make run` sets the budget) charged the form's population for the train attempt."""
    from mlflow import MlflowClient

    from dpsynth import tracking
    from dpsynth.data import import_source, write_parquet
    from dpsynth.ledger.store import Ledger

    source = tmp_path / "mnist600.parquet"
    write_parquet(import_source(REPO / "data" / "mnist").subset(np.arange(600)), source)
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")  # as `make run`: an explicit budget, beforehand
    ledger.set_budget("mnist600", epsilon=100.0, delta=1e-3, records=600, reason="test_train_dag_end_to_end")
    conf = {"dataset_uri": str(source), "method": "dpgan", "epsilon": 10, "delta": 1e-4, "steps": 10, "num_shards": 2,
            "n_d": "2", "seed": 0, "run_root": str(tmp_path / "runs"), "config": None,
            "pipeline_run_id": "af-e2e", "population_id": "mnist600", "overrides": [*TINY, f"train.gpus_per_node={ranks}"]}
    airflow = str(AIRFLOW_BIN / "airflow")
    # timeout: a hang guard (over 300 s were seen on 2 shared, busy cores)
    env = {**airflow_db, "DPSYNTH_TRACKING_URI": mlflow_uri,  # a platform setting, not on the form (#34)
           "DPSYNTH_STAGE_CONFIG": json.dumps(PLATFORM)}
    proc = subprocess.run([airflow, "dags", "test", "dpsynth_train", "-c", json.dumps(conf)], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "DagRun Finished: dag_id=dpsynth_train" in log and "state=success" in log, log[-6000:]
    assert log.count("running task <TaskInstance: dpsynth_train.pretrain_shard") == 2  # mapped over K=2 shards
    import sqlite3
    db = sqlite3.connect(Path(airflow_db["AIRFLOW_HOME"]) / "airflow.db")
    labels = db.execute("SELECT rendered_map_index FROM task_instance WHERE task_id = 'pretrain_shard' AND run_id = "
                        "(SELECT run_id FROM dag_run WHERE dag_id = 'dpsynth_train' ORDER BY id DESC LIMIT 1) "
                        "ORDER BY map_index").fetchall()  # this run's (the module's database holds every param's)
    assert labels == [("shard 0",), ("shard 1",)]  # map_index_template

    trained = json.loads((tmp_path / "runs" / "af-e2e" / "sensitive" / "train" / "manifest.json").read_text())
    assert trained["details"]["ranks"] == ranks
    release = tmp_path / "runs" / "af-e2e" / "release"
    card = [f"card/{n}" for n in ("SHA256SUMS", "card.html", "card.json", "trace.json")]  # the release card (finish)
    card += ["card/card.pdf"] if shutil.which("chromium") else []
    assert sorted(str(p.relative_to(release)) for p in release.rglob("*") if p.is_file()) == sorted(RELEASE + card)
    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("airflow-test")
    runs = client.search_runs([exp.experiment_id], f"tags.`{tracking.TAG_PIPELINE_RUN_ID}` = 'af-e2e'")
    (parent,) = [r for r in runs if r.data.tags[tracking.TAG_STAGE] == "pipeline"]
    children = [r for r in runs if r is not parent]
    assert sorted(r.data.tags[tracking.TAG_STAGE] for r in children) == sorted(STAGES)
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in children)
    assert parent.info.status == "FINISHED" and parent.data.tags[tracking.TAG_AUDIT] == "passed"
    assert 0 < parent.data.metrics["epsilon_total"] <= 10
    (charged,) = ledger.reservations(pipeline_run_id="af-e2e")  # one train attempt, nothing else
    assert charged["population_id"] == "mnist600" and charged["stage"] == "train"
    assert charged["status"] == "committed" and 0 < charged["epsilon_spent"] <= 10
    assert parent.data.tags[tracking.TAG_LEDGER_RESERVATION] == str(charged["id"])
    assert parent.data.tags[tracking.TAG_POPULATION] == "mnist600"
    assert parent.data.metrics["ledger_epsilon_charged"] == pytest.approx(charged["epsilon_spent"])
