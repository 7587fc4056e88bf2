"""What the dpsynth DAGs need besides Airflow: the stage command lines, and the pod of a stage.

Plain Python (the kubernetes client only inside ``stage_pod_operator``), so tests can build the
commands and the pod specs offline. Each setting is an Airflow Variable (any secrets backend: the
metadata DB, ``AIRFLOW_VAR_<NAME>``, ...), else the environment variable of that name (the chart's
ConfigMap), else its default:

- ``DPSYNTH_EXECUTOR``: "local" (the stage CLI in the stage venv, a subprocess) or "kubernetes"
  (a KubernetesPodOperator per stage, running ``DPSYNTH_STAGE_IMAGE``).
- local: ``DPSYNTH_STAGE_BIN`` (the ``dpsynth`` console script) or ``DPSYNTH_STAGE_PYTHON``
  (``python -m dpsynth.cli``); default ``<repo>/.venv/stage/bin/dpsynth``, run in ``DPSYNTH_REPO``.
- the train stage on several ranks (``dpsynth pipeline start`` reports ``train.nodes × train.gpus_per_node > 1``):
  local, ``dpsynth train --launch torchrun`` (the ranks on this machine); kubernetes, the ``train_job`` pod instead
  of ``train``: ``dpsynth train --launch trainjob`` (CPU; it creates and follows a Kubeflow Trainer TrainJob from the
  chart's template, as ``DPSYNTH_TRAIN_LAUNCHER_SERVICE_ACCOUNT``, the chart's ``<release>-train-launcher``).
- kubernetes: ``DPSYNTH_K8S_NAMESPACE``, ``DPSYNTH_GPU_STAGES`` (default "pretrain,train"),
  ``DPSYNTH_GPU_LIMIT``, ``DPSYNTH_GPU_NODE_SELECTOR`` and ``DPSYNTH_GPU_TOLERATIONS`` (JSON),
  ``DPSYNTH_STAGE_SECRET`` and ``DPSYNTH_STAGE_CONFIG_MAP`` (a Secret with the S3 credentials and the
  ledger URL, a ConfigMap with the MLflow URI and S3 endpoint: the stage pods' environment),
  ``DPSYNTH_K8S_CONFIG_FILE`` (a kubeconfig; else in-cluster), ``DPSYNTH_K8S_DEFERRABLE`` ("true":
  pods are waited for in the triggerer), ``DPSYNTH_K8S_STARTUP_TIMEOUT_SECONDS`` (900: time for a pod to
  be scheduled, e.g. while a GPU node is added by the autoscaler, and again to start).
- the trigger form: ``DPSYNTH_POPULATION_ID`` (the default of its population id, ``ledger.population_id``;
  unset: the config's), ``DPSYNTH_DATASET_URI``, ``DPSYNTH_RUN_ROOT``, ``DPSYNTH_CONFIG``, ``DPSYNTH_TRACKING_URI``.
  The ledger is ``DPSYNTH_LEDGER_URL`` (the stage Secret on Kubernetes), else beside a SQLite MLflow store or
  the local run root; the population's budget is set there beforehand (``dpsynth ledger set-budget``).
- every task: ``DPSYNTH_TASK_RETRIES`` (2), ``DPSYNTH_TASK_RETRY_DELAY_SECONDS`` (120),
  ``DPSYNTH_TASK_TIMEOUT_SECONDS`` (43200). Retrying is safe: a stage skips work its manifest records. Never
  retried: a stage that exits 2 (a verdict: bad input, a refused budget, a failed audit; ``AirflowFailException``),
  and the ``audit`` and ``finish`` tasks (:data:`NO_RETRY`: a failing randomised gate must not get three draws).
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

STAGES = ("partition", "pretrain", "train", "audit", "sample", "evaluate")
VERDICT = 2  # dpsynth's exit status for a verdict (DpsynthError: bad input, refused budget, failed audit)
NO_RETRY = ("audit", "finish")  # tasks run once: the audit's gates draw randomness; finish's failure is the verdict
# The exported config schema beside this file (dpsynth_config.schema.json; the Airflow environment has no dpsynth)
_SCHEMA = json.loads(Path(__file__).with_name("dpsynth_config.schema.json").read_text(encoding="utf-8"))
AUDIT_EMPIRICAL = tuple(_SCHEMA["$defs"]["AuditConfig"]["properties"]["empirical"]["enum"])  # audit.empirical's choices
# The settings a trigger may choose (dpsynth.config.RUN_SETTINGS, spelled out): the recipe. Every other setting is the
# platform's; who sets each: OWNERS (dpsynth.config.SETTING_OWNERS).
RUN_SETTINGS = frozenset(_SCHEMA["x-dpsynth-run-settings"])
OWNERS = _SCHEMA["x-dpsynth-owners"]
KNOWN = frozenset(f"{section}.{field}" for section, ref in _SCHEMA["properties"].items()
                  for field in _SCHEMA["$defs"][ref["$ref"].rsplit("/", 1)[1]]["properties"])
REPO = Path(os.environ.get("DPSYNTH_REPO", Path(__file__).resolve().parents[3]))
XCOM_FILE = "/airflow/xcom/return.json"  # what KubernetesPodOperator's sidecar pushes as XCom
# The stage pods' entrypoint: a constant script that runs its positional arguments ("$@", the argv of
# ``dpsynth <command> ...``) and sends the JSON to the XCom sidecar. The arguments are never parsed
# by the shell, so a value from the trigger form stays one inert argument whatever it contains.
POD_CMDS = ["sh", "-c", f'exec "$@" > {XCOM_FILE}', "dpsynth-stage"]


_VARIABLES: dict[str, str | None] = {}  # one lookup per Variable per process (a DAG file's parse, a task's run)


def variable(name: str) -> str | None:
    """The Airflow Variable NAME (None when unset or outside Airflow), looked up once per process: a parse of the
    DAG files asked the metadata database 274 times for 24 names in Kubernetes mode before."""
    if name not in _VARIABLES:
        try:
            from airflow.sdk import Variable
        except ImportError:  # outside Airflow, e.g. a test of the pod specs in the stage venv
            _VARIABLES[name] = None
        else:
            _VARIABLES[name] = Variable.get(name, default=None)
    return _VARIABLES[name]


def setting(name: str, default: str | None = None) -> str | None:
    """The Airflow Variable NAME, else the environment variable NAME, else ``default``."""
    return variable(name) or os.environ.get(name) or default


# Airflow Connections the tasks read at run time (never at parse time), each with a Variable as its fallback.
MLFLOW_CONNECTION = "dpsynth_mlflow"  # MLflow's tracking server: host (a URL, or a name with port and schema)
S3_CONNECTION = "dpsynth_s3"  # type aws: login/password the access key, extra endpoint_url and region_name


def connection(conn_id: str):
    """The Airflow Connection ``conn_id`` (any secrets backend, ``AIRFLOW_CONN_*`` included), None when it is not
    defined or outside Airflow."""
    try:
        from airflow.sdk import Connection
        from airflow.sdk.exceptions import AirflowNotFoundException
    except ImportError:
        return None
    try:
        return Connection.get(conn_id)
    except AirflowNotFoundException:
        return None


def tracking_uri() -> str | None:
    """MLflow's tracking URI, the platform's: the Connection :data:`MLFLOW_CONNECTION` (its host when that is a URL,
    else ``<scheme>://host[:port]``, the scheme its schema, else its type when http or https, else http), else the
    Variable or environment ``DPSYNTH_TRACKING_URI``."""
    conn = connection(MLFLOW_CONNECTION)
    if conn is None or not conn.host:
        return setting("DPSYNTH_TRACKING_URI")
    if "://" in conn.host:
        return conn.host
    scheme = conn.schema or (conn.conn_type if conn.conn_type in ("http", "https") else "http")
    return f"{scheme}://{conn.host}" + (f":{conn.port}" if conn.port else "")


def s3_env() -> dict[str, str]:
    """The S3 environment of a local stage process from the Connection :data:`S3_CONNECTION` (access key, endpoint,
    region); {} without it: the worker's own (AWS_* variables, an instance role). Stage pods take theirs from the
    stage Secret or their ServiceAccount, never from a Connection (a pod spec would show the key)."""
    conn = connection(S3_CONNECTION)
    if conn is None:
        return {}
    extra = conn.extra_dejson
    env = {"AWS_ACCESS_KEY_ID": conn.login, "AWS_SECRET_ACCESS_KEY": conn.password,
           "AWS_ENDPOINT_URL_S3": extra.get("endpoint_url"), "MLFLOW_S3_ENDPOINT_URL": extra.get("endpoint_url"),
           "AWS_DEFAULT_REGION": extra.get("region_name")}
    return {k: v for k, v in env.items() if v}


LOCAL_CONFIG = "configs/dpgan-mnist-cpu.yaml"  # the recipe `make run` trains (relative to DPSYNTH_REPO)


def config_default() -> str | None:
    """The form's base config: ``DPSYNTH_CONFIG`` (a Variable, else the environment: the chart's pipeline.config),
    where an empty value means none; unset: :data:`LOCAL_CONFIG`."""
    value = variable("DPSYNTH_CONFIG")
    if value is None:
        value = os.environ.get("DPSYNTH_CONFIG", LOCAL_CONFIG)
    return value or None


def require_remote(params: dict) -> None:
    """With the Kubernetes executor, the run root and the dataset must be object-store URIs (``s3://``…): a pod's
    disk is its own and goes with it. Raises ``AirflowFailException`` (no retry), naming the field."""
    if executor() != "kubernetes":
        return
    if not population():
        raise refused_error("DPSYNTH_POPULATION_ID (ledger.population_id): not set; on a cluster every run charges the "
                            "platform's population: set the chart's pipeline.populationId")
    for field, setting_name in (("run_root", "DPSYNTH_RUN_ROOT"), ("dataset_uri", "data.uri")):
        value = str(params.get(field) or "")
        if "://" not in value or value.startswith("file://"):
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(
                f"{field} ({setting_name}): {value!r} is a local path, but stages run as Kubernetes pods that share "
                f"no disk: give an s3:// URI (the chart's pipeline.runRoot / pipeline.datasetUri)")


def default_args() -> dict:
    """Every task's retries, retry delay and time limit (the DAGs' ``default_args``)."""
    return {"retries": int(setting("DPSYNTH_TASK_RETRIES", "2")),
            "retry_delay": timedelta(seconds=int(setting("DPSYNTH_TASK_RETRY_DELAY_SECONDS", "120"))),
            "execution_timeout": timedelta(seconds=int(setting("DPSYNTH_TASK_TIMEOUT_SECONDS", "43200")))}


def executor() -> str:
    mode = setting("DPSYNTH_EXECUTOR", "local")
    if mode not in ("local", "kubernetes"):
        raise ValueError(f"DPSYNTH_EXECUTOR: expected 'local' or 'kubernetes', got {mode!r}")
    return mode


# --- command lines ---------------------------------------------------------------------------

# The trigger form's fields that are settings: form field -> setting. A field left empty (null) passes nothing:
# the base config's value stands, so a run triggered with only the dataset filled in trains the config's recipe.
SETTINGS = {"dataset_uri": "data.uri", "population_id": "ledger.population_id", "method": "train.method",
            "epsilon": "privacy.epsilon", "delta": "privacy.delta", "steps": "train.steps",
            "num_shards": "partition.num_shards", "n_d": "train.n_d", "seed": "train.seed",
            "audit_empirical": "audit.empirical"}


def refusal(item: str) -> str | None:
    """None when a trigger may give ``item`` (``section.field=value``), else one line naming the setting and who
    sets it (``dpsynth.config.refusal``, from the schema's copy of its lists)."""
    name = str(item).split("=", 1)[0].strip()
    if name in RUN_SETTINGS:
        return None
    if name not in KNOWN:
        return f"{name}: no such setting (`dpsynth config schema` lists them)"
    return f"{name}: not a run's setting; {OWNERS.get(name) or OWNERS.get(name.split('.')[0]) or OWNERS['']} sets it"


def refused_error(message: str) -> Exception:
    """``AirflowFailException`` (a verdict on the trigger: never retried); ValueError outside Airflow."""
    try:
        from airflow.sdk.exceptions import AirflowFailException
    except ImportError:
        return ValueError(message)
    return AirflowFailException(message)


def platform_settings() -> list[str]:
    """The platform's settings (``DPSYNTH_STAGE_CONFIG``: the chart's stage.config) that are not a run's, as
    ``section.field=value``: given to every stage after the trigger's (the run settings among them are the form's
    defaults instead)."""
    given = json.loads(setting("DPSYNTH_STAGE_CONFIG") or "{}")
    return [f"{section}.{field}={json.dumps(value)}" for section, fields in given.items()
            for field, value in fields.items() if f"{section}.{field}" not in RUN_SETTINGS]


def population() -> str | None:
    """The platform's population (``DPSYNTH_POPULATION_ID``, the chart's pipeline.populationId): every run charges
    it. Required with the Kubernetes executor (:func:`require_remote`); unset locally: the form's, else the config's."""
    return setting("DPSYNTH_POPULATION_ID")


def overrides(params: dict) -> list[str]:
    """The trigger's settings as ``section.field=value`` (the form's fields, then its extra settings), then the
    platform's (:func:`platform_settings`, the tracking URI, the population), which no trigger can change. An empty
    field (None or "") is left out: the config's value. Only :data:`RUN_SETTINGS` are a trigger's: any other is
    refused with one line naming it and who sets it."""
    sets = [f"{field}={params[name]}" for name, field in SETTINGS.items()
            if params.get(name) not in (None, "") and field != "ledger.population_id"]
    if (audit := params.get("audit_empirical")) and audit not in AUDIT_EMPIRICAL:
        raise refused_error(f"audit_empirical (audit.empirical): must be one of {', '.join(AUDIT_EMPIRICAL)}, "
                            f"got {audit!r}")
    extra = [str(item) for item in params.get("overrides") or []]
    if refused := [line for item in extra if (line := refusal(item))]:
        raise refused_error("\n".join(f"extra settings: {line}" for line in refused))
    platform = platform_settings()
    if params.get("tracking_uri"):  # the platform's (DPSYNTH_TRACKING_URI), not on the form
        platform += ["tracking.enabled=true", f"tracking.uri={params['tracking_uri']}"]
    chosen = population() or params.get("population_id")
    if params.get("population_id") not in (None, "", chosen):
        raise refused_error(f"population_id (ledger.population_id): {params['population_id']!r} is not this "
                            f"platform's population {chosen!r}; {OWNERS['ledger.population_id']} sets it")
    return sets + extra + platform + ([f"ledger.population_id={chosen}"] if chosen else [])


def plan(params: dict, pipeline_run_id: str) -> dict:
    """Everything a stage call needs but the parent run id: plain values only."""
    run_dir = f"{str(params['run_root']).rstrip('/')}/{pipeline_run_id}"
    config = ["--config", params["config"]] if params.get("config") else []
    common = [*config, *(a for s in overrides(params) for a in ("--set", s)), "--run-dir", run_dir,
              "--pipeline-run-id", pipeline_run_id, "--json"]
    argv = {"start": ["pipeline", "start", *common], "finish": ["pipeline", "finish", *common],
            **{stage: [stage, *common] for stage in STAGES}}
    return {"pipeline_run_id": pipeline_run_id, "run_dir": run_dir, "argv": argv}


def pretrain_parallelism() -> int:
    """How many per-shard pre-training tasks of one DAG run run at once (``DPSYNTH_PRETRAIN_PARALLELISM``, 8):
    ``max_active_tis_per_dagrun`` of the mapped task (K can be 50 GPU pods otherwise)."""
    return int(setting("DPSYNTH_PRETRAIN_PARALLELISM", "8"))


def retries(task_id: str) -> dict:
    """``{"retries": 0}`` for the tasks of :data:`NO_RETRY`, else ``{}`` (default_args)."""
    return {"retries": 0} if task_id in NO_RETRY else {}


def verdict_error(stage: str, code: int, detail: str) -> Exception:
    """The exception a failed stage raises: ``AirflowFailException`` (no retry) for exit :data:`VERDICT`, else
    ``RuntimeError`` (retried)."""
    message = f"dpsynth {stage} exited {code}: {detail}"
    if code == VERDICT:
        from airflow.sdk.exceptions import AirflowFailException

        return AirflowFailException(message + " (a verdict: not retried)")
    return RuntimeError(message)


def with_parent(argv: list[str], parent_run_id: str | None) -> list[str]:
    return [*argv, "--parent-run-id", parent_run_id] if parent_run_id else list(argv)


TRAIN_JOB = "train_job"  # the kubernetes executor's task for the train stage on several ranks


def distributed(ids: dict) -> bool:
    """Whether the run's train stage runs on several ranks: ``dpsynth pipeline start``'s ``train`` (its shape)."""
    return bool((ids.get("train") or {}).get("distributed"))


def launched(argv: list[str], how: str) -> list[str]:
    """The train stage's argv started on several ranks: ``--launch torchrun`` (local) or ``trainjob`` (kubernetes)."""
    return [*argv, "--launch", how]


def local_command() -> list[str]:
    if python := setting("DPSYNTH_STAGE_PYTHON"):
        return [python, "-m", "dpsynth.cli"]
    return [setting("DPSYNTH_STAGE_BIN", str(REPO / ".venv" / "stage" / "bin" / "dpsynth"))]


def parse_json(stdout: str):
    """The JSON document a ``--json`` command printed (anything a library printed before it is skipped)."""
    start = min((i for i in (stdout.find("{"), stdout.find("[")) if i >= 0), default=-1)
    if start < 0:
        raise ValueError(f"no JSON in the stage output: {stdout[-2000:]!r}")
    return json.JSONDecoder().raw_decode(stdout[start:])[0]


def summarise(out: dict) -> dict:
    """A stage's ``--json`` outcome reduced to plain values: status, URIs, ε (and shard names)."""
    if "manifest" not in out:  # already summarised
        return out
    m = out["manifest"] or {}
    s = {"stage": out["stage"], "status": out["status"], "manifest_uri": out["manifest_uri"],
         "mlflow_run_id": out.get("mlflow_run_id"), "epsilon": (m.get("privacy") or {}).get("epsilon"),
         "outputs": [o["uri"] for o in m.get("outputs", [])]}
    if out["stage"] == "partition":
        s["shards"] = [Path(o["uri"]).stem for o in m.get("outputs", []) if o.get("role") == "shard"]
    return s


# --- pods --------------------------------------------------------------------------------------

# The stage pods' CPU/memory (the chart's stage.resources, as JSON in DPSYNTH_STAGE_RESOURCES): "cpu" and "gpu" for
# the CPU and GPU stages, "stages" per stage (replacing its default whole).
RESOURCES = {"cpu": {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
             "gpu": {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"memory": "32Gi"}}, "stages": {}}


def stage_resources(stage: str, gpu: bool) -> dict:
    """``{"requests": …, "limits": …}`` of one stage's pod (without the GPU limit)."""
    given = json.loads(setting("DPSYNTH_STAGE_RESOURCES") or "{}")
    r = {**RESOURCES, **given}
    return (r.get("stages") or {}).get(stage) or r["gpu" if gpu else "cpu"]


def pod_settings(stage: str) -> dict:
    """KubernetesPodOperator keyword arguments for one stage: GPU stages get ``nvidia.com/gpu``,
    a node selector and tolerations; the others are CPU-only."""
    from kubernetes.client import models as k8s

    gpu = stage in setting("DPSYNTH_GPU_STAGES", "pretrain,train").split(",")
    image = setting("DPSYNTH_STAGE_IMAGE", "dpsynth-stage:cpu")
    kw: dict = {"image": (setting("DPSYNTH_GPU_IMAGE") or image) if gpu else image,  # the CUDA image on GPU nodes
                "namespace": setting("DPSYNTH_K8S_NAMESPACE", "dpsynth"),
                "labels": {"app.kubernetes.io/name": "dpsynth", "dpsynth.stage": stage,
                           # Kueue admits the pod through this LocalQueue (DPSYNTH_KUEUE_QUEUE; unset: no Kueue)
                           **({"kueue.x-k8s.io/queue-name": q} if (q := setting("DPSYNTH_KUEUE_QUEUE")) else {})},
                "deferrable": setting("DPSYNTH_K8S_DEFERRABLE", "true").lower() == "true",
                # the provider also waits this long for the pod to be scheduled (schedule_timeout_seconds)
                "startup_timeout_seconds": int(setting("DPSYNTH_K8S_STARTUP_TIMEOUT_SECONDS", "900"))}
    r = stage_resources(stage, gpu)
    limits = {**r.get("limits", {}), **({"nvidia.com/gpu": setting("DPSYNTH_GPU_LIMIT", "1")} if gpu else {})}
    kw["container_resources"] = k8s.V1ResourceRequirements(requests=r.get("requests") or None, limits=limits or None)
    if gpu:
        kw["node_selector"] = json.loads(setting("DPSYNTH_GPU_NODE_SELECTOR", '{"nvidia.com/gpu.present": "true"}'))
        kw["tolerations"] = [k8s.V1Toleration(**t) for t in json.loads(setting(
            "DPSYNTH_GPU_TOLERATIONS", '[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]'))]
    if gpu and (pool := setting("DPSYNTH_GPU_POOL")):  # an Airflow pool: at most its slots of GPU pods at once
        kw["pool"] = pool
    # PodSecurity "restricted": non-root (the stage image's uid 10001), no privilege escalation, no capabilities,
    # the runtime's seccomp profile; the XCom sidecar the operator adds as well (it has none of its own)
    kw["security_context"] = k8s.V1PodSecurityContext(run_as_non_root=True, run_as_user=10001,
                                                      seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault"))
    kw["container_security_context"] = restricted_container()
    kw["xcom_sidecar_container_security_context"] = restricted_container()
    if secrets := [s for s in (setting("DPSYNTH_IMAGE_PULL_SECRETS") or "").split(",") if s]:
        kw["image_pull_secrets"] = [k8s.V1LocalObjectReference(name=s) for s in secrets]
    kw["env_vars"] = [k8s.V1EnvVar(name="DPSYNTH_IMAGE", value=kw["image"])]  # MLflow lineage: the code that ran
    if stage == "partition" and (key_secret := setting("DPSYNTH_PARTITION_KEY_SECRET")):
        # the platform's partition key, to the partition pod only; without it (or with the demo's public key) the
        # stage refuses to run (DPSYNTH_REQUIRE_PARTITION_KEY)
        kw["env_vars"] += [
            k8s.V1EnvVar(name="DPSYNTH_PARTITION_KEY", value_from=k8s.V1EnvVarSource(secret_key_ref=k8s.V1SecretKeySelector(
                name=key_secret, key="DPSYNTH_PARTITION_KEY", optional=True))),
            k8s.V1EnvVar(name="DPSYNTH_REQUIRE_PARTITION_KEY", value="true")]
    if account := setting("DPSYNTH_STAGE_SERVICE_ACCOUNT"):  # workload identity: S3 without static keys
        kw["service_account_name"] = account
    kw["env_from"] = []
    if secret := setting("DPSYNTH_STAGE_SECRET"):
        kw["env_from"].append(k8s.V1EnvFromSource(secret_ref=k8s.V1SecretEnvSource(name=secret)))
    if config_map := setting("DPSYNTH_STAGE_CONFIG_MAP"):
        kw["env_from"].append(k8s.V1EnvFromSource(config_map_ref=k8s.V1ConfigMapEnvSource(name=config_map)))
    if config_file := setting("DPSYNTH_K8S_CONFIG_FILE"):
        kw["config_file"] = config_file
    else:
        kw["in_cluster"] = True
    if stage == "train-job" and (account := setting("DPSYNTH_TRAIN_LAUNCHER_SERVICE_ACCOUNT")):
        kw["service_account_name"] = account  # may create and follow TrainJobs (the chart's Role)
    return kw


def restricted_container():
    """A container's securityContext under PodSecurity "restricted" (with the pod's non-root user and seccomp)."""
    from kubernetes.client import models as k8s

    return k8s.V1SecurityContext(allow_privilege_escalation=False, capabilities=k8s.V1Capabilities(drop=["ALL"]))


def stage_pod_operator(task_id: str, stage: str, arguments, *, mapped: bool = False, **kwargs):
    """A KubernetesPodOperator running ``arguments`` (``["dpsynth", <command>, ...]``: a list, or an
    XComArg of one) in the stage image through :data:`POD_CMDS`; the command's JSON goes to the XCom
    sidecar. ``mapped``: ``arguments`` is an XComArg of argument lists, one pod each (e.g. per shard)."""
    KubernetesPodOperator = stage_pod_operator_class()
    settings = dict(task_id=task_id, name=f"dpsynth-{stage}", cmds=POD_CMDS, do_xcom_push=True, get_logs=True,
                    on_finish_action="delete_succeeded_pod", **pod_settings(stage), **{**retries(task_id), **kwargs})
    if mapped:  # each argv ends with "--shard", K: the task instance's label in the UI
        return KubernetesPodOperator.partial(map_index_template="shard {{ task.arguments[-1] }}",
                                             max_active_tis_per_dagrun=pretrain_parallelism(),
                                             **settings).expand(arguments=arguments)
    return KubernetesPodOperator(arguments=arguments, **settings)


def exit_code(remote_pod, container: str = "base") -> int | None:
    """The exit status of a pod's container, or None while it has none."""
    statuses = (remote_pod.status.container_statuses if remote_pod and remote_pod.status else None) or []
    status = next((c for c in statuses if c.name == container), None)
    terminated = status.state.terminated if status and status.state else None
    return terminated.exit_code if terminated else None


_POD_OPERATOR = None


def stage_pod_operator_class():
    """KubernetesPodOperator whose failed pod with exit :data:`VERDICT` fails the task for good
    (``AirflowFailException``: no retry); any other failure stays retryable."""
    global _POD_OPERATOR
    if _POD_OPERATOR is None:
        from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

        class StagePodOperator(KubernetesPodOperator):
            def cleanup(self, pod, remote_pod, xcom_result=None, context=None):
                try:
                    return super().cleanup(pod, remote_pod, xcom_result=xcom_result, context=context)
                except Exception as exc:
                    code = exit_code(remote_pod, self.base_container_name)
                    if code == VERDICT:
                        raise verdict_error(self.task_id, code, str(exc).splitlines()[0]) from exc
                    raise

        StagePodOperator.__module__ = __name__
        _POD_OPERATOR = StagePodOperator
    return _POD_OPERATOR
