"""Kubeflow Pipelines v2: the six dpsynth stages, one task each, under one MLflow parent run.

    ExitHandler(finish):
        start → partition → pretrain --shard k (ParallelFor over k < K, GPU) → pretrain (fan-in)
              → train (one GPU pod), or train-job when train_nodes × train_gpus_per_node > 1
              → audit → sample → evaluate
    finish (the exit task: runs however the group ended, and closes the MLflow parent run with the verdict the
            manifests give; it takes pipeline parameters only, KFP refusing an exit task that depends on a task,
            and finds the parent run by the pipeline run id: ``dpsynth pipeline finish`` without --parent-run-id)

Each container runs ``stage_program.py``: a stage that exits 2 (a verdict) is recorded under the run's sensitive
zone, so a KFP retry of that task exits 2 without running it again (KFP's retry policy cannot filter by exit
status); partition, train, sample and evaluate write KFP output artifacts (Dataset, Model, Metrics) from their
manifests' outside view (keyed ids, never a raw hash of a sensitive-zone file) for the lineage view.

Two flavours of one wiring (``_wire``), so they cannot drift apart:

- ``dpsynth_pipeline``: container components of the stage image (``STAGE_IMAGE``, env
  ``DPSYNTH_STAGE_IMAGE``) running ``dpsynth <stage>``; compiled to ``dpsynth_pipeline.yaml``
  (``python pipelines/kfp/dpsynth_pipeline.py --compile``).
- ``local_pipeline``: lightweight Python components that run the same CLI with the current
  interpreter (``sys.executable -m dpsynth.cli``), for ``kfp.local.SubprocessRunner`` (``run_local.py``).

Each stage takes its upstream's output artifact as an ``Input[...]`` (``INPUTS_OF``: pre-training and train take
partition's Dataset, audit and sample the train stage's Model (``dsl.OneOf`` of the two train branches), evaluate
sample's Dataset); the container program checks that it names a manifest of this run that the upstream stage
wrote (``stage_program.check_inputs``) before the stage runs. Besides, tasks pass plain values: the run directory
URI, the MLflow parent run id (an output of ``start``), the pipeline run id (KFP's job id), the base ``config``
file and the settings, as
``--set section.field=value``. A settings input left empty (None) keeps the config's value: no ``--set`` at
all (``dsl.IfPresentPlaceholder``), so a run with only the dataset filled in trains the recipe ``make run``
trains (``config``'s default: the image's copy of ``configs/dpgan-mnist-cpu.yaml``, ``CONFIG``). ``extra``
(``section.field=value`` items) is applied last; only the recipe's settings (``dpsynth.config.RUN_SETTINGS``, an
allow-list) are accepted there: every other is the platform's (the stage Secret and ConfigMap, the base config).

The train stage on several ranks: with ``train_nodes`` × ``train_gpus_per_node`` > 1 (``train-distributed``
decides, :func:`dpsynth.distributed.launch.shape`) the ``train-job`` task runs instead of ``train``:
``dpsynth train --launch trainjob`` (a CPU pod: it creates the run's Kubeflow Trainer TrainJob from the chart's
template ``DPSYNTH_TRAINJOB_TEMPLATE``, copies its first node's log into its own, waits for it and prints the
stage's outcome; its pod's service account needs the chart's ``<release>-train-launcher`` Role,
``trainJob.launcher.extraSubjects``), or, in the local flavour, ``--launch torchrun`` on this machine.

The population (``ledger.population_id``: whose lifetime privacy budget every training attempt is charged, in the
ledger at ``DPSYNTH_LEDGER_URL``) is the platform's, like the ledger URL and the tracking URI: it is fixed when the
pipeline is compiled (``DPSYNTH_POPULATION_ID``, :data:`POPULATION_ID`; compiling without it is refused) and is no
run input, so whoever triggers a run cannot charge it to another budget (``extra`` refuses it too, and the fixed
``--set`` comes after the ``config`` file's). The local flavour, where the platform is yours, takes it as an input.
The ledger gives no budget by default: an operator sets it beforehand with ``dpsynth ledger set-budget POPULATION
--epsilon E --delta D --records N --reason TEXT`` (docs/cluster.md); ``start`` refuses a run the budget cannot
afford.

On a cluster (``dpsynth_pipeline``; kfp-kubernetes) every stage pod gets its configuration from the
dpsynth chart's objects in the run's namespace: the Secret ``STAGE_SECRET`` (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, DPSYNTH_LEDGER_URL; MLFLOW_TRACKING_USERNAME/PASSWORD where MLflow asks for a login) and the ConfigMap ``STAGE_CONFIG_MAP`` (MLFLOW_TRACKING_URI;
AWS_ENDPOINT_URL_S3 and MLFLOW_S3_ENDPOINT_URL where an S3-compatible endpoint is used), as environment;
CPU/memory requests and limits (``RESOURCES``, per stage), ``RETRIES`` retries with backoff
(the stages skip work their manifests record; not ``finish``, whose failure is the verdict) and a
per-pod time limit (``TIMEOUT_SECONDS``, activeDeadlineSeconds). Without MLFLOW_TRACKING_URI a pod
would track into SQLite under the run dir.
"""

import argparse
import inspect
import json
import os
import sys
from pathlib import Path
from typing import NamedTuple, Optional

from kfp import compiler, dsl

from dpsynth.config import setting_schema
from dpsynth.errors import ConfigError

# The compile environment takes the names (and JSON) of the chart's Airflow ConfigMap <release>-airflow-env, so that
# exporting that ConfigMap (docs/cluster.md, "Kubeflow Pipelines") compiles pods that match the chart's values.
STAGE_IMAGE = os.environ.get("DPSYNTH_STAGE_IMAGE", "dpsynth-stage:cpu")
GPU_IMAGE = os.environ.get("DPSYNTH_GPU_IMAGE", "dpsynth-stage:cuda")  # the CUDA image, for the GPU stages' pods
ACCELERATOR = "nvidia.com/gpu"  # KFP accelerator type → resources.limits["nvidia.com/gpu"] on the pod
# The stages whose pods get a GPU (the chart's stage.gpu.stages): "pretrain" is the per-shard pre-training runs
GPU_STAGES = tuple(os.environ.get("DPSYNTH_GPU_STAGES", "pretrain,train").split(","))
GPU_LIMIT = int(os.environ.get("DPSYNTH_GPU_LIMIT", "1"))
GPU_TOLERATIONS = json.loads(os.environ.get("DPSYNTH_GPU_TOLERATIONS") or
                             '[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]')
GPU_NODE_SELECTOR = json.loads(os.environ.get("DPSYNTH_GPU_NODE_SELECTOR") or '{"nvidia.com/gpu.present": "true"}')
IMAGE_PULL_SECRETS = [s for s in os.environ.get("DPSYNTH_IMAGE_PULL_SECRETS", "").split(",") if s]
KUEUE_QUEUE = os.environ.get("DPSYNTH_KUEUE_QUEUE", "")  # a Kueue LocalQueue: every pod gets its label
# The platform's partition key: a Secret (key DPSYNTH_PARTITION_KEY) given to the partition pod only; the stage then
# refuses to run without it, or with the demo's public key (DPSYNTH_REQUIRE_PARTITION_KEY)
PARTITION_KEY_SECRET = os.environ.get("DPSYNTH_PARTITION_KEY_SECRET", "dpsynth-partition-key")
RUN_AS_USER = 10001  # the stage images' user (PodSecurity "restricted": non-root)
YAML = Path(__file__).with_name("dpsynth_pipeline.yaml")
# The base config of a run: the recipe `make run` trains, as the stage images ship it (images/*.Dockerfile copy
# configs/ to /opt/dpsynth/configs). "" : none (the models' defaults).
CONFIG = os.environ.get("DPSYNTH_CONFIG", "/opt/dpsynth/configs/dpgan-mnist-cpu.yaml")
LOCAL_CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "dpgan-mnist-cpu.yaml")
# A run's ``extra`` may name only the recipe's settings (dpsynth.config.RUN_SETTINGS): the container program refuses any
# other, naming who sets it. ledger.population_id is compiled in (POPULATION_ID).
#
# The container's program (stage_program.py, its text run as `python -c`): resolves the pseudo-options of _cli_args,
# refuses a setting that is not a run's in the extra settings, runs dpsynth, records a verdict (exit 2) so that a retry does not
# run the command again, writes the task's output parameter (`pipeline start`) and output artifacts.
_RUN = Path(__file__).with_name("stage_program.py").read_text()
_PROGRAM: dict = {"__name__": "dpsynth_stage_program"}
exec(_RUN, _PROGRAM)  # noqa: S102 (our own file: its constants, here and in the container alike)
# The population every run of the compiled pipeline charges (ledger.population_id): a platform setting, given at
# compile time (the chart's pipeline.populationId for Airflow), never a run input.
POPULATION_ID = os.environ.get("DPSYNTH_POPULATION_ID", "").strip()

# Cluster settings of the stage pods (dpsynth_pipeline only). Names: the dpsynth chart's defaults for a
# release called "dpsynth" (env at compile time to change them).
STAGE_SECRET = os.environ.get("DPSYNTH_STAGE_SECRET", "dpsynth-stage")
STAGE_CONFIG_MAP = os.environ.get("DPSYNTH_STAGE_CONFIG_MAP", "dpsynth-stage-config")
SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "DPSYNTH_LEDGER_URL")
CONFIG_ENV = ("MLFLOW_TRACKING_URI",)
# MLflow's login (the chart's mlflow.auth, on by default): in the stage Secret when MLflow asks for one
LOGIN_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "MLFLOW_S3_ENDPOINT_URL")  # optional: absent for AWS S3 itself
# CPU/memory of the stage pods, as the chart's stage.resources ({"cpu", "gpu", "stages": {stage: …}}, JSON in
# DPSYNTH_STAGE_RESOURCES at compile time; a stage listed replaces its default whole).
RESOURCES = {"cpu": {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
             "gpu": {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"memory": "32Gi"}}, "stages": {},
             **json.loads(os.environ.get("DPSYNTH_STAGE_RESOURCES") or "{}")}
RETRIES = 2
# How many per-shard pre-training pods run at once (ParallelFor parallelism; K can be 50 GPU pods otherwise).
PRETRAIN_PARALLELISM = int(os.environ.get("DPSYNTH_PRETRAIN_PARALLELISM", "8"))
RETRY_BACKOFF = "120s"
TIMEOUT_SECONDS = 12 * 3600

# The pipeline parameters that become stage settings: pipeline parameter -> config field. Each takes its
# default and description from the config's schema (the stages validate the values: `pipeline start` first).
SETTINGS = {"dataset_uri": "data.uri", "method": "train.method", "epsilon": "privacy.epsilon",
            "delta": "privacy.delta", "steps": "train.steps", "num_shards": "partition.num_shards",
            "n_d": "train.n_d", "seed": "train.seed", "audit_empirical": "audit.empirical"}
# The train stage's shape (pipeline parameter -> config field): given to the train-job task only.
LAUNCH = {"train_nodes": "train.nodes", "train_gpus_per_node": "train.gpus_per_node"}
_SETTING_TYPES = {"epsilon": float, "delta": float, "steps": int, "num_shards": int, "seed": int, "train_nodes": int,
                  "train_gpus_per_node": int}  # the others: str
TEMPLATE_ENV = "DPSYNTH_TRAINJOB_TEMPLATE"  # in the stage ConfigMap: the chart's TrainJob template (train-job)
INPUTS = {"run_dir": "Root URI of the pipeline run (s3:// on a cluster): run_dir/sensitive, run_dir/release.",
          "config": "Base YAML config of the run, a path in the stage image (default: the recipe make run trains, "
                    f"{CONFIG}); empty: none, the models' defaults.",
          "extra": "More settings, section.field=value, applied last: only the recipe's (train.*, the method's "
                   "sections, privacy.epsilon/delta/noise_multiplier/max_grad_norm, …: dpsynth.config.RUN_SETTINGS); "
                   "any other is the platform's and refused.",
          "population_id": "ledger.population_id, the population whose budget the run charges (the local flavour "
                           "only: on a cluster it is the platform's, DPSYNTH_POPULATION_ID at compile time).",
          **{name: f"{field}: {setting_schema(field).get('description', '')}"
                   + ("" if name == "dataset_uri" else " Empty: the config's.")
             for name, field in {**SETTINGS, **LAUNCH}.items()}}

try:  # kfp-kubernetes: tolerations and node selectors of the GPU pods
    from kfp import kubernetes
except ImportError:  # pragma: no cover - depends on the environment
    kubernetes = None


# --- container flavour: `dpsynth <command>` in the stage image --------------------------------------

def _cli_args(command: str, p: dict, outputs: dict | None = None, inputs: dict | None = None) -> list:
    """The arguments of :data:`_RUN` for one command: ``dpsynth`` argv (after the program), with the pseudo-options
    ``--config-file PATH`` (dropped when empty) and ``--extra-settings JSON`` (``extra``, a list) that ``_RUN``
    resolves. ``p`` holds the task's inputs (placeholders); a setting that is None is left out
    (``dsl.IfPresentPlaceholder``: the config's value). "pretrain shard" is ``dpsynth pretrain --shard K``, one
    iteration of the fan-out; "train job" is the train stage launched as a TrainJob (``dpsynth train --launch
    trainjob``, with the stage's shape)."""
    heads = {"pretrain shard": ["pretrain", "--shard", p.get("shard_index")],
             "train job": ["train", "--launch", "trainjob"]}
    head = heads.get(command) or command.split()
    args = [*head, "--json", "--run-dir", p["run_dir"], "--pipeline-run-id", p["pipeline_run_id"]]
    if command not in ("pipeline start", "pipeline finish"):  # finish: the exit task finds it
        args += ["--parent-run-id", p["parent_run_id"]]
    args += ["--config-file", p["config"]]
    for name, field in {**SETTINGS, **(LAUNCH if command == "train job" else {})}.items():
        args.append(dsl.IfPresentPlaceholder(input_name=name, then=["--set", f"{field}={p[name]}"]))
        if name == "dataset_uri" and POPULATION_ID:  # the platform's, compiled in: no run input can change it
            args += ["--set", f"ledger.population_id={POPULATION_ID}"]
    args += ["--extra-settings", p["extra"]]
    for name, artifact in (inputs or {}).items():  # the upstream task's artifact, as KFP's launcher downloaded it
        args += ["--kfp-input", name, artifact.path]
    for name, artifact in (outputs or {}).items():
        args += ["--kfp-artifact", name, artifact.path]
    return [*args, "--kfp-executor-output", dsl.PIPELINE_TASK_EXECUTOR_OUTPUT_PATH_PLACEHOLDER] if outputs else args


# KFP output artifacts per command (names: stage_program.ARTIFACTS): what the lineage view shows of a run.
OUTPUTS = {"partition": {"dataset": dsl.Dataset}, "train": {"model": dsl.Model}, "train job": {"model": dsl.Model},
           "sample": {"synthetic": dsl.Dataset, "model": dsl.Model}, "evaluate": {"metrics": dsl.Metrics}}

# KFP input artifacts per command: the upstream task's output artifact (OUTPUTS), the edge a stage takes its input
# by (``partitioned``: partition's dataset; ``trained``: the train stage's model, from whichever branch ran;
# ``sampled``: sample's synthetic dataset). The container program checks it names a manifest of this run's
# (stage_program.check_inputs) before the stage runs.
INPUTS_OF = {"pretrain shard": {"partitioned": dsl.Dataset}, "pretrain": {"partitioned": dsl.Dataset},
             "train": {"partitioned": dsl.Dataset}, "train job": {"partitioned": dsl.Dataset},
             "audit": {"trained": dsl.Model}, "sample": {"trained": dsl.Model}, "evaluate": {"sampled": dsl.Dataset}}


def _container(command: str):
    """The container component of one ``dpsynth`` command (its name: dpsynth-<command>): inputs the run's ids, the
    base config and the settings (optional: None is the config's), ``shard_index`` for a pre-training shard, the
    train stage's shape for the train job; outputs ``start``'s parent run id and the artifacts of :data:`OUTPUTS`.
    ``pipeline finish`` takes no parent run id: it is the pipeline's exit task, which may depend on no task (it
    finds the parent run by the pipeline run id)."""
    P = inspect.Parameter
    names = ["run_dir", "pipeline_run_id"]
    names += [] if command in ("pipeline start", "pipeline finish") else ["parent_run_id"]
    names += ["dataset_uri", "config", "extra"] + (["shard_index"] if command == "pretrain shard" else [])
    types = {"extra": list, "shard_index": int}
    params = [P(n, P.POSITIONAL_OR_KEYWORD, annotation=types.get(n, str)) for n in names]
    settings = {**SETTINGS, **(LAUNCH if command == "train job" else {})}
    params += [P(n, P.POSITIONAL_OR_KEYWORD, default=None, annotation=Optional[_SETTING_TYPES.get(n, str)])
               for n in settings if n not in names]
    outputs = OUTPUTS.get(command, {})
    inputs = INPUTS_OF.get(command, {})
    params[len(names):len(names)] = [P(n, P.POSITIONAL_OR_KEYWORD, annotation=dsl.Input[t]) for n, t in inputs.items()]
    names += list(inputs)
    if command == "pipeline start":
        params.insert(len(names), P("parent_run_id", P.POSITIONAL_OR_KEYWORD, annotation=dsl.OutputPath(str)))
    params[len(names):len(names)] = [P(n, P.POSITIONAL_OR_KEYWORD, annotation=dsl.Output[t]) for n, t in outputs.items()]

    def fn(*args):
        p = dict(zip([q.name for q in params], args))
        out = p.pop("parent_run_id") if command == "pipeline start" else ""
        return dsl.ContainerSpec(image=image(command), command=["python", "-c", _RUN, out, "dpsynth"],
                                 args=_cli_args(command, p, {n: p[n] for n in outputs}, {n: p[n] for n in inputs}))

    fn.__signature__ = inspect.Signature(params)
    fn.__name__ = "dpsynth_" + command.replace("pipeline ", "").replace(" ", "_")
    return dsl.container_component(fn)


# The stage (chart's names: stage.gpu.stages, stage.resources.stages) of each command's pod; the pre-training's fan-in
# only reads what the per-shard pods wrote (a CPU pod)
STAGE_OF = {"pipeline start": "start", "pretrain shard": "pretrain", "pretrain": "pretrain-fan-in",
            "train job": "train-job", "pipeline finish": "finish"}


def stage_of(command: str) -> str:
    return STAGE_OF.get(command, command)


def image(command: str) -> str:
    """The image of a command's pod: the CUDA image (``DPSYNTH_GPU_IMAGE``) for a GPU stage, else the stage image."""
    return GPU_IMAGE if stage_of(command) in GPU_STAGES else STAGE_IMAGE


CONTAINER = {c: _container(c) for c in ("pipeline start", "partition", "pretrain shard", "pretrain", "train", "train job",
                                        "audit", "sample", "evaluate", "pipeline finish")}


# --- shard indices: a lightweight component, in the stage image on a cluster ----------------------

@dsl.component(base_image=STAGE_IMAGE, install_kfp_package=False)
def shard_indices(parent_run_id: str, config: str, extra: list, num_shards: int = 0) -> list:
    """What the pre-training fan-out iterates over: [{"shard": i, "parent_run_id": …} for i < K], K the run's
    partition.num_shards (``num_shards``; 0, the default: the config's. Not None: kfp.local cannot take it).

    The parent run id rides in the loop items because kfp.local (2.17.0) replaces every task output
    that enters a ParallelFor with the loop item; pipeline parameters and item fields come through."""
    from dpsynth.config import load_config

    sets = [*([f"partition.num_shards={num_shards}"] if num_shards else []), *extra]
    k = load_config(config or None, overrides=sets).partition.num_shards
    return [{"shard": i, "parent_run_id": parent_run_id} for i in range(k)]


@dsl.component(base_image=STAGE_IMAGE, install_kfp_package=False)
def train_distributed(config: str, extra: list, train_nodes: int = 0, train_gpus_per_node: int = 0) -> bool:
    """Whether the train stage runs on several ranks (dpsynth.distributed.launch.shape: train.nodes × train.gpus_per_node
    > 1, each the input's, else, when 0 (the default), the config's); a bad value fails the task, naming it."""
    from dpsynth.config import load_config
    from dpsynth.distributed.launch import shape

    sets = [f"train.{k}={v}" for k, v in (("nodes", train_nodes), ("gpus_per_node", train_gpus_per_node)) if v]
    return shape(load_config(config or None, overrides=[*sets, *extra]))["distributed"]


# --- local flavour: the same CLI with the current interpreter ---------------------------------------

@dsl.component(base_image=STAGE_IMAGE, install_kfp_package=False)  # runs locally; image for symmetry
def local_stage(command: str, run_dir: str, pipeline_run_id: str, dataset_uri: str, population_id: str, config: str,
                extra: list, parent_run_id: str = "",
                shard_index: int = -1) -> NamedTuple("Outputs", [("parent_run_id", str)]):
    """Runs ``python -m dpsynth.cli <command>`` like the container does ("train job": the train stage on
    several ranks of this machine, ``--launch torchrun``); outputs the parent run id. The local flavour's settings
    are all in ``extra`` (kfp.local cannot leave out an optional input: see ``local_pipeline``)."""
    import json
    import subprocess
    import sys
    from typing import NamedTuple

    heads = {"pretrain shard": ["pretrain", "--shard", str(shard_index)],
             "train job": ["train", "--launch", "torchrun"]}
    head = heads.get(command) or command.split()
    argv = [*head, "--json", "--run-dir", run_dir, "--pipeline-run-id", pipeline_run_id]
    if command != "pipeline start" and parent_run_id:  # finish, the exit task, finds it by the pipeline run id
        argv += ["--parent-run-id", parent_run_id]
    argv += ["--config", config] if config else []
    argv += ["--set", f"data.uri={dataset_uri}", "--set", f"ledger.population_id={population_id}"]
    for item in extra:  # on this machine the platform is yours: ledger.url, tracking.uri are allowed here
        argv += ["--set", item]
    print("dpsynth", *argv)  # the task log
    done = subprocess.run([sys.executable, "-m", "dpsynth.cli", *map(str, argv)], check=True,
                          stdout=subprocess.PIPE, text=True)
    print(done.stdout)
    ids = json.loads(done.stdout) if command == "pipeline start" else {"parent_run_id": parent_run_id}
    return NamedTuple("Outputs", [("parent_run_id", str)])(ids["parent_run_id"] or "")  # "": tracking off


# --- the wiring both flavours share -------------------------------------------------------------

def _wire(step, p: dict, *, cluster: bool) -> None:
    """``step(command, **inputs)`` makes a task; ``p`` holds the pipeline parameters. No KFP caching:
    a cached ``start`` would hand out a closed parent run; the stages skip their own repeats by manifest.
    ``cluster``: the stage pods' GPUs, configuration, resources, retries and time limits."""
    step = _uncached(step)
    settings = {name: p[name] for name in SETTINGS if name in p}  # the local flavour has only the required ones
    common = dict(run_dir=p["run_dir"], pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, config=p["config"],
                  extra=p["extra"], **settings)
    # The exit task: runs when the rest ends, succeeded, failed or refused, and closes the parent run with the
    # verdict the manifests give. It may depend on no task, so it takes pipeline parameters only.
    finish = step("pipeline finish", **common)
    with dsl.ExitHandler(finish, name="dpsynth-run"):
        _stages(step, p, common, settings, finish, cluster=cluster)


def _stages(step, p: dict, common: dict, settings: dict, finish, *, cluster: bool) -> None:
    start = step("pipeline start", **common)
    ids = dict(common, parent_run_id=start.outputs["parent_run_id"])

    partition = step("partition", **ids)
    # the artifact edges (cluster flavour: INPUTS_OF; kfp.local's lightweight flavour passes the order only)
    partitioned = {"partitioned": partition.outputs["dataset"]} if cluster else {}
    shards = shard_indices(**{k: v for k, v in settings.items() if k == "num_shards"},
                           parent_run_id=ids["parent_run_id"], config=p["config"], extra=p["extra"])
    shards.after(partition).set_caching_options(False)
    with dsl.ParallelFor(shards.output, parallelism=PRETRAIN_PARALLELISM) as shard:
        per_shard = step("pretrain shard", shard_index=shard.shard, **partitioned,
                         **dict(ids, parent_run_id=shard.parent_run_id))
    warm = step("pretrain", **partitioned, **ids).after(per_shard)  # fan-in: after every iteration of the loop
    shape = {name: p[name] for name in LAUNCH if name in p}
    distributed = train_distributed(**shape, config=p["config"], extra=p["extra"]).after(warm).set_caching_options(False)
    with dsl.If(distributed.output == True, "several ranks"):  # noqa: E712 (a KFP condition, not a Python test)
        job = step("train job", **shape, **partitioned, **ids)
    with dsl.Else():
        train = step("train", **partitioned, **ids)
    trained = {"trained": dsl.OneOf(job.outputs["model"], train.outputs["model"])} if cluster else {}
    audit = step("audit", **trained, **ids).after(job, train)
    sample = step("sample", **trained, **ids).after(audit)
    sampled = {"sampled": sample.outputs["synthetic"]} if cluster else {}
    evaluate = step("evaluate", **sampled, **ids).after(sample)
    if cluster:
        named = {"start": start, "partition": partition, "pretrain": per_shard, "pretrain-fan-in": warm,
                 "train": train, "train-job": job, "audit": audit, "sample": sample, "evaluate": evaluate,
                 "finish": finish}
        for stage, task in named.items():  # audit: one draw; finish: the verdict
            _on_cluster(task, stage, gpu=stage in GPU_STAGES, retry=task not in (audit, finish))
        for small in (shards, distributed):
            small.set_cpu_request("100m").set_memory_request("256Mi").set_memory_limit("512Mi")
            _pod_basics(small)
        if kubernetes is not None:  # the TrainJob launcher finds the chart's template by the stage ConfigMap
            kubernetes.use_config_map_as_env(job, STAGE_CONFIG_MAP, config_map_key_to_env={TEMPLATE_ENV: TEMPLATE_ENV})
            # the partition key: the platform's Secret, to the partition pod only; without it (or with the demo's
            # public key) the stage refuses to run
            kubernetes.use_secret_as_env(partition, PARTITION_KEY_SECRET,
                                         secret_key_to_env={"DPSYNTH_PARTITION_KEY": "DPSYNTH_PARTITION_KEY"},
                                         optional=True)
            partition.set_env_variable("DPSYNTH_REQUIRE_PARTITION_KEY", "true")


def _uncached(step):
    return lambda command, **kw: step(command, **kw).set_caching_options(False)


def _on_cluster(task, stage: str, *, gpu: bool, retry: bool) -> None:
    """One stage pod's cluster settings (see the module docstring)."""
    r = (RESOURCES.get("stages") or {}).get(stage) or RESOURCES["gpu" if gpu else "cpu"]
    setters = {("requests", "cpu"): task.set_cpu_request, ("requests", "memory"): task.set_memory_request,
               ("limits", "cpu"): task.set_cpu_limit, ("limits", "memory"): task.set_memory_limit}
    for (kind, resource), set_it in setters.items():
        if resource in r.get(kind, {}):
            set_it(str(r[kind][resource]))
    if gpu:
        task.set_accelerator_type(ACCELERATOR).set_accelerator_limit(GPU_LIMIT)
    if retry:
        # KFP's default backoff_max_duration (1 h, counted from the first attempt) would forbid retrying
        # a stage that failed after an hour: allow every attempt its full time limit.
        task.set_retry(RETRIES, backoff_duration=RETRY_BACKOFF,
                       backoff_max_duration=f"{(RETRIES + 1) * TIMEOUT_SECONDS}s")
    _pod_basics(task)
    if kubernetes is None:
        return
    kubernetes.use_secret_as_env(task, STAGE_SECRET, secret_key_to_env={k: k for k in SECRET_ENV})
    kubernetes.use_secret_as_env(task, STAGE_SECRET, secret_key_to_env={k: k for k in LOGIN_ENV}, optional=True)
    kubernetes.use_config_map_as_env(task, STAGE_CONFIG_MAP, config_map_key_to_env={k: k for k in CONFIG_ENV})
    kubernetes.use_config_map_as_env(task, STAGE_CONFIG_MAP, config_map_key_to_env={k: k for k in ENDPOINT_ENV},
                                     optional=True)
    kubernetes.set_timeout(task, TIMEOUT_SECONDS)
    if gpu:
        for toleration in GPU_TOLERATIONS:
            kubernetes.add_toleration(task, **{k: v for k, v in toleration.items()
                                               if k in ("key", "operator", "value", "effect", "toleration_seconds")})
        for label, value in GPU_NODE_SELECTOR.items():
            if value is not None:
                kubernetes.add_node_selector(task, label_key=label, label_value=value)


def _pod_basics(task) -> None:
    """What every pod of the compiled pipeline gets: its image named in its environment (MLflow lineage:
    ``DPSYNTH_IMAGE``; the image itself sets ``DPSYNTH_GIT_SHA``), a non-root user (PodSecurity "restricted"; KFP's
    compiler adds no privilege escalation, no capabilities and the runtime's seccomp profile), the registry's pull
    Secrets and the Kueue queue's label."""
    spec = task.container_spec
    if spec is not None:
        task.set_env_variable("DPSYNTH_IMAGE", spec.image)
    if kubernetes is None:
        return
    kubernetes.set_security_context(task, run_as_user=RUN_AS_USER, run_as_non_root=True)
    if IMAGE_PULL_SECRETS:
        kubernetes.set_image_pull_secrets(task, IMAGE_PULL_SECRETS)
    if KUEUE_QUEUE:
        kubernetes.add_pod_label(task, "kueue.x-k8s.io/queue-name", KUEUE_QUEUE)


def _documented(pipeline):
    """``pipeline`` with an Args docstring from :data:`INPUTS`: KFP shows each input's description."""
    names = inspect.signature(pipeline).parameters
    pipeline.__doc__ = "The pipeline's inputs.\n\nArgs:\n" + "".join(f"    {name}: {INPUTS[name]}\n" for name in names)
    return pipeline


# Every settings input is optional: None (left empty) keeps the config's value.
@dsl.pipeline(name="dpsynth", description="dpsynth: partition, pretrain ×K, train (GPU), audit, sample, evaluate")
@_documented
def dpsynth_pipeline(dataset_uri: str, run_dir: str, config: str = CONFIG,
                     extra: list = [],  # noqa: B006 (KFP default)
                     method: Optional[str] = None, epsilon: Optional[float] = None, delta: Optional[float] = None,
                     steps: Optional[int] = None, num_shards: Optional[int] = None, n_d: Optional[str] = None,
                     seed: Optional[int] = None, audit_empirical: Optional[str] = None,
                     train_nodes: Optional[int] = None, train_gpus_per_node: Optional[int] = None):
    _wire(lambda command, **kw: CONTAINER[command](**kw), locals(), cluster=True)


# kfp.local (2.17.0) cannot run a pipeline whose optional input without a default is left out ("Unknown value
# type") nor take None for one: the local flavour has only the required inputs, and its settings come in ``extra``
# (run_local.py puts the given ones there, before the user's).
@dsl.pipeline(name="dpsynth-local", description="dpsynth_pipeline's shape, stages as local Python subprocesses")
@_documented
def local_pipeline(dataset_uri: str, run_dir: str, population_id: str, config: str = LOCAL_CONFIG,
                   extra: list = []):  # noqa: B006 (KFP default)
    def step(command, **kw):
        return local_stage(command=command, population_id=population_id,
                           **{k: v for k, v in kw.items() if k not in LAUNCH})
    _wire(step, locals(), cluster=False)


def compile_yaml(path: str | os.PathLike = YAML) -> Path:
    """Write the cluster flavour's IR YAML; refuses (ConfigError) to without the platform's population."""
    if not POPULATION_ID:
        raise ConfigError("DPSYNTH_POPULATION_ID: required when compiling the pipeline: the population whose lifetime "
                          "privacy budget its runs charge (ledger.population_id) is the platform's, compiled in, not a "
                          "run input; e.g. DPSYNTH_POPULATION_ID=mnist (make kfp-yaml)")
    compiler.Compiler().compile(dpsynth_pipeline, str(path))
    return Path(path)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile", nargs="?", const=str(YAML), metavar="PATH",
                    help=f"write the IR YAML (default {YAML.name} beside this file)")
    args = ap.parse_args()
    if not args.compile:
        ap.error("nothing to do: pass --compile")
    try:
        print(compile_yaml(args.compile))
    except ConfigError as exc:
        ap.error(str(exc))
    sys.exit(0)
