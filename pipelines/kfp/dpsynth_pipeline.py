"""Kubeflow Pipelines v2: the six dpsynth stages, one task each, under one MLflow parent run.

    start → partition → warmstart --shard k (ParallelFor over k < K, GPU) → warmstart (fan-in) → train (GPU)
          → audit → sample → evaluate → finish

Two flavours of one wiring (``_wire``), so they cannot drift apart:

- ``dpsynth_pipeline``: container components of the stage image (``STAGE_IMAGE``, env
  ``DPSYNTH_STAGE_IMAGE``) running ``dpsynth <stage>``; compiled to ``dpsynth_pipeline.yaml``
  (``python pipelines/kfp/dpsynth_pipeline.py --compile``).
- ``local_pipeline``: lightweight Python components that run the same CLI with the current
  interpreter (``sys.executable -m dpsynth.cli``), for ``kfp.local.SubprocessRunner`` (``run_local.py``).

Tasks pass only plain values: the run directory URI, the MLflow parent run id (an output of
``start``), the pipeline run id (KFP's job id) and the settings, as ``--set section.field=value``.

``population_id`` (``ledger.population_id``, a required parameter: the stage pods read no config file)
names whose lifetime privacy budget every training attempt is charged, in the ledger at
``DPSYNTH_LEDGER_URL``. The ledger gives no budget by default: an operator sets it beforehand with
``dpsynth ledger set-budget POPULATION --epsilon E --delta D --records N --reason TEXT`` (docs/cluster.md);
``start`` refuses a run the budget cannot afford.

On a cluster (``dpsynth_pipeline``; kfp-kubernetes) every stage pod gets its configuration from the
dpsynth chart's objects in the run's namespace: the Secret ``STAGE_SECRET`` (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, DPSYNTH_LEDGER_URL) and the ConfigMap ``STAGE_CONFIG_MAP`` (MLFLOW_TRACKING_URI;
AWS_ENDPOINT_URL_S3 and MLFLOW_S3_ENDPOINT_URL where an S3-compatible endpoint is used), as environment;
CPU/memory requests and limits (``CPU_RESOURCES``, ``GPU_RESOURCES``), ``RETRIES`` retries with backoff
(the stages skip work their manifests record; not ``finish``, whose failure is the verdict) and a
per-pod time limit (``TIMEOUT_SECONDS``, activeDeadlineSeconds). Without MLFLOW_TRACKING_URI a pod
would track into SQLite under the run dir.
"""

import argparse
import os
import sys
from pathlib import Path
from typing import NamedTuple

from kfp import compiler, dsl

STAGE_IMAGE = os.environ.get("DPSYNTH_STAGE_IMAGE", "dpsynth-stage:latest")
ACCELERATOR = "nvidia.com/gpu"  # KFP accelerator type → resources.limits["nvidia.com/gpu"] on the pod
GPU_STAGES = ("warmstart shard", "train")  # the per-shard warm starts and the private training
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
GPU_NODE_SELECTOR = {"nvidia.com/gpu.present": "true"}
YAML = Path(__file__).with_name("dpsynth_pipeline.yaml")

# Cluster settings of the stage pods (dpsynth_pipeline only). Names: the dpsynth chart's defaults for a
# release called "dpsynth" (env at compile time to change them).
STAGE_SECRET = os.environ.get("DPSYNTH_STAGE_SECRET", "dpsynth-stage")
STAGE_CONFIG_MAP = os.environ.get("DPSYNTH_STAGE_CONFIG_MAP", "dpsynth-stage-config")
SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "DPSYNTH_LEDGER_URL")
CONFIG_ENV = ("MLFLOW_TRACKING_URI",)
ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "MLFLOW_S3_ENDPOINT_URL")  # optional: absent for AWS S3 itself
CPU_RESOURCES = {"cpu_request": "1", "memory_request": "4Gi", "memory_limit": "8Gi"}
GPU_RESOURCES = {"cpu_request": "4", "memory_request": "16Gi", "memory_limit": "32Gi"}
RETRIES = 2
RETRY_BACKOFF = "120s"
TIMEOUT_SECONDS = 12 * 3600

# The pipeline parameters that become stage settings: pipeline parameter -> config field.
SETTINGS = {"dataset_uri": "data.uri", "population_id": "ledger.population_id", "method": "train.method", "epsilon": "privacy.epsilon",
            "delta": "privacy.delta", "steps": "train.steps", "num_shards": "partition.num_shards",
            "n_d": "train.n_d", "seed": "train.seed", "audit_empirical": "audit.empirical"}

try:  # kfp-kubernetes: tolerations and node selectors of the GPU pods
    from kfp import kubernetes
except ImportError:  # pragma: no cover - depends on the environment
    kubernetes = None


# --- container flavour: `dpsynth <command>` in the stage image --------------------------------------

def _cli_args(command: str, p: dict) -> list:
    """``dpsynth`` argv (after the program) for one command; ``p`` holds the task's inputs (placeholders).
    "warmstart shard" is ``dpsynth warmstart --shard K``, one iteration of the fan-out."""
    head = ["warmstart", "--shard", p["shard_index"]] if command == "warmstart shard" else command.split()
    args = [*head, "--json", "--run-dir", p["run_dir"], "--pipeline-run-id", p["pipeline_run_id"]]
    if command != "pipeline start":
        args += ["--parent-run-id", p["parent_run_id"]]
    for name, field in SETTINGS.items():
        args += ["--set", f"{field}={p[name]}"]
    return args


# `pipeline start` prints {"parent_run_id", ...}: keep the id as the task's output parameter.
_START = """\
import json, pathlib, subprocess, sys
out = pathlib.Path(sys.argv[1])
ids = json.loads(subprocess.run(sys.argv[2:], check=True, stdout=subprocess.PIPE, text=True).stdout)
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(ids["parent_run_id"] or "")  # "" when MLflow tracking is off
"""


def _container(command: str):
    """The container component of one ``dpsynth`` command (its name: dpsynth-<command>)."""

    def stage(run_dir: str, pipeline_run_id: str, parent_run_id: str, dataset_uri: str, population_id: str,
              method: str, epsilon: float, delta: float, steps: int, num_shards: int, n_d: str, seed: int, audit_empirical: str):
        return dsl.ContainerSpec(image=STAGE_IMAGE, command=["dpsynth"], args=_cli_args(command, locals()))

    def warmstart_shard(run_dir: str, pipeline_run_id: str, parent_run_id: str, dataset_uri: str, population_id: str,
                        method: str, epsilon: float, delta: float, steps: int, num_shards: int, n_d: str, seed: int,
                        audit_empirical: str, shard_index: int):
        return dsl.ContainerSpec(image=STAGE_IMAGE, command=["dpsynth"], args=_cli_args(command, locals()))

    def start(run_dir: str, pipeline_run_id: str, dataset_uri: str, population_id: str, method: str, epsilon: float,
              delta: float, steps: int, num_shards: int, n_d: str, seed: int, audit_empirical: str,
              parent_run_id: dsl.OutputPath(str)):
        args = _cli_args(command, {**locals(), "parent_run_id": None})
        return dsl.ContainerSpec(image=STAGE_IMAGE, command=["python", "-c", _START, parent_run_id, "dpsynth"],
                                 args=args)

    fn = {"pipeline start": start, "warmstart shard": warmstart_shard}.get(command, stage)
    fn.__name__ = "dpsynth_" + command.replace("pipeline ", "").replace(" ", "_")
    return dsl.container_component(fn)


CONTAINER = {c: _container(c) for c in ("pipeline start", "partition", "warmstart shard", "warmstart", "train", "audit", "sample",
                                        "evaluate", "pipeline finish")}


# --- shard indices: a lightweight component, in the stage image on a cluster ----------------------

@dsl.component(base_image=STAGE_IMAGE, install_kfp_package=False)
def shard_indices(num_shards: int, parent_run_id: str) -> list:
    """What the warm-start fan-out iterates over: [{"shard": i, "parent_run_id": …} for i < K].

    The parent run id rides in the loop items because kfp.local (2.17.0) replaces every task output
    that enters a ParallelFor with the loop item; pipeline parameters and item fields come through."""
    return [{"shard": i, "parent_run_id": parent_run_id} for i in range(num_shards)]


# --- local flavour: the same CLI with the current interpreter ---------------------------------------

@dsl.component(base_image=STAGE_IMAGE, install_kfp_package=False)  # runs locally; image for symmetry
def local_stage(command: str, run_dir: str, pipeline_run_id: str, dataset_uri: str, population_id: str, method: str,
                epsilon: float, delta: float, steps: int, num_shards: int, n_d: str, seed: int, audit_empirical: str,
                extra: list, parent_run_id: str = "", shard_index: int = -1) -> NamedTuple("Outputs", [("parent_run_id", str)]):
    """Runs ``python -m dpsynth.cli <command>`` like the container does; outputs the parent run id."""
    import json
    import subprocess
    import sys
    from typing import NamedTuple

    values = {"dataset_uri": dataset_uri, "population_id": population_id, "method": method, "epsilon": epsilon, "delta": delta, "steps": steps,
              "num_shards": num_shards, "n_d": n_d, "seed": seed, "audit_empirical": audit_empirical}
    fields = {"dataset_uri": "data.uri", "population_id": "ledger.population_id",  # = SETTINGS
              "method": "train.method", "epsilon": "privacy.epsilon",
              "delta": "privacy.delta", "steps": "train.steps", "num_shards": "partition.num_shards",
              "n_d": "train.n_d", "seed": "train.seed", "audit_empirical": "audit.empirical"}
    head = ["warmstart", "--shard", str(shard_index)] if command == "warmstart shard" else command.split()
    argv = [*head, "--json", "--run-dir", run_dir, "--pipeline-run-id", pipeline_run_id]
    if command != "pipeline start":
        argv += ["--parent-run-id", parent_run_id]
    for name, field in fields.items():
        argv += ["--set", f"{field}={values[name]}"]
    for item in extra:
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
    settings = {name: p[name] for name in SETTINGS}
    common = dict(run_dir=p["run_dir"], pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, **settings)
    start = step("pipeline start", **common)
    ids = dict(common, parent_run_id=start.outputs["parent_run_id"])

    partition = step("partition", **ids)
    shards = shard_indices(num_shards=p["num_shards"], parent_run_id=ids["parent_run_id"])
    shards.after(partition).set_caching_options(False)
    with dsl.ParallelFor(shards.output) as shard:
        per_shard = step("warmstart shard", shard_index=shard.shard, **dict(ids, parent_run_id=shard.parent_run_id))
    warm = step("warmstart", **ids).after(per_shard)  # fan-in: after every iteration of the loop
    train = step("train", **ids).after(warm)
    audit = step("audit", **ids).after(train)
    sample = step("sample", **ids).after(audit)
    evaluate = step("evaluate", **ids).after(sample)
    finish = step("pipeline finish", **ids).after(evaluate)
    if cluster:
        for task in (start, partition, per_shard, warm, train, audit, sample, evaluate, finish):
            _on_cluster(task, gpu=task in (per_shard, train), retry=task is not finish)
        shards.set_cpu_request("100m").set_memory_request("256Mi").set_memory_limit("512Mi")


def _uncached(step):
    return lambda command, **kw: step(command, **kw).set_caching_options(False)


def _on_cluster(task, *, gpu: bool, retry: bool) -> None:
    """One stage pod's cluster settings (see the module docstring)."""
    r = GPU_RESOURCES if gpu else CPU_RESOURCES
    task.set_cpu_request(r["cpu_request"]).set_memory_request(r["memory_request"]).set_memory_limit(r["memory_limit"])
    if gpu:
        task.set_accelerator_type(ACCELERATOR).set_accelerator_limit(1)
    if retry:
        # KFP's default backoff_max_duration (1 h, counted from the first attempt) would forbid retrying
        # a stage that failed after an hour: allow every attempt its full time limit.
        task.set_retry(RETRIES, backoff_duration=RETRY_BACKOFF,
                       backoff_max_duration=f"{(RETRIES + 1) * TIMEOUT_SECONDS}s")
    if kubernetes is None:
        return
    kubernetes.use_secret_as_env(task, STAGE_SECRET, secret_key_to_env={k: k for k in SECRET_ENV})
    kubernetes.use_config_map_as_env(task, STAGE_CONFIG_MAP, config_map_key_to_env={k: k for k in CONFIG_ENV})
    kubernetes.use_config_map_as_env(task, STAGE_CONFIG_MAP, config_map_key_to_env={k: k for k in ENDPOINT_ENV},
                                     optional=True)
    kubernetes.set_timeout(task, TIMEOUT_SECONDS)
    if gpu:
        kubernetes.add_toleration(task, **GPU_TOLERATION)
        for label, value in GPU_NODE_SELECTOR.items():
            kubernetes.add_node_selector(task, label_key=label, label_value=value)


@dsl.pipeline(name="dpsynth", description="dpsynth: partition, warmstart ×K, train (GPU), audit, sample, evaluate")
def dpsynth_pipeline(dataset_uri: str, run_dir: str, population_id: str, method: str = "dpgan", epsilon: float = 10.0,
                     delta: float = 1e-5, steps: int = 2000, num_shards: int = 1, n_d: str = "adaptive",
                     seed: int = 0, audit_empirical: str = "off"):
    _wire(lambda command, **kw: CONTAINER[command](**kw), locals(), cluster=True)


@dsl.pipeline(name="dpsynth-local", description="dpsynth_pipeline's shape, stages as local Python subprocesses")
def local_pipeline(dataset_uri: str, run_dir: str, population_id: str, method: str = "dpgan", epsilon: float = 10.0,
                   delta: float = 1e-5, steps: int = 2000, num_shards: int = 1, n_d: str = "adaptive",
                   seed: int = 0, audit_empirical: str = "off", extra: list = []):  # noqa: B006 (KFP default)
    _wire(lambda command, **kw: local_stage(command=command, extra=extra, **kw), locals(), cluster=False)


def compile_yaml(path: str | os.PathLike = YAML) -> Path:
    compiler.Compiler().compile(dpsynth_pipeline, str(path))
    return Path(path)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile", nargs="?", const=str(YAML), metavar="PATH",
                    help=f"write the IR YAML (default {YAML.name} beside this file)")
    args = ap.parse_args()
    if not args.compile:
        ap.error("nothing to do: pass --compile")
    print(compile_yaml(args.compile))
    sys.exit(0)
