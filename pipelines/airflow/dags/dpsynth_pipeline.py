"""The task graph shared by ``dpsynth_train`` and ``dpsynth_retrain_on_new_data``.

plan → start → data_changed → partition → pretrain_shard (mapped over the K shards: one `dpsynth pretrain --shard K`
each) → pretrain (the fan-in) → train → audit
→ sample → evaluate → finish. When the train stage runs on several ranks (``start`` reports
train.nodes × train.gpus_per_node > 1) the local ``train`` task starts it under torchrun, and on Kubernetes
``train_launch`` picks the ``train_job`` pod (a Kubeflow Trainer TrainJob, followed) instead of ``train``. ``start`` opens the MLflow parent run, each stage nests its child run
under it, ``finish`` (run whatever happened upstream) closes it and fails the DAG run unless every
stage succeeded. A retrain (a run triggered by the dataset's asset event) whose data version is the one last
released for its population opens no run and charges nothing (``start --unless-released``), and ``data_changed``
then skips every later task. Tasks pass only plain values: ids, URIs, ε.
"""

from __future__ import annotations

import collections
import io
import os
import re
import shlex
import subprocess
import threading
import time

from airflow.sdk import Param, task

import dpsynth_form as form
import dpsynth_pods as pods

DATASET_URI = pods.setting("DPSYNTH_DATASET_URI", "outputs/data/mnist.parquet")


# The form fields that are settings: form field -> setting (dpsynth_pods.overrides passes them on).
SETTINGS = pods.SETTINGS


def params(dataset_uri: str = DATASET_URI) -> dict:
    """The trigger form (JSON schema validated when a run is triggered). A setting's field takes its type,
    bounds, choices and description from dpsynth's config schema (``dpsynth_form``); its default is the
    platform's value (``DPSYNTH_STAGE_CONFIG``), else empty: the base config's. Only the run settings
    (``dpsynth_pods.RUN_SETTINGS``, an allow-list) are a trigger's; the plan task refuses any other in the extra
    settings. The tracking URI is the platform's ``DPSYNTH_TRACKING_URI``, read when a run starts."""
    population = form.setting("ledger.population_id")["description"]
    platform_population = pods.setting("DPSYNTH_POPULATION_ID")
    return {
        "dataset_uri": form.param("data.uri", dataset_uri, title="Dataset URI", type="string"),  # required
        # a governance setting: where the platform names the population (DPSYNTH_POPULATION_ID, the chart's
        # pipeline.populationId), a trigger cannot change it (const); else the config's, or the trigger's
        "population_id": form.param("ledger.population_id", platform_population, title="Population id",
                                    **({"const": platform_population, "description": f"{population} Set by the "
                                        "platform (DPSYNTH_POPULATION_ID): a run cannot change it."}
                                       if platform_population else {"description": f"{population} Empty: the config's."})),
        **{name: form.param(SETTINGS[name], title=title, description=(
            f"{form.setting(SETTINGS[name]).get('description', '')} Empty: the config's."))
           for name, title in (("method", "Method"), ("epsilon", "ε (target)"), ("delta", "δ"),
                               ("steps", "Step budget (private steps)"), ("num_shards", "Shards K"),
                               ("n_d", "n_d policy"), ("seed", "Seed"), ("audit_empirical", "Empirical audit"))},
        "run_root": Param(pods.setting("DPSYNTH_RUN_ROOT", "outputs/airflow"), type="string", minLength=1,
                          title="Storage root URI", description="each run writes under ROOT/<pipeline run id>"),
        "config": Param(pods.config_default(), type=["null", "string"], title="Base YAML config",
                        description="path in the stage environment (the stage image: /opt/dpsynth/configs/…); "
                                    "empty: none, the models' defaults"),
        "overrides": Param(form.extra_settings(set(SETTINGS.values())), type="array",
                           items={"type": "string", "pattern": form.SETTING_ITEM}, title="Extra settings",
                           description="section.field=value, applied after the fields above (default: the "
                                       "platform's settings, DPSYNTH_STAGE_CONFIG, that have no field above). A run "
                                       f"may set these: {form.run_settings_text()}. Any other is the platform's: "
                                       "the run fails at once, naming it and who sets it."),
        "pipeline_run_id": Param(None, type=["null", "string"], title="Pipeline run id (default: from the DAG run)"),
    }


PROGRESS_EVERY = 30.0  # seconds between the progress-bar refreshes copied into the task log
QUIET = 50.0  # seconds of silence after which the task log says the stage is still running


def _run_local(argv: list[str]):
    """The stage CLI in the stage venv; its JSON output, or an error with the end of its stderr.

    The stage's stderr (its log lines and progress bars) goes into the task log line by line while it
    runs, and a stage silent for ``QUIET`` seconds gets a "still running" line, so the log is never
    silent for a minute; stdout is kept for the JSON result."""
    command = [*pods.local_command(), *argv]
    started = last = time.monotonic()

    def write(line: str) -> None:
        nonlocal last
        last = time.monotonic()
        print(line, flush=True)

    def heartbeat() -> None:
        while not done.wait(5):
            if time.monotonic() - last >= QUIET:
                write(f"{time.strftime('%H:%M:%S')} dpsynth INFO {argv[0]}: still running, "
                      f"{time.monotonic() - started:.0f} s so far")

    write(f"dpsynth {argv[0]}: running {shlex.join(command)}")
    done = threading.Event()
    with subprocess.Popen(command, cwd=pods.REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env={**os.environ, **pods.s3_env(), "PYTHONUNBUFFERED": "1"}) as proc:
        out: list[bytes] = []
        reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
        reader.start()
        threading.Thread(target=heartbeat, daemon=True).start()
        try:
            tail = stream(proc.stderr, write)
        finally:
            done.set()
        reader.join()
    if proc.returncode != 0:  # exit 2, a verdict: AirflowFailException, never retried
        raise pods.verdict_error(argv[0], proc.returncode, "\n".join(tail))
    return pods.parse_json(out[0].decode())


def stream(pipe, write=None, clock=time.monotonic, keep: int = 40) -> list[str]:
    """Copy ``pipe``'s lines to ``write`` (default: print them into the task log) as they come; returns
    the last ``keep`` lines. A progress bar redraws itself with carriage returns: of those redraws, one
    every ``PROGRESS_EVERY`` seconds is copied (and the last one), so the log shows progress without a
    line per redraw."""
    write = write or (lambda line: print(line, flush=True))
    tail: collections.deque[str] = collections.deque(maxlen=keep)
    last_shown, pending = -PROGRESS_EVERY, None
    for line in io.TextIOWrapper(pipe, encoding="utf-8", errors="replace", newline=""):
        text = line.rstrip("\r\n")
        if not text.strip():
            continue
        if line.endswith("\r") and not line.endswith("\r\n"):  # a redraw: more will follow
            if clock() - last_shown < PROGRESS_EVERY:
                pending = text
                continue
            last_shown = clock()
        pending = None
        write(text)
        tail.append(text)
    if pending is not None:
        write(pending)
        tail.append(pending)
    return list(tail)


def dataset_update(context) -> dict | None:
    """The ``extra`` of the newest asset event that triggered this run (``dpsynth_import_data``'s:
    dataset URI and content sha256), or None for a run not triggered by an asset."""
    events = [e for evs in (context.get("triggering_asset_events") or {}).values() for e in evs]
    return max(events, key=lambda e: e.timestamp).extra if events else None


@task
def plan(**context) -> dict:
    p = dict(context["params"])
    if update := dataset_update(context):  # retrain on the imported version
        print(f"triggered by a dataset update: {update}")
        p["dataset_uri"] = update.get("dataset_uri") or p["dataset_uri"]
    p["tracking_uri"] = pods.tracking_uri()  # the platform's (Connection dpsynth_mlflow, or a Variable), never the trigger's
    pods.require_remote(p)  # stage pods share no disk: a local path would point at nothing
    run_id = p.get("pipeline_run_id") or re.sub(r"[^A-Za-z0-9_.-]+", "-", context["run_id"])[:60]
    planned = pods.plan(p, run_id)
    if update:  # a retrain: no run (no ε) when the version is the population's last release (data_changed)
        planned["argv"]["start"].append("--unless-released")
    return {**planned, "dataset_update": update}


@task.short_circuit(ignore_downstream_trigger_rules=True)
def data_changed(ids: dict) -> bool:
    """False, skipping every task after ``start`` (``finish`` too: no run was opened), when ``start`` found a
    retrain's data unchanged since its population's last release (``--unless-released``: nothing charged)."""
    if ids.get("skipped"):
        print(ids["skipped"])
        return False
    return True


@task
def shards(partition: dict) -> list[int]:
    """The shard indices the pre-training fans out over (from the partition's outcome)."""
    names = pods.summarise(partition)["shards"]
    if not names:
        raise ValueError("partition wrote no shards")
    return list(range(len(names)))


@task(map_index_template="shard {{ task.op_kwargs['shard'] }}", max_active_tis_per_dagrun=pods.pretrain_parallelism())
def pretrain_shard(plan: dict, shard: int) -> dict:
    """``dpsynth pretrain --shard K``: one shard's non-private pre-training (GS-WGAN, DPAC); a no-op
    record for methods without one. The ``pretrain`` task after them is the fan-in."""
    return _run_local([*plan["argv"]["pretrain"], "--shard", str(shard)])


def _local_tasks(plan_out):
    @task(task_id="start")
    def start(plan: dict) -> dict:
        return _run_local(plan["argv"]["start"])

    def stage_task(stage: str):
        @task(task_id=stage, **pods.retries(stage))  # audit: once (its gates draw randomness)
        def run(plan: dict, ids: dict) -> dict:
            argv = pods.with_parent(plan["argv"][stage], ids["parent_run_id"])
            if stage == "train" and pods.distributed(ids):  # several ranks: torchrun on this machine
                argv = pods.launched(argv, "torchrun")
            return pods.summarise(_run_local(argv))
        return run

    @task(task_id="finish", trigger_rule="all_done", retries=0)  # a failed pipeline is a verdict, not a glitch
    def finish(plan: dict, ids: dict) -> dict:
        s = _run_local(pods.with_parent(plan["argv"]["finish"], ids["parent_run_id"]))
        out = {k: s[k] for k in ("succeeded", "epsilon_total", "delta", "audit", "run_dir", "parent_run_id",
                                 "pipeline_run_id")}
        if not s["succeeded"]:
            raise RuntimeError(f"pipeline failed: {[(r['stage'], r['status']) for r in s['stages']]}")
        return out

    ids = start(plan_out)
    return ids, {stage: stage_task(stage)(plan_out, ids) for stage in pods.STAGES}, finish(plan_out, ids)


@task(multiple_outputs=True)
def start_command(plan: dict) -> dict:
    """``{"start": argv}``: the start pod's ``dpsynth pipeline start ...`` (an argv list, no shell)."""
    return {"start": ["dpsynth", *plan["argv"]["start"]]}


@task(multiple_outputs=True)
def stage_commands(plan: dict, ids: dict) -> dict:
    """``{stage: argv}`` for every stage pod, ``finish`` and ``train_job``, each nested under the parent run."""
    argv = {name: ["dpsynth", *pods.with_parent(plan["argv"][name], ids["parent_run_id"])]
            for name in (*pods.STAGES, "finish")}
    return {**argv, pods.TRAIN_JOB: pods.launched(argv["train"], "trainjob")}


@task.branch
def train_launch(ids: dict) -> str:
    """``train_job`` (the stage as a TrainJob) when ``start`` reports the train stage on several ranks, else
    ``train``."""
    return pods.TRAIN_JOB if pods.distributed(ids) else "train"


@task
def shard_commands(plan: dict, partition: dict) -> list[list[str]]:
    """One argv per shard (``dpsynth pretrain --shard K``), for the mapped pre-training pods."""
    names = pods.summarise(partition)["shards"]
    return [["dpsynth", *plan["argv"]["pretrain"], "--shard", str(k)] for k in range(len(names))]


def _kubernetes_tasks(plan_out):
    ids = pods.stage_pod_operator("start", "start", start_command(plan_out)["start"])
    argv = stage_commands(plan_out, ids.output)
    # audit follows whichever of train / train_job ran (train_launch skips the other)
    stages = {stage: pods.stage_pod_operator(stage, stage, argv[stage], **(
        {"trigger_rule": "none_failed_min_one_success"} if stage == "audit" else {})) for stage in pods.STAGES}
    job = pods.stage_pod_operator(pods.TRAIN_JOB, "train-job", argv[pods.TRAIN_JOB])
    train_launch(ids.output) >> [stages["train"], job]
    stages["pretrain"] >> job >> stages["audit"]
    finish = pods.stage_pod_operator("finish", "finish", argv["finish"], trigger_rule="all_done", retries=0)
    return ids, {s: op.output for s, op in stages.items()}, finish


def pipeline() -> None:
    """Add the pipeline's tasks to the DAG being defined."""
    plan_out = plan()
    kubernetes = pods.executor() == "kubernetes"
    ids, out, finish = (_kubernetes_tasks if kubernetes else _local_tasks)(plan_out)
    data_changed(ids.output if kubernetes else ids) >> [*out.values(), finish]
    if kubernetes:
        per_shard = pods.stage_pod_operator("pretrain_shard", "pretrain", shard_commands(plan_out, out["partition"]),
                                            mapped=True)
    else:
        per_shard = pretrain_shard.partial(plan=plan_out).expand(shard=shards(out["partition"]))
    out["partition"] >> per_shard >> out["pretrain"]
    out["pretrain"] >> out["train"] >> out["audit"] >> out["sample"] >> out["evaluate"] >> finish
