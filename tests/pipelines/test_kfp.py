"""pipelines/kfp: the compiled YAML is in sync and has the GPU/fan-out settings; the local flavour runs
the same CLI as the containers, end to end on 600 MNIST records with K=2 under one MLflow parent run."""

import functools
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from dpsynth import tracking
from dpsynth.stages.protocol import TAG_STATUS as STATUS
from tests.stages.helpers import manifest, release_files

KFP = Path(__file__).resolve().parents[2] / "pipelines" / "kfp"
POPULATION = "mnist"  # the committed YAML's (make kfp-yaml: DPSYNTH_POPULATION_ID=$(POPULATION))
STAGES = ["partition", "pretrain", "train", "audit", "sample", "evaluate"]
# Two files of the pipeline that other test modules read without building it (test_the_pipelines_files_are_these):
YAML = KFP / "dpsynth_pipeline.yaml"            # the committed compiled pipeline (kp.YAML)
STAGE_PROGRAM = KFP / "stage_program.py"        # the containers' program, its text run as `python -c` (kp._RUN)


def _frames(context: int = 1) -> list[inspect.FrameInfo]:
    """``inspect.stack()``'s frames, function names included, without their source: kfp's
    ``PipelineTask._ensure_container_spec_exists`` takes the name of its caller from ``inspect.stack()`` (for an
    error message) on every ``set_*`` call, and that looks up the source file of every frame through
    ``inspect.getmodule``, a scan of ``sys.modules`` each time: 53 calls cost 5-10 CPU-s in a test process that has
    imported torch and MLflow (1 without this)."""
    frame, frames = sys._getframe(1), []
    while frame is not None:
        frames.append(inspect.FrameInfo(frame, frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name, None,
                                        None))
        frame = frame.f_back
    return frames


@functools.cache
def load_run_local():
    """pipelines/kfp/run_local.py, with pipelines/kfp/dpsynth_pipeline.py as its ``kp``. Loaded on first use, not
    at collection: importing them imports kfp and builds the pipeline, which only a worker that runs a KFP test
    should pay (each pytest-xdist worker collects every module). Built with kfp's caller lookup made cheap
    (:func:`_frames`); the pipeline is the same (test_committed_yaml_is_in_sync compiles it without)."""
    from unittest import mock

    import kfp.dsl.pipeline_task

    spec = importlib.util.spec_from_file_location("dpsynth_kfp_run_local", KFP / "run_local.py")
    module = importlib.util.module_from_spec(spec)
    with mock.patch.object(kfp.dsl.pipeline_task, "inspect", types.SimpleNamespace(stack=_frames)):
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run_local():
    return load_run_local()


@pytest.fixture(scope="module")
def kp(run_local):
    """pipelines/kfp/dpsynth_pipeline.py."""
    return run_local.kp


@pytest.fixture(scope="module")
def documents(kp):
    """The pipeline spec, then (with kfp-kubernetes) the platform spec: a two-document YAML."""
    return list(yaml.safe_load_all(kp.YAML.read_text()))


@pytest.fixture(scope="module")
def compiled(documents):
    return documents[0]


def run_group(compiled) -> dict:
    """The tasks of the exit handler's group: every stage but the exit task, finish."""
    [(name, task)] = [(n, t) for n, t in compiled["root"]["dag"]["tasks"].items() if n.startswith("exit-handler-")]
    return compiled["components"][task["componentRef"]["name"]]["dag"]["tasks"]


def group(tasks: dict, prefix: str) -> str:
    [name] = [n for n in tasks if n.startswith(prefix)]
    return name


def all_tasks(compiled) -> dict:
    """Every task of the pipeline, by name, whichever group (exit handler, loop, condition) holds it."""
    out = dict(compiled["root"]["dag"]["tasks"])
    for component in compiled["components"].values():
        out.update(component.get("dag", {}).get("tasks", {}))
    return out


def test_the_pipelines_files_are_these(kp):
    assert kp.YAML == YAML and kp._RUN == STAGE_PROGRAM.read_text()


def test_committed_yaml_is_in_sync(tmp_path, kp):
    out = tmp_path / "dpsynth_pipeline.yaml"
    subprocess.run([sys.executable, str(KFP / "dpsynth_pipeline.py"), "--compile", str(out)], check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "DPSYNTH_POPULATION_ID": POPULATION})
    assert out.read_text() == kp.YAML.read_text(), "run: make kfp-yaml"


def test_gpu_stages_and_fan_out(compiled, kp):
    executors = compiled["deploymentSpec"]["executors"]
    for stage in ("pretrain-shard", "train"):
        accelerator = executors[f"exec-dpsynth-{stage}"]["container"]["resources"]["accelerator"]
        assert accelerator["resourceType"] == "nvidia.com/gpu" and accelerator["resourceCount"] == "1"
    for s in ("partition", "pretrain", "audit"):  # CPU only
        resources = executors[f"exec-dpsynth-{s}"]["container"]["resources"]
        assert "accelerator" not in resources
        assert (resources["resourceCpuRequest"], resources["resourceMemoryRequest"], resources["resourceMemoryLimit"]) == (
            "1", "4Gi", "8Gi")
    assert executors["exec-dpsynth-train"]["container"]["resources"]["resourceMemoryLimit"] == "32Gi"
    # the CUDA image for the GPU stages' pods, the CPU image for the others (#55 item 4: the CPU image was given to all)
    for name, e in executors.items():
        gpu = name in ("exec-dpsynth-pretrain-shard", "exec-dpsynth-train")
        assert e["container"]["image"] == (kp.GPU_IMAGE if gpu else kp.STAGE_IMAGE) == (
            "dpsynth-stage:cuda" if gpu else "dpsynth-stage:cpu"), name

    dag = run_group(compiled)
    loop_name, branches_name = group(dag, "for-loop-"), group(dag, "condition-branches-")
    loop = dag[loop_name]
    assert loop["parameterIterator"]["items"]["inputParameter"].endswith("shard-indices-Output")
    assert loop["iteratorPolicy"]["parallelismLimit"] == kp.PRETRAIN_PARALLELISM == 8  # at most 8 shard pods at once
    (inner,) = compiled["components"][f"comp-{loop_name}"]["dag"]["tasks"].values()
    assert inner["componentRef"]["name"] == "comp-dpsynth-pretrain-shard"
    assert inner["inputs"]["parameters"]["shard_index"]["componentInputParameter"] == "pipelinechannel--shard-indices-Output-loop-item"
    executors = compiled["deploymentSpec"]["executors"]
    assert executors["exec-dpsynth-pretrain-shard"]["container"]["args"][:3] == [
        "pretrain", "--shard", "{{$.inputs.parameters['shard_index']}}"]
    # train: one GPU pod, or (train_nodes × train_gpus_per_node > 1) the TrainJob launcher, in a condition group
    order = ["dpsynth-start", "dpsynth-partition", "shard-indices", loop_name, "dpsynth-pretrain",
             "train-distributed", branches_name, "dpsynth-audit", "dpsynth-sample", "dpsynth-evaluate"]
    for before, after in zip(order, order[1:]):
        assert before in dag[after]["dependentTasks"], (before, after)
    assert all(not t.get("cachingOptions", {}).get("enableCache") for t in dag.values())
    assert "dpsynth-finish" not in dag  # the exit task (test_finish_is_the_exit_task)
    params = compiled["root"]["inputDefinitions"]["parameters"]
    assert set(params) == {"dataset_uri", "method", "epsilon", "delta", "steps", "num_shards", "n_d",
                           "seed", "audit_empirical", "run_dir", "train_nodes", "train_gpus_per_node", "config", "extra"}
    # no population input: the platform's, compiled in (#34; tests/pipelines/test_kfp_population.py)
    for name, executor in executors.items():
        if name.startswith("exec-dpsynth-"):
            args = executor["container"]["args"]
            assert args[args.index(f"ledger.population_id={POPULATION}") - 1] == "--set", name


def test_inputs_take_type_and_description_from_the_config_schema(compiled, kp):
    """Each input that is a setting: KFP's type for the setting's, their description; optional with no default
    (empty: the config's, #34) but for the dataset and population, which a run must name."""
    from dpsynth.config import setting_schema

    params = compiled["root"]["inputDefinitions"]["parameters"]
    kinds = {"number": "NUMBER_DOUBLE", "integer": "NUMBER_INTEGER", "string": "STRING"}
    for name, field in {**kp.SETTINGS, **kp.LAUNCH}.items():
        schema = setting_schema(field)
        types = {o.get("type") for o in schema.get("anyOf", [schema])} - {"null"}
        assert params[name]["parameterType"] == (kinds[types.pop()] if len(types) == 1 else "STRING"), name
        assert params[name]["description"].startswith(f"{field}: {schema['description']}"), name
        assert "defaultValue" not in params[name], name
        assert bool(params[name].get("isOptional")) == (name != "dataset_uri"), name
    assert params["config"]["defaultValue"] == "/opt/dpsynth/configs/dpgan-mnist-cpu.yaml"
    assert params["extra"]["defaultValue"] == [] and params["extra"]["parameterType"] == "LIST"


def test_gpu_toleration_and_node_selector(documents, kp):
    platform = documents[1]["platforms"]["kubernetes"] if len(documents) > 1 else None
    if kp.kubernetes is None:
        assert platform is None
        pytest.skip("kfp-kubernetes is not installed: no tolerations/node selector in the YAML")
    configs = platform["deploymentSpec"]["executors"]
    for stage in ("pretrain-shard", "train"):
        assert configs[f"exec-dpsynth-{stage}"]["tolerations"][0]["key"] == "nvidia.com/gpu"
        assert configs[f"exec-dpsynth-{stage}"]["nodeSelector"]["labels"] == kp.GPU_NODE_SELECTOR


def test_stage_pods_get_configuration_retries_and_time_limits(compiled, documents, kp):
    """Every stage pod: the chart's Secret and ConfigMap as environment, a time limit; every stage
    but finish: retries with backoff."""
    if kp.kubernetes is None:
        pytest.skip("kfp-kubernetes is not installed")
    configs = documents[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    stages = ["start", "partition", "pretrain-shard", "pretrain", "train", "audit", "sample", "evaluate", "finish"]
    for stage in stages:
        config = configs[f"exec-dpsynth-{stage}"]
        secret, login, *key = config["secretAsEnv"]
        assert secret["secretName"] == "dpsynth-stage" and not secret["optional"]
        # MLflow's login (#55 item 8, the chart's mlflow.auth): from the same Secret, where MLflow asks for one
        assert login["secretName"] == "dpsynth-stage" and login["optional"]
        assert [e["envVar"] for e in login["keyToEnv"]] == ["MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"]
        # the partition key's Secret: the partition pod only (#55 item 6)
        assert [k["secretName"] for k in key] == (["dpsynth-partition-key"] if stage == "partition" else [])
        assert {e["envVar"] for e in secret["keyToEnv"]} == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                             "DPSYNTH_LEDGER_URL"}
        required, endpoints = config["configMapAsEnv"]
        assert required["configMapName"] == endpoints["configMapName"] == "dpsynth-stage-config"
        assert [e["envVar"] for e in required["keyToEnv"]] == ["MLFLOW_TRACKING_URI"] and not required["optional"]
        assert [e["envVar"] for e in endpoints["keyToEnv"]] == ["AWS_ENDPOINT_URL_S3", "MLFLOW_S3_ENDPOINT_URL"]
        assert endpoints["optional"]
        assert config["activeDeadlineSeconds"] == str(12 * 3600)
    tasks = all_tasks(compiled)
    for stage in stages:
        policy = tasks[f"dpsynth-{stage}"].get("retryPolicy")
        if stage in ("finish", "audit"):  # the verdict; the audit's randomised gates get one draw
            assert policy is None, stage
        else:
            assert policy["maxRetryCount"] == 2 and policy["backoffDuration"] == "120s", stage
            assert policy["backoffMaxDuration"] == f"{3 * 12 * 3600}s"


@pytest.mark.parametrize("given", ["all", "required"])
def test_local_component_runs_the_containers_command(compiled, monkeypatch, given, kp):
    """The two flavours cannot drift: same argv (after ``dpsynth``) for every command, with every input given and
    with only the required ones (the others absent: the config's)."""
    from tests.pipelines.test_entry_points import render_args

    seen = []

    def fake_run(argv, **kw):
        seen.append(argv[3:])  # drop [python, -m, dpsynth.cli]
        return subprocess.CompletedProcess(argv, 0, stdout='{"parent_run_id": "P"}')

    monkeypatch.setattr(subprocess, "run", fake_run)
    values = dict(run_dir="R", pipeline_run_id="J", parent_run_id="P", dataset_uri="D", population_id=POPULATION, config="C.yaml",
                  extra=["train.lr_g=0.001"], method="dpgan", epsilon=1.5, delta=1e-5, steps=7, num_shards=2, n_d="adaptive",
                  seed=3, audit_empirical="quick", shard_index=1, train_nodes=2, train_gpus_per_node=4)
    if given == "required":
        values = {k: v for k, v in values.items() if k in ("run_dir", "pipeline_run_id", "parent_run_id", "dataset_uri",
                                                           "population_id", "config", "extra", "shard_index")}
    program = {"__name__": "dpsynth_run"}
    exec(kp._RUN, program)
    local = {k: v for k, v in values.items() if k in ("run_dir", "pipeline_run_id", "parent_run_id", "dataset_uri",
                                                       "population_id", "config", "shard_index")}
    for command in kp.CONTAINER:  # the local flavour gets the settings given as extra items (run_local.py)
        fields = {**kp.SETTINGS, **(kp.LAUNCH if command == "train job" else {})}
        sets = [f"{f}={values[n]}" for n, f in fields.items() if n in values and n not in ("dataset_uri", "population_id")]
        exit_task = {"parent_run_id": ""} if command == "pipeline finish" else {}  # finds it (the exit handler's)
        kp.local_stage.python_func(command=command, extra=[*sets, *values["extra"]], **{**local, **exit_task})
        name = "exec-dpsynth-" + command.replace("pipeline ", "").replace(" ", "-")
        container = compiled["deploymentSpec"]["executors"][name]["container"]
        inputs = {k: v if k == "extra" else str(v) for k, v in values.items() if k != "population_id"}  # compiled in
        args = program["resolve"](render_args(container["args"], inputs))
        if command == "train job":  # the stage on several ranks: a TrainJob in a pod, torchrun locally
            assert args[:3] == ["train", "--launch", "trainjob"]
            assert ("train.gpus_per_node=4" in args) == (given == "all")
            args[2] = "torchrun"
        assert seen[-1] == args, command


def test_the_train_stage_on_several_ranks_is_a_trainjob_launcher(compiled, documents, kp):
    """train_nodes × train_gpus_per_node > 1: the train-job task (a CPU pod running `dpsynth train --launch
    trainjob`, with the chart's template name from the stage ConfigMap, retried) runs in place of the GPU pod."""
    def decide(**kw):
        return kp.train_distributed.python_func(config="", extra=[], **kw)

    assert [decide(train_nodes=n, train_gpus_per_node=g) for n, g in ((1, 1), (2, 1), (1, 2), (2, 8))] == [
        False, True, True, True]
    assert not decide() and kp.train_distributed.python_func(config="", extra=["train.nodes=2"])  # 0: the config's
    from dpsynth.errors import ConfigError

    with pytest.raises(ConfigError, match="^train.gpus_per_node: must be an integer >= 1"):
        decide(train_nodes=1, train_gpus_per_node=-1)
    name = group(run_group(compiled), "condition-branches-")
    branches = compiled["components"][f"comp-{name}"]["dag"]["tasks"]
    (job_name, job), (_, pod) = sorted(branches.items())
    assert job["triggerPolicy"]["condition"] == "inputs.parameter_values['pipelinechannel--train-distributed-Output'] == true"
    assert pod["triggerPolicy"]["condition"].startswith("!(")
    assert list(compiled["components"][f"comp-{job_name}"]["dag"]["tasks"]) == ["dpsynth-train-job"]
    container = compiled["deploymentSpec"]["executors"]["exec-dpsynth-train-job"]["container"]
    assert container["args"][:3] == ["train", "--launch", "trainjob"] and "accelerator" not in container["resources"]
    assert ('{"IfPresent": {"InputName": "train_nodes", "Then": ["--set", '
            '"train.nodes={{$.inputs.parameters[\'train_nodes\']}}"]}}') in container["args"]
    if kp.kubernetes is None:
        pytest.skip("kfp-kubernetes is not installed")
    config = documents[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-dpsynth-train-job"]
    template = [c for c in config["configMapAsEnv"] if c["keyToEnv"][0]["envVar"] == kp.TEMPLATE_ENV]
    assert template and template[0]["configMapName"] == "dpsynth-stage-config" and not config.get("tolerations")
    assert compiled["components"][f"comp-{job_name}"]["dag"]["tasks"]["dpsynth-train-job"]["retryPolicy"][
        "maxRetryCount"] == 2


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    import numpy as np

    from dpsynth.data import import_source, write_parquet
    from tests.stages.helpers import MNIST

    path = tmp_path_factory.mktemp("source") / "mnist600.parquet"
    write_parquet(import_source(MNIST).subset(np.arange(600)), path)
    return str(path)


TINY = ("train.d_width=4", "train.g_width=4", "train.latent_dim=15", "warmup.steps=20", "train.batch_size=32", "sample.num_samples=200",
        "output.log_every=0", "output.sample_every=0", "output.checkpoint_every=0", "evaluate.epochs=1",
        "evaluate.feature_steps=5", "evaluate.mia_generated=200",
        "partition.key=dpsynth-partition-v1", "data.num_classes=10")  # no defaults: the demo's key, MNIST's classes


def test_run_local_needs_a_population(tmp_path, capsys, run_local):
    config = tmp_path / "no-population.yaml"
    config.write_text("train:\n  steps: 3\n")
    with pytest.raises(SystemExit) as exc:
        run_local.main(["--dataset", "d.parquet", "--run-dir", str(tmp_path / "run"), "--config", str(config)])
    assert exc.value.code == 2 and "ledger.population_id: required" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# The slow tier (#35 item 5: ~2 minutes each under kfp.local); the quick tier compiles the pipeline and resolves its
# container arguments (test_entry_points.py, the tests above) and runs the six stages (tests/stages/test_pipeline.py).
@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])  # 2: the train-job branch, torchrun
def test_local_pipeline_end_to_end(tmp_path, source, monkeypatch, ranks, run_local):
    from dpsynth.ledger.store import Ledger

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # tiny models; other processes share the CPU
    monkeypatch.delenv("DPSYNTH_LEDGER_URL", raising=False)
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")  # beside the MLflow store; the budget set beforehand
    ledger.set_budget("mnist600", epsilon=100.0, delta=1e-3, records=600, reason="test_local_pipeline_end_to_end")
    extra = [*TINY, f"tracking.uri={mlflow_uri}", "tracking.experiment=kfp-test"]
    run = tmp_path / "run"
    run_local.run(dataset=source, run_dir=str(run), extra=extra, pipeline_root=str(tmp_path / "kfp"),
                  population_id="mnist600", method="dpgan", epsilon=10.0, delta=1e-4, steps=12, num_shards=2,
                  n_d="2", seed=0, train_gpus_per_node=ranks)
    assert manifest(run, "sensitive", "train")["details"]["ranks"] == ranks

    assert {"sample/manifest.json", "sample/synthetic.parquet", "evaluate/manifest.json",
            "evaluate/report.json", "card/card.html", "card/card.json"} <= set(release_files(run))  # and the card
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("kfp-test")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.data.tags[tracking.TAG_STAGE] == "pipeline"]
    children = [r for r in runs if r is not parent]
    assert parent.info.status == "FINISHED" and parent.data.tags[tracking.TAG_AUDIT] == "passed"
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    stages = [c.data.tags[tracking.TAG_STAGE] for c in children]
    assert sorted(set(stages)) == sorted(STAGES)
    assert all(stages.count(s) == 1 for s in STAGES)  # the per-shard tasks log no run of their own
    job = parent.data.tags[tracking.TAG_PIPELINE_RUN_ID]
    assert all(c.data.tags[tracking.TAG_PIPELINE_RUN_ID] == job for c in children)
    assert manifest(run, "release", "sample")["pipeline_run_id"] == job
    (charged,) = ledger.history("mnist600")  # the one train attempt of the job
    assert charged["pipeline_run_id"] == job and charged["stage"] == "train" and charged["status"] == "committed"
    assert 0 < charged["epsilon_spent"] <= 10
    assert parent.data.tags[tracking.TAG_LEDGER_RESERVATION] == str(charged["id"])
