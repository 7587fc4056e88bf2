"""How the orchestrators start the pipeline's train stage on several ranks (``train.nodes × train.gpus_per_node > 1``).

    dpsynth train --run-dir RUN_DIR ... --launch torchrun   # this machine: torchrun, train.gpus_per_node ranks
    dpsynth train --run-dir RUN_DIR ... --launch trainjob   # Kubernetes: a Kubeflow Trainer TrainJob, waited for

Both run the stage's own command on every rank — ``dpsynth train --run-dir RUN_DIR ...`` without ``--launch``;
rank 0 is the stage (:mod:`dpsynth.stages.train`) — and end as the one-process stage ends: the stage's outcome
on stdout (``--json``: the JSON the orchestrators keep), its messages on stderr, exit 0 only when it succeeded.
The orchestrators choose a launch from :func:`shape` (``dpsynth pipeline start`` prints it for Airflow; the KFP
pipeline computes it from its parameters): Airflow's and KFP's local flavours ``torchrun``, their Kubernetes
flavours ``trainjob`` (pipelines/README.md).

``trainjob``: the TrainJob (``trainer.kubeflow.org/v1alpha1``, Kubeflow Trainer v2) is the chart's template —
the ConfigMap named by ``$DPSYNTH_TRAINJOB_TEMPLATE`` in the launcher's namespace, rendered from the chart values
(stage image, ClusterTrainingRuntime, the stage Secret's and ConfigMap's settings, resources, GPU node selector
and tolerations: charts/dpsynth/templates/trainjob.yaml) — with this run's name, shape and arguments
(:func:`trainjob_manifest`). The launcher creates it (or, retried, adopts the run's TrainJob while it runs and
replaces it once it has failed), copies the log of its first node — ranks 0 … gpus_per_node − 1, so rank 0's
stage messages — to stderr as it comes, waits for its ``Complete`` or ``Failed`` condition, then reads the stage's
manifest from the run directory and prints the outcome. Stopped (SIGTERM: the orchestrator's time limit, a
user), it deletes the TrainJob; the next attempt resumes from the stage's last checkpoint, on any shape
(``train.nodes`` and ``train.gpus_per_node`` are in no fingerprint).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

from dpsynth.errors import ConfigError, StageError

LAUNCHES = ("torchrun", "trainjob")
GROUP, VERSION, PLURAL, KIND = "trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"
TEMPLATE_ENV = "DPSYNTH_TRAINJOB_TEMPLATE"  # the chart's ConfigMap holding the TrainJob template
TEMPLATE_KEY = "trainjob.yaml"
COMMAND = ["torchrun", "-m", "dpsynth"]  # every node: torchrun (its rendezvous from the runtime's PET_* env)
GPU = "nvidia.com/gpu"
CHART_PATCH = "dpsynth.io/chart"  # the template's runtime patch: the GPU pool's node selector and tolerations
ANNOTATION = "dpsynth.io/pipeline-run-id"
FIRST_NODE = "jobset.sigs.k8s.io/jobset-name={name},batch.kubernetes.io/job-completion-index=0"
log = logging.getLogger(__name__)


def shape(cfg) -> dict:
    """Where the train stage runs: ``{"nodes", "gpus_per_node", "ranks", "distributed"}`` (distributed: ranks > 1)."""
    t = cfg.train
    ranks = t.nodes * t.gpus_per_node
    return {"nodes": t.nodes, "gpus_per_node": t.gpus_per_node, "ranks": ranks, "distributed": ranks > 1}


def stage_argv(args) -> list[str]:
    """The train stage's command line after ``dpsynth``, from ``dpsynth train``'s parsed options, without
    ``--launch``."""
    argv = ["train", *(["--config", args.config] if args.config else [])]
    argv += [a for o in args.overrides for a in ("--set", o)]
    for flag, value in (("--run-dir", args.run_dir), ("--parent-run-id", args.parent_run_id),
                        ("--pipeline-run-id", args.pipeline_run_id)):
        if value:
            argv += [flag, value]
    return argv + (["--force"] if args.force else []) + (["--json"] if args.json else [])


def run(how: str, cfg, args) -> int:
    """``dpsynth train --launch HOW``: refuse what cannot run before anything starts, then launch."""
    from dpsynth.methods.distributed import METHODS
    from dpsynth.privacy.distributed import env_ranks

    if not (args.run_dir or cfg.pipeline.run_dir):
        raise ConfigError("pipeline.run_dir: --launch starts the pipeline's train stage; give --run-dir")
    if cfg.train.method not in METHODS:
        raise ConfigError(f"train.method: {cfg.train.method!r} trains in one process only; --launch needs one of "
                          f"{', '.join(METHODS)}")
    if env_ranks().distributed:
        raise ConfigError("--launch: this process is already a rank of a torchrun job; drop --launch")
    if args.run_dir is None:
        args.run_dir = cfg.pipeline.run_dir
    return run_torchrun(cfg, args) if how == "torchrun" else run_trainjob(cfg, args)


# --- this machine -------------------------------------------------------------------------------------------


def run_torchrun(cfg, args) -> int:
    """The stage on ``train.gpus_per_node`` ranks of this machine (``torchrun --standalone``; gloo on CPU, NCCL on
    GPUs); its exit status."""
    if cfg.train.nodes != 1:
        raise ConfigError(f"train.nodes: {cfg.train.nodes} nodes need a cluster (--launch trainjob); --launch "
                          "torchrun starts train.gpus_per_node ranks on this machine")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               str(cfg.train.gpus_per_node), "-m", "dpsynth", *stage_argv(args)]
    log.info("train: %d ranks on this machine: %s", cfg.train.gpus_per_node, " ".join(command))
    return subprocess.run(command).returncode  # stdout and stderr are ours: rank 0's outcome and every log line


# --- Kubernetes: a Kubeflow Trainer TrainJob ------------------------------------------------------------------


def trainjob_name(pipeline_run_id: str) -> str:
    """A TrainJob name for the run: an RFC 1035 label of at most 40 characters (JobSet names its pods after it),
    stable across retries, distinct per run (a digest of the whole id)."""
    base = re.sub(r"[^a-z0-9-]+", "-", pipeline_run_id.lower()).strip("-")[:17].strip("-")
    digest = hashlib.sha256(pipeline_run_id.encode()).hexdigest()[:8]
    return "-".join(p for p in ("dpsynth-train", base, digest) if p)


def trainjob_manifest(template: dict, cfg, argv: list[str], *, name: str, namespace: str,
                      pipeline_run_id: str) -> dict:
    """The chart's TrainJob ``template`` for this run: its name, ``train.nodes`` nodes of ``train.gpus_per_node``
    ranks, one GPU each (none with ``train.device=cpu``, which also drops the chart's GPU-pool placement), every
    rank running ``torchrun -m dpsynth`` + ``argv`` (the stage's command line)."""
    if not isinstance(template, dict) or template.get("kind") != KIND or not isinstance(template.get("spec"), dict):
        raise ConfigError(f"{TEMPLATE_ENV}: the template is not a {KIND} (the chart renders it into the ConfigMap "
                          f"<release>-trainjob, key {TEMPLATE_KEY})")
    job = copy.deepcopy(template)
    meta = job.setdefault("metadata", {})
    meta.update(name=name, namespace=namespace)
    meta["annotations"] = {**(meta.get("annotations") or {}), ANNOTATION: pipeline_run_id}
    spec, t = job["spec"], cfg.train
    trainer = spec.setdefault("trainer", {})
    trainer.update(command=COMMAND, args=list(argv), numNodes=t.nodes, numProcPerNode=t.gpus_per_node)
    resources = trainer.setdefault("resourcesPerNode", {})
    limits = resources.setdefault("limits", {})
    if t.device == "cpu":
        limits.pop(GPU, None)
        spec["runtimePatches"] = [p for p in spec.get("runtimePatches") or [] if p.get("manager") != CHART_PATCH]
        for parent, key in ((spec, "runtimePatches"), (resources, "limits"), (trainer, "resourcesPerNode")):
            if not parent[key]:
                del parent[key]
    else:
        limits[GPU] = str(t.gpus_per_node)
    return job


def condition(job: dict | None) -> str | None:
    """"Complete" or "Failed" once the TrainJob has finished (its condition of that type is True), else None."""
    for c in ((job or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return c["type"]
    return None


def failure(job: dict) -> str:
    found = [c for c in (job.get("status") or {}).get("conditions") or [] if c.get("type") == "Failed"]
    return f"{found[0].get('reason')}: {found[0].get('message')}" if found else "no reason given"


class Cluster:
    """The few Kubernetes API calls the launcher makes, in its own namespace (in-cluster, else the kubeconfig)."""

    def __init__(self, namespace: str | None = None):
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        self.objects, self.core = client.CustomObjectsApi(), client.CoreV1Api()
        in_cluster = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        self.namespace = (namespace or os.environ.get("DPSYNTH_K8S_NAMESPACE")
                          or (in_cluster.read_text().strip() if in_cluster.exists() else "default"))

    def template(self, config_map: str) -> dict:
        import yaml

        data = self.core.read_namespaced_config_map(config_map, self.namespace).data or {}
        if TEMPLATE_KEY not in data:
            raise ConfigError(f"{TEMPLATE_ENV}: ConfigMap {config_map!r} in {self.namespace!r} has no {TEMPLATE_KEY}")
        return yaml.safe_load(data[TEMPLATE_KEY])

    def get(self, name: str) -> dict | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.objects.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def create(self, body: dict) -> None:
        self.objects.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)

    def delete(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.objects.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name,
                                                         propagation_policy="Foreground")
        except ApiException as e:
            if e.status != 404:
                raise

    def first_node_pod(self, name: str) -> str | None:
        """The running (or finished) pod of the TrainJob's first node, once there is one."""
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=FIRST_NODE.format(name=name)).items
        started = [p for p in pods if p.status.phase in ("Running", "Succeeded", "Failed")]
        return started[0].metadata.name if started else None

    def log_lines(self, pod: str) -> Iterator[str]:
        stream = self.core.read_namespaced_pod_log(pod, self.namespace, follow=True, _preload_content=False)
        for line in stream:
            yield line.decode("utf-8", errors="replace").rstrip("\n")


class Stopped(Exception):
    """The launcher was told to stop (SIGTERM)."""


def run_trainjob(cfg, args, *, cluster=None, poll_s: float = 10.0, grace_s: float = 30.0) -> int:
    """``--launch trainjob``: create (or adopt) the run's TrainJob, follow it to the end, print the stage's outcome.
    A refusal of the Kubernetes API (no template, no permission, no TrainJob CRD) ends it with exit 2 and the
    API's reason."""
    try:
        from kubernetes.client.exceptions import ApiException
    except ImportError:  # pragma: no cover - the stage image has the client (kfp needs it)
        ApiException = ()  # noqa: N806
    try:
        return _run_trainjob(cfg, args, cluster=cluster, poll_s=poll_s, grace_s=grace_s)
    except ApiException as e:
        what = {403: "permission denied (the pod's service account needs the chart's <release>-train-launcher Role)",
                404: f"not found (the ConfigMap ${TEMPLATE_ENV}, or the TrainJob CRD: is Kubeflow Trainer v2 "
                     "installed?)"}
        raise StageError(f"train: the Kubernetes API answered {e.status} {e.reason}: "
                         f"{what.get(e.status, (e.body or '')[:500])}") from None


def _run_trainjob(cfg, args, *, cluster, poll_s: float, grace_s: float) -> int:
    from dpsynth.stages import common, manifest

    config_map = os.environ.get(TEMPLATE_ENV)
    if not config_map:
        raise ConfigError(f"{TEMPLATE_ENV}: the name of the chart's TrainJob template ConfigMap (the stage ConfigMap "
                          "sets it) is needed to start the train stage as a TrainJob")
    ctx = common.StageContext.create(cfg, run_dir=args.run_dir, parent_run_id=args.parent_run_id,
                                     pipeline_run_id=args.pipeline_run_id, force=args.force)
    run_id = ctx.pipeline_run_id or ctx.run_dir
    cluster = cluster or Cluster()
    name = trainjob_name(run_id)
    body = trainjob_manifest(cluster.template(config_map), cfg, stage_argv(args), name=name,
                             namespace=cluster.namespace, pipeline_run_id=run_id)
    existing = cluster.get(name)
    if existing is not None and condition(existing) == "Failed":  # a failed earlier attempt: this one starts anew
        log.info("train: TrainJob %s failed before (%s); replacing it", name, failure(existing))
        cluster.delete(name)
        while cluster.get(name) is not None:
            time.sleep(poll_s)
        existing = None
    if existing is None:
        cluster.create(body)
        log.info("train: TrainJob %s created in %s: %d node(s) × %d rank(s)", name, cluster.namespace,
                 cfg.train.nodes, cfg.train.gpus_per_node)
    else:
        log.info("train: adopting TrainJob %s of this run (%s)", name, condition(existing) or "running")

    def stop(signum, frame):
        raise Stopped()

    previous = signal.signal(signal.SIGTERM, stop) if threading.current_thread() is threading.main_thread() else None
    try:
        job = follow(cluster, name, poll_s=poll_s, grace_s=grace_s)
    except (Stopped, KeyboardInterrupt):
        log.error("train: stopped; deleting TrainJob %s (the next attempt resumes from its checkpoint)", name)
        cluster.delete(name)
        raise StageError(f"train: stopped while TrainJob {name} ran; it was deleted") from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if condition(job) != "Complete":
        raise StageError(f"train: TrainJob {name} failed: {failure(job)} (its first node's log is above)")
    uri = ctx.manifest_uri("train")
    m = manifest.read(uri)
    if m.get("status") != "succeeded":
        raise StageError(f"train: TrainJob {name} completed but {uri} records status {m.get('status')!r}")
    outcome = {"stage": "train", "status": m["status"], "manifest_uri": uri, "mlflow_run_id": m.get("mlflow_run_id"),
               "manifest": m, "trainjob": {"name": name, "namespace": cluster.namespace, **shape(cfg)}}
    if args.json:
        print(json.dumps(outcome, indent=2))
    else:
        print(f"train: {m['status']} (TrainJob {name}), ε consumed {m['privacy']['epsilon']:.4g}, "
              f"{len(m['outputs'])} outputs; manifest {uri}")
    return 0


def follow(cluster, name: str, *, poll_s: float, grace_s: float) -> dict:
    """Wait for the TrainJob to finish, copying its first node's log to stderr meanwhile; the finished TrainJob."""
    reader = None
    while True:
        job = cluster.get(name)
        if job is None:
            raise StageError(f"train: TrainJob {name} disappeared (deleted by someone else?)")
        if reader is None and (pod := cluster.first_node_pod(name)) is not None:
            log.info("train: following %s (ranks 0 … %d)", pod, job["spec"]["trainer"]["numProcPerNode"] - 1)
            reader = threading.Thread(target=_copy_log, args=(cluster, pod), daemon=True)
            reader.start()
        if condition(job) is not None:
            if reader is not None:
                reader.join(grace_s)  # the rest of the log
            log.info("train: TrainJob %s: %s", name, condition(job))
            return job
        time.sleep(poll_s)


def _copy_log(cluster, pod: str) -> None:
    try:
        for line in cluster.log_lines(pod):
            print(line, file=sys.stderr, flush=True)
    except Exception as e:  # a broken log stream must not end the launch: the TrainJob's condition decides
        log.warning("train: the log of %s stopped: %s", pod, e)
