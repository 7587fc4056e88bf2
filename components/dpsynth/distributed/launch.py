"""How the orchestrators start the pipeline's train stage on several ranks (``train.nodes × train.gpus_per_node > 1``).

    dpsynth train --run-dir RUN_DIR ... --launch torchrun   # this machine: torchrun, train.gpus_per_node ranks
    dpsynth train --run-dir RUN_DIR ... --launch trainjob   # Kubernetes: a Kubeflow TrainJob / PyTorchJob, waited for

Both run the stage's own command on every rank — ``dpsynth train --run-dir RUN_DIR ...`` without ``--launch``;
rank 0 is the stage (:mod:`dpsynth.stages.train`) — and end as the one-process stage ends: the stage's outcome
on stdout (``--json``: the JSON the orchestrators keep), its messages on stderr, exit 0 only when it succeeded.
The orchestrators choose a launch from :func:`shape` (``dpsynth pipeline start`` prints it for Airflow; the KFP
pipeline computes it from its parameters): Airflow's and KFP's local flavours ``torchrun``, their Kubernetes
flavours ``trainjob`` (pipelines/README.md).

``trainjob``: the job is the chart's template — the ConfigMap named by ``$DPSYNTH_TRAINJOB_TEMPLATE`` in the
launcher's namespace, rendered from the chart values (stage image, the stage Secret's and ConfigMap's settings,
resources, GPU node selector and tolerations: charts/dpsynth/templates/trainjob.yaml) — with this run's name, shape
and arguments (:func:`trainjob_manifest`). Its kind is the chart's ``trainJob.kind``: a Kubeflow Trainer v2
``TrainJob`` (``trainer.kubeflow.org/v1alpha1``), or a ``PyTorchJob`` (``kubeflow.org/v1``) on clusters that run
the older Kubeflow training operator; :data:`KINDS` holds all that differs between them. The launcher creates the
job (or, retried, adopts the run's job while it runs and replaces it once it has failed), copies the log of its
first node — ranks 0 … gpus_per_node − 1, so rank 0's stage messages — to stderr as it comes, waits for its
success (``Complete`` / ``Succeeded``) or ``Failed`` condition; then the train stage reads its manifest from the
run directory and prints the outcome (:func:`dpsynth.stages.train.launched`). Stopped (SIGTERM: the orchestrator's time limit, a user), it deletes the job; the
next attempt resumes from the stage's last checkpoint, on any shape (``train.nodes`` and ``train.gpus_per_node`` are
in no fingerprint).
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from dpsynth import threads
from dpsynth.errors import ConfigError, StageError

LAUNCHES = ("torchrun", "trainjob")
TEMPLATE_ENV = "DPSYNTH_TRAINJOB_TEMPLATE"  # the chart's ConfigMap holding the job template
TEMPLATE_KEY = "trainjob.yaml"
COMMAND = ["torchrun", "-m", "dpsynth"]  # every node: torchrun, its rendezvous from the PET_* env the operator sets
GPU = "nvidia.com/gpu"
CHART_PATCH = "dpsynth.io/chart"  # the TrainJob template's runtime patch: the GPU pool's node selector and tolerations
ANNOTATION = "dpsynth.io/pipeline-run-id"
CONTAINER = "pytorch"  # a PyTorchJob replica's container (the training operator's name for it)
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


def run(how: str, cfg, args, *, methods: tuple[str, ...], federated: bool, report: Callable[[dict], None]) -> int:
    """``dpsynth train --launch HOW``: refuse what cannot run before anything starts, then launch (``methods``: the
    registry's data-parallel methods; ``federated``: whether this run's method is; ``report``: what prints a
    TrainJob's outcome, :func:`run_trainjob`; torchrun's rank 0 prints its own)."""
    from dpsynth.distributed.ranks import env_ranks

    if not (args.run_dir or cfg.pipeline.run_dir):
        raise ConfigError("pipeline.run_dir: --launch starts the pipeline's train stage; give --run-dir")
    if cfg.train.method not in methods:
        how_it_runs = ("starts its own K + 1 ranks (server and clients) on this machine; run it without --launch"
                       if federated else "trains in one process only")
        raise ConfigError(f"train.method: {cfg.train.method!r} {how_it_runs}; --launch runs the data-parallel "
                          f"methods: {', '.join(methods)}")
    if env_ranks().distributed:
        raise ConfigError("--launch: this process is already a rank of a torchrun job; drop --launch")
    if args.run_dir is None:
        args.run_dir = cfg.pipeline.run_dir
    return run_torchrun(cfg, args) if how == "torchrun" else run_trainjob(cfg, args, report=report)


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
    # stdout and stderr are ours: rank 0's outcome and every log line; the ranks share this process's CPUs
    child = subprocess.Popen(command, env=threads.environment_for(cfg.train.gpus_per_node))
    return wait_forwarding_sigterm(child)


def wait_forwarding_sigterm(child: subprocess.Popen) -> int:
    """``child``'s exit status, or 143 when this process got SIGTERM meanwhile. A SIGTERM (the pod's grace period
    begins) is passed on to ``child`` (torchrun, which passes it on to every rank: rank 0 checkpoints, commits what
    its steps spent and closes its reservation, dpsynth.termination) and this process waits for it to end. Killing
    torchrun instead (what an exception in ``subprocess.run`` does) left the ranks running to the end, charging the
    whole run after the attempt had been reported stopped."""
    got: list[int] = []

    def forward(signum, frame):
        got.append(signum)
        child.send_signal(signum)

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, forward) if main else None
    try:
        code = child.wait()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if got:
        log.error("train: stopped by SIGTERM; the ranks ended with status %s", code)
        return 128 + got[0]
    return code


# --- Kubernetes: a Kubeflow Trainer TrainJob, or the older training operator's PyTorchJob -----------------------


def trainjob_name(pipeline_run_id: str) -> str:
    """A job name for the run: an RFC 1035 label of at most 40 characters (JobSet and the training operator name
    pods and services after it), stable across retries, distinct per run (a digest of the whole id)."""
    base = re.sub(r"[^a-z0-9-]+", "-", pipeline_run_id.lower()).strip("-")[:17].strip("-")
    digest = hashlib.sha256(pipeline_run_id.encode()).hexdigest()[:8]
    return "-".join(p for p in ("dpsynth-train", base, digest) if p)


def _drop_empty(*pairs) -> None:
    """Remove ``parent[key]`` when it is empty, in the order given (innermost first)."""
    for parent, key in pairs:
        if not parent.get(key):
            parent.pop(key, None)


def _trainjob_shape(spec: dict, t, argv: list[str]) -> None:
    """A TrainJob's trainer: ``numNodes`` × ``numProcPerNode``, one GPU per rank in ``resourcesPerNode`` (with
    ``train.device=cpu`` none, and no chart runtime patch: the GPU pool's placement)."""
    trainer = spec.setdefault("trainer", {})
    trainer.update(command=COMMAND, args=list(argv), numNodes=t.nodes, numProcPerNode=t.gpus_per_node)
    resources = trainer.setdefault("resourcesPerNode", {})
    limits = resources.setdefault("limits", {})
    if t.device == "cpu":
        limits.pop(GPU, None)
        spec["runtimePatches"] = [p for p in spec.get("runtimePatches") or [] if p.get("manager") != CHART_PATCH]
        _drop_empty((spec, "runtimePatches"), (resources, "limits"), (trainer, "resourcesPerNode"))
    else:
        limits[GPU] = str(t.gpus_per_node)


def _pytorchjob_shape(spec: dict, t, argv: list[str]) -> None:
    """A PyTorchJob's replicas: the template's ``Master`` (node 0, so rank 0) and ``train.nodes − 1`` ``Worker``
    copies of it, ``nprocPerNode`` ranks each, one GPU per rank on the ``pytorch`` container (with
    ``train.device=cpu`` none, and no node selector or tolerations: the GPU pool's placement)."""
    replicas = spec.get("pytorchReplicaSpecs") or {}
    master = replicas.get("Master")
    pods = master and [c for c in master["template"]["spec"].get("containers") or [] if c.get("name") == CONTAINER]
    if not pods:
        raise ConfigError(f"{TEMPLATE_ENV}: the PyTorchJob template has no Master replica with a {CONTAINER!r} "
                          "container (the chart renders one)")
    pod, [container] = master["template"]["spec"], pods
    container.update(command=COMMAND, args=list(argv))
    spec["nprocPerNode"] = str(t.gpus_per_node)
    resources = container.setdefault("resources", {})
    limits = resources.setdefault("limits", {})
    if t.device == "cpu":
        limits.pop(GPU, None)
        pod.pop("nodeSelector", None)
        pod.pop("tolerations", None)
        _drop_empty((resources, "limits"), (container, "resources"))
    else:
        limits[GPU] = str(t.gpus_per_node)
    master["replicas"] = 1
    replicas.pop("Worker", None)
    if t.nodes > 1:
        replicas["Worker"] = {**copy.deepcopy(master), "replicas": t.nodes - 1}


@dataclass(frozen=True)
class Kind:
    """What differs between the two kinds of job the launcher runs; everything else is one code path."""

    kind: str
    group: str
    version: str
    plural: str
    succeeded: str  # the condition type of success (failure: "Failed" for both)
    first_node: str  # label selector of the first node's pod ({name}: the job's)
    shape: Callable  # (spec, cfg.train, argv): sets the run's shape, command line and GPUs in the spec

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


KINDS = {k.kind: k for k in (
    Kind("TrainJob", "trainer.kubeflow.org", "v1alpha1", "trainjobs", "Complete",
         "jobset.sigs.k8s.io/jobset-name={name},batch.kubernetes.io/job-completion-index=0", _trainjob_shape),
    Kind("PyTorchJob", "kubeflow.org", "v1", "pytorchjobs", "Succeeded",
         "training.kubeflow.org/job-name={name},training.kubeflow.org/replica-type=master,"
         "training.kubeflow.org/replica-index=0", _pytorchjob_shape))}


def kind_of(template) -> Kind:
    """The :class:`Kind` of the chart's template (``trainJob.kind``), refusing anything else."""
    got = template.get("kind") if isinstance(template, dict) else None
    kind = KINDS.get(got)
    if kind is None or template.get("apiVersion") != kind.api_version or not isinstance(template.get("spec"), dict):
        raise ConfigError(f"trainJob.kind: the template in ${TEMPLATE_ENV} (ConfigMap <release>-trainjob, key "
                          f"{TEMPLATE_KEY}) is a {got!r}, not one of "
                          f"{', '.join(f'{k.kind} ({k.api_version})' for k in KINDS.values())}")
    return kind


def trainjob_manifest(template: dict, cfg, argv: list[str], *, name: str, namespace: str,
                      pipeline_run_id: str) -> dict:
    """The chart's job ``template`` (a TrainJob or a PyTorchJob) for this run: its name, ``train.nodes`` nodes of
    ``train.gpus_per_node`` ranks, one GPU each (none with ``train.device=cpu``, which also drops the chart's
    GPU-pool placement), every rank running ``torchrun -m dpsynth`` + ``argv`` (the stage's command line)."""
    kind = kind_of(template)
    job = copy.deepcopy(template)
    meta = job.setdefault("metadata", {})
    meta.update(name=name, namespace=namespace)
    meta["annotations"] = {**(meta.get("annotations") or {}), ANNOTATION: pipeline_run_id}
    kind.shape(job["spec"], cfg.train, argv)
    return job


def condition(job: dict | None) -> str | None:
    """The job's final condition once it has finished — its kind's success type (``Complete`` / ``Succeeded``) or
    ``Failed``, whichever is True — else None."""
    kind = KINDS.get((job or {}).get("kind"))
    for c in ((job or {}).get("status") or {}).get("conditions") or []:
        if kind and c.get("type") in (kind.succeeded, "Failed") and c.get("status") == "True":
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

    def get(self, kind: Kind, name: str) -> dict | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.objects.get_namespaced_custom_object(kind.group, kind.version, self.namespace, kind.plural,
                                                             name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def create(self, kind: Kind, body: dict) -> None:
        self.objects.create_namespaced_custom_object(kind.group, kind.version, self.namespace, kind.plural, body)

    def delete(self, kind: Kind, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.objects.delete_namespaced_custom_object(kind.group, kind.version, self.namespace, kind.plural, name,
                                                         propagation_policy="Foreground")
        except ApiException as e:
            if e.status != 404:
                raise

    def first_node_pod(self, kind: Kind, name: str) -> str | None:
        """The running (or finished) pod of the job's first node, once there is one."""
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=kind.first_node.format(name=name)).items
        started = [p for p in pods if p.status.phase in ("Running", "Succeeded", "Failed")]
        return started[0].metadata.name if started else None

    def log_lines(self, pod: str) -> Iterator[str]:
        stream = self.core.read_namespaced_pod_log(pod, self.namespace, follow=True, _preload_content=False)
        for line in stream:
            yield line.decode("utf-8", errors="replace").rstrip("\n")


class Stopped(Exception):
    """The launcher was told to stop (SIGTERM)."""


def run_trainjob(cfg, args, *, report: Callable[[dict], None], cluster=None, poll_s: float = 10.0,
                 grace_s: float = 30.0) -> int:
    """``--launch trainjob``: create (or adopt) the run's job (the template's kind: TrainJob or PyTorchJob), follow
    it to the end, then ``report`` it (``{"kind", "name", "namespace"}`` and its :func:`shape`): the caller reads
    the stage's manifest and prints its outcome (:func:`dpsynth.stages.train.launched`). A refusal of the
    Kubernetes API (no template, no permission, no CRD of that kind) ends it with exit 2 and the API's reason."""
    try:
        from kubernetes.client.exceptions import ApiException
    except ImportError:  # pragma: no cover - the stage image has the client (kfp needs it)
        ApiException = ()  # noqa: N806
    try:
        return _run_trainjob(cfg, args, report=report, cluster=cluster, poll_s=poll_s, grace_s=grace_s)
    except ApiException as e:
        what = {403: "permission denied (the pod's service account needs the chart's <release>-train-launcher Role)",
                404: f"not found (the ConfigMap ${TEMPLATE_ENV}, or the CRD of the template's kind: is Kubeflow "
                     "Trainer v2 installed, for a TrainJob, or the training operator v1, for a PyTorchJob?)"}
        raise StageError(f"train: the Kubernetes API answered {e.status} {e.reason}: "
                         f"{what.get(e.status, (e.body or '')[:500])}") from None


def _run_trainjob(cfg, args, *, report: Callable[[dict], None], cluster, poll_s: float, grace_s: float) -> int:
    config_map = os.environ.get(TEMPLATE_ENV)
    if not config_map:
        raise ConfigError(f"{TEMPLATE_ENV}: the name of the chart's job template ConfigMap (the stage ConfigMap "
                          "sets it) is needed to start the train stage as a TrainJob or PyTorchJob")
    run_id = args.pipeline_run_id or str(args.run_dir or cfg.pipeline.run_dir).rstrip("/")
    cluster = cluster or Cluster()
    name = trainjob_name(run_id)
    template = cluster.template(config_map)
    kind = kind_of(template)
    body = trainjob_manifest(template, cfg, stage_argv(args), name=name, namespace=cluster.namespace,
                             pipeline_run_id=run_id)
    what = f"{kind.kind} {name}"
    existing = cluster.get(kind, name)
    if existing is not None and condition(existing) == "Failed":  # a failed earlier attempt: this one starts anew
        log.info("train: %s failed before (%s); replacing it", what, failure(existing))
        cluster.delete(kind, name)
        while cluster.get(kind, name) is not None:
            time.sleep(poll_s)
        existing = None
    if existing is None:
        cluster.create(kind, body)
        log.info("train: %s created in %s: %d node(s) × %d rank(s)", what, cluster.namespace, cfg.train.nodes,
                 cfg.train.gpus_per_node)
    else:
        log.info("train: adopting %s of this run (%s)", what, condition(existing) or "running")

    def stop(signum, frame):
        raise Stopped()

    previous = signal.signal(signal.SIGTERM, stop) if threading.current_thread() is threading.main_thread() else None
    try:
        job = follow(cluster, kind, name, poll_s=poll_s, grace_s=grace_s)
    except (Stopped, KeyboardInterrupt):
        log.error("train: stopped; deleting %s (the next attempt resumes from its checkpoint)", what)
        cluster.delete(kind, name)
        raise StageError(f"train: stopped while {what} ran; it was deleted") from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if condition(job) != kind.succeeded:
        raise StageError(f"train: {what} failed: {failure(job)} (its first node's log is above)")
    report({"kind": kind.kind, "name": name, "namespace": cluster.namespace, **shape(cfg)})
    return 0


def follow(cluster, kind: Kind, name: str, *, poll_s: float, grace_s: float) -> dict:
    """Wait for the job to finish, copying its first node's log to stderr meanwhile; the finished job."""
    reader = None
    while True:
        job = cluster.get(kind, name)
        if job is None:
            raise StageError(f"train: {kind.kind} {name} disappeared (deleted by someone else?)")
        if reader is None and (pod := cluster.first_node_pod(kind, name)) is not None:
            log.info("train: following %s (the first node: rank 0 and its node's ranks)", pod)
            reader = threading.Thread(target=_copy_log, args=(cluster, pod), daemon=True)
            reader.start()
        if condition(job) is not None:
            if reader is not None:
                reader.join(grace_s)  # the rest of the log
            log.info("train: %s %s: %s", kind.kind, name, condition(job))
            return job
        time.sleep(poll_s)


def _copy_log(cluster, pod: str) -> None:
    try:
        for line in cluster.log_lines(pod):
            print(line, file=sys.stderr, flush=True)
    except Exception as e:  # a broken log stream must not end the launch: the job's condition decides
        log.warning("train: the log of %s stopped: %s", pod, e)
