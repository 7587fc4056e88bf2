"""MLflow conventions in one place: where runs go, how they are named and tagged, what is logged.

One experiment per dataset; a parent run per pipeline run; a child run per stage.
Tags (``dpsynth.*``) are what the auditor's views and the ledger read, so every stage sets
them through this module. Nothing data-dependent per step is ever logged (no actual Poisson
batch sizes, shard indices, per-example norms or losses on private data): each stage declares
what it logs (:class:`LoggedKeys`) and the audit checks every run against that allow-list.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import subprocess
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

TAG_STAGE = "dpsynth.stage"
# The dataset's version id: HMAC-SHA256 under a key in the run's sensitive zone, never a raw content hash
# (stages.common.dataset_version). Named for what it holds; it was "dpsynth.dataset_sha256" before, and
# TAG_DATASET_SHA256 stays as an alias of the constant for code that imports it.
TAG_DATASET_VERSION = "dpsynth.dataset_version"
TAG_DATASET_SHA256 = TAG_DATASET_VERSION  # deprecated name of the constant (same tag)
TAG_EPSILON_SPENT = "dpsynth.epsilon_spent"
TAG_DELTA = "dpsynth.delta"
TAG_ACCOUNTANT = "dpsynth.accountant"
TAG_AUDIT = "dpsynth.audit"
TAG_EPSILON_LOWER = "dpsynth.epsilon_lower"  # the empirical audit's ε_lower (audit/empirical.py)
TAG_EMPIRICAL_AUDIT = "dpsynth.empirical_audit"  # its m, confidence, mode and attack
TAG_EMPIRICAL_VERDICT = "dpsynth.empirical_verdict"  # passed | failed | inconclusive (never passed when inconclusive)
TAG_PIPELINE_RUN_ID = "dpsynth.pipeline_run_id"
TAG_CODE_VERSION = "dpsynth.code_version"
TAG_METHOD = "dpsynth.method"
TAG_POPULATION = "dpsynth.population_id"
TAG_LEDGER_RESERVATION = "dpsynth.ledger_reservation_id"
TAG_IMAGE = "dpsynth.image"
TAG_GIT_SHA = "dpsynth.git_sha"
GIT_SHA_ENV = "DPSYNTH_GIT_SHA"  # the commit an image was built from (images/stage-*.Dockerfile set it)
# Model Registry: each population/method's released generators, one version per passed audit
TAG_TRACE_SHA256 = "dpsynth.trace_sha256"
TAG_GENERATOR_SHA256 = "dpsynth.generator_sha256"
TAG_PARENT_RUN_ID = "dpsynth.parent_run_id"
TAG_AUDIT_RUN_ID = "dpsynth.audit_run_id"
TAG_TRAIN_RUN_ID = "dpsynth.train_run_id"
RELEASED_ALIAS = "released"  # the newest audited release of a registered model: models:/NAME@released

# MLflow 3's experiment type: its UI opens a "custom_model_development" experiment on the training
# runs (not the GenAI traces view). Set on the experiments dpsynth creates, or finds without one.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"

# What the run-context provider of mlflow_plugins (dpsynth_mlflow) reads: the pipeline sets these
# in the environment of each stage, so every MLflow run a stage starts carries its lineage tags.
ENV_CONTEXT = {
    TAG_PIPELINE_RUN_ID: "DPSYNTH_PIPELINE_RUN_ID",
    TAG_STAGE: "DPSYNTH_STAGE",
    TAG_DATASET_VERSION: "DPSYNTH_DATASET_VERSION",
    TAG_POPULATION: "DPSYNTH_POPULATION_ID",
    TAG_IMAGE: "DPSYNTH_IMAGE",  # the container image a stage runs in (set by the pod spec)
}



@dataclass(frozen=True)
class LoggedKeys:
    """The metric and parameter names one kind of MLflow run may hold, each with the reason it is
    data-independent or accounted: a stage's allow-list (DESIGN.md, "Nothing before the gate").

    A name ending in ``*`` declares a prefix. Stages declare theirs as ``MLFLOW_KEYS`` (trainers as a
    class attribute); the audit fails a pipeline whose runs hold a key their stage did not declare.

    >>> keys = LoggedKeys(metrics={"epsilon": "accounted", "curve.*": "post-processing"})
    >>> keys.undeclared(metrics=["epsilon", "curve.fid", "actual_batch_size"], params=["train.seed"])
    ['metric actual_batch_size', 'param train.seed']
    """

    metrics: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, str] = field(default_factory=dict)

    def __or__(self, other: LoggedKeys) -> LoggedKeys:
        return LoggedKeys({**self.metrics, **other.metrics}, {**self.params, **other.params})

    def undeclared(self, *, metrics=(), params=()) -> list[str]:
        """The names in ``metrics`` / ``params`` this allow-list does not declare ("metric NAME", "param NAME")."""
        return sorted([f"metric {k}" for k in set(metrics) if not _declared(k, self.metrics)]
                      + [f"param {k}" for k in set(params) if not _declared(k, self.params)])


def _declared(name: str, declared: Mapping[str, str]) -> bool:
    from dpsynth import egress

    return egress.declared(name, declared)


def log_run(keys: LoggedKeys | None, *, metrics: Mapping | None = None, params: Mapping | None = None,
            tags: Mapping | None = None, step: int | None = None, run_id: str | None = None,
            tracking_uri: str | None = None) -> None:
    """The one way a tag, metric or parameter reaches MLflow: through the egress gate
    (:func:`dpsynth.egress.let_out_run`: metrics and parameters ``keys`` — the stage's ``MLFLOW_KEYS`` — declares,
    tags :data:`dpsynth.egress.TAGS` names; anything else is dropped and its name logged). On the active run, or
    on ``run_id`` (through a client of ``tracking_uri``)."""
    import mlflow

    from dpsynth import egress

    metrics, params, tags = egress.let_out_run(keys, metrics=metrics, params=params, tags=tags)
    if run_id is None:
        if metrics:
            mlflow.log_metrics(metrics, step=step)
        if params:
            mlflow.log_params(params)
        if tags:
            mlflow.set_tags(tags)
        return
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.utils.time import get_current_time_millis

    now = get_current_time_millis()
    mlflow.MlflowClient(tracking_uri).log_batch(
        run_id, metrics=[Metric(k, float(v), now, step or 0) for k, v in metrics.items()],
        params=[Param(k, str(v)) for k, v in params.items()], tags=[RunTag(k, str(v)) for k, v in tags.items()])


def tag_version(name: str, version: str, *, tags: Mapping, tracking_uri: str) -> None:
    """Tag a registered model version, through the egress gate (:data:`dpsynth.egress.TAGS`)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    for tag, value in run_tags(tags).items():
        client.set_model_version_tag(name, version, tag, value)


def run_tags(tags: Mapping | None) -> dict[str, str]:
    """The tags a run or a registered version starts with, through the egress gate (:data:`dpsynth.egress.TAGS`)."""
    from dpsynth import egress

    return egress.let_out_run(None, tags=tags)[2]


def config_params() -> LoggedKeys:
    """Every setting of the run config, as the trainers log it (``section.field``): chosen before
    any data is read (the partition key is logged redacted)."""
    from dpsynth.config import RunConfig

    def flat(d: dict, prefix: str = "") -> list[str]:
        return [k for key, v in d.items()
                for k in (flat(v, f"{prefix}{key}.") if isinstance(v, dict) else [f"{prefix}{key}"])]

    return LoggedKeys(params={k: "configuration, fixed before any data is read" for k in flat(RunConfig().to_dict())})


def default_tracking_uri(output_dir: str | os.PathLike) -> str:
    """$MLFLOW_TRACKING_URI, else a SQLite store beside the run's output folder."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    db = Path(output_dir).resolve().parent / "mlflow.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{db}"


@functools.lru_cache(maxsize=1)
def _checkout_head() -> str | None:
    """``git rev-parse HEAD`` of the checkout this package runs from (None outside one, or without git)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = done.stdout.strip()
    return sha if done.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", sha) else None


def git_sha() -> str | None:
    """The commit of the code that runs: ``$DPSYNTH_GIT_SHA`` (an image's build sets it; its default
    ``unknown`` counts as unset), else the checkout's ``HEAD``, else None."""
    env = os.environ.get(GIT_SHA_ENV, "").strip().lower()
    if re.fullmatch(r"[0-9a-f]{7,40}", env):
        return env
    return _checkout_head()


def code_version() -> str:
    """``VERSION+SHA12`` (the package version and the first 12 hex digits of :func:`git_sha`), or ``VERSION``
    when the commit is unknown."""
    from dpsynth import __version__

    sha = git_sha()
    return f"{__version__}+{sha[:12]}" if sha else __version__


def lineage() -> dict[str, str | None]:
    """What code ran: ``code_version``, ``git_sha`` and ``image`` (``$DPSYNTH_IMAGE``, the container image the
    pod spec names; None outside a container). Every stage manifest, run, release card and registry version
    records it."""
    return {"code_version": code_version(), "git_sha": git_sha(),
            "image": os.environ.get(ENV_CONTEXT[TAG_IMAGE], "").strip() or None}


def lineage_tags() -> dict[str, str]:
    """:func:`lineage` as MLflow tags (those known)."""
    found = lineage()
    tags = {TAG_CODE_VERSION: found["code_version"], TAG_GIT_SHA: found["git_sha"], TAG_IMAGE: found["image"]}
    return {tag: value for tag, value in tags.items() if value}


def experiment_name(dataset_name: str) -> str:
    return f"dpsynth/{dataset_name}"


def _ensure_experiment(mlflow, name: str, tracking_uri: str, artifact_location: str | None = None) -> str:
    """The experiment's id, creating it when missing: its artifacts under ``artifact_location``
    (e.g. ``s3://bucket/mlflow``; the S3 endpoint from ``MLFLOW_S3_ENDPOINT_URL``), else beside a
    SQLite store, else where the tracking server puts them. An existing experiment keeps its own."""
    exp = mlflow.get_experiment_by_name(name)
    if exp is not None:
        if EXPERIMENT_KIND_TAG not in exp.tags:  # made before dpsynth tagged its experiments
            client = mlflow.MlflowClient(tracking_uri)
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return exp.experiment_id
    location = artifact_location
    if location is None and tracking_uri.startswith("sqlite:///"):
        location = (Path(tracking_uri[len("sqlite:///"):]).parent / "mlartifacts").resolve().as_uri()
    return mlflow.create_experiment(name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})


@contextlib.contextmanager
def start_run(
    *,
    tracking_uri: str,
    experiment: str,
    stage: str,
    run_name: str | None = None,
    parent_run_id: str | None = None,
    tags: dict[str, str] | None = None,
    artifact_location: str | None = None,
) -> Iterator[object]:
    """Start an MLflow run tagged with the stage and what code ran (:func:`lineage_tags`); with ``parent_run_id``,
    nested under that run (MLflow sets the ``mlflow.parentRunId`` tag, after checking that the parent exists)."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    experiment_id = _ensure_experiment(mlflow, experiment, tracking_uri, artifact_location)
    all_tags = run_tags({TAG_STAGE: stage, **lineage_tags(), **(tags or {})})
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name or stage, tags=all_tags,
                          parent_run_id=parent_run_id or None) as run:
        yield run


def create_parent_run(*, tracking_uri: str, experiment: str, run_name: str, tags: dict[str, str],
                      artifact_location: str | None = None) -> str:
    """Open a pipeline's parent run and leave it RUNNING (stages in other processes nest under it
    by id; the pipeline closes it); returns its id."""
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(tracking_uri)
    experiment_id = _ensure_experiment(mlflow, experiment, tracking_uri, artifact_location)
    all_tags = run_tags({TAG_STAGE: "pipeline", **lineage_tags(), **tags})
    return MlflowClient(tracking_uri).create_run(experiment_id, run_name=run_name, tags=all_tags).info.run_id


def dataset_source(uri: str):
    """MLflow's dataset source for a storage URI: "local" for a path or file://, "s3" for s3://."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.filesystem_dataset_source import FileSystemDatasetSource

    uri = uri if "://" in uri else Path(uri).resolve().as_uri()
    with warnings.catch_warnings():  # "" and "file" register the same local source class: harmless
        warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted in multiple ways")
        return resolve_dataset_source(uri, candidate_sources=[FileSystemDatasetSource])


def log_dataset_input(*, uri: str, digest: str, name: str, context: str = "training") -> None:
    """Record a dataset a run read, by URI and ``digest``: a keyed version id
    (``dpsynth.stages.protocol.dataset_version``), never a raw content hash (lineage for auditors)."""
    import mlflow
    from mlflow.data.meta_dataset import MetaDataset

    mlflow.log_input(MetaDataset(source=dataset_source(uri), name=name, digest=digest[:32]), context=context)


def log_privacy(*, epsilon: float, delta: float, accountant: str, step: int | None = None) -> None:
    log_run(LoggedKeys(metrics={"epsilon": "accounted"}), metrics={"epsilon": epsilon}, step=step,
            tags={TAG_EPSILON_SPENT: f"{epsilon:.6g}", TAG_DELTA: f"{delta:.3g}", TAG_ACCOUNTANT: accountant})


def log_json(obj: dict, artifact_file: str, *, shape: str, key=None) -> None:
    """Log ``obj`` as a JSON artifact, through the egress gate (:func:`dpsynth.egress.let_out` with ``shape``, one
    of :data:`dpsynth.egress.SHAPES`; ``key``: the run's keyer of sensitive-zone hashes)."""
    import mlflow

    from dpsynth import egress

    mlflow.log_text(json.dumps(egress.let_out(obj, shape, key=key), indent=2, sort_keys=True), artifact_file)


def log_png(image, artifact_file: str) -> None:
    """Log a PIL image as a PNG artifact."""
    import mlflow

    buf = io.BytesIO()
    image.save(buf, format="PNG")
    with _temp_file(buf.getvalue(), Path(artifact_file).name) as path:
        mlflow.log_artifact(str(path), artifact_path=str(Path(artifact_file).parent) if "/" in artifact_file else None)


def log_generator(generator, *, name: str = "generator"):
    """Log the audited generator as an MLflow PyTorch model in the ``pt2`` format: ``torch.export``'s
    graph and weights, no pickle, so loading it runs no code. Inputs: ``z`` (N × latent_dim float32)
    and ``y`` (N int64 class labels); output: N images in [-1, 1]. Returns MLflow's ``ModelInfo``
    (its ``model_id`` is what :func:`register_release` registers)."""
    import mlflow
    import numpy as np
    import torch
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    generator = generator.eval()
    z = torch.randn(4, generator.latent_dim)
    y = torch.arange(4) % generator.num_classes
    with torch.no_grad():
        image_shape = tuple(generator(z, y).shape[1:])
    signature = ModelSignature(
        inputs=Schema([TensorSpec(np.dtype(np.float32), (-1, generator.latent_dim), "z"),
                       TensorSpec(np.dtype(np.int64), (-1,), "y")]),
        outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, *image_shape), "image")]))
    return mlflow.pytorch.log_model(
        generator, name=name, serialization_format="pt2", input_example=(z.numpy(), y.numpy()), signature=signature,
        pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
    )


def log_generator_file(data: bytes, *, name: str = "generator"):
    """Log a release that is no network ``torch.export`` takes (Private Evolution's figures and their weights:
    :class:`dpsynth.prior.release.FigurePainter`) as an MLflow logged model holding its ``dpsynth.generator/1``
    file, ``generator.pt`` (tensors only, read back by ``torch.load(weights_only=True)``: no pickle of code), under
    the active run. Returns the ``LoggedModel`` (its ``model_id`` is what :func:`register_release` registers)."""
    import mlflow
    from mlflow import MlflowClient

    run = mlflow.active_run()
    model = mlflow.initialize_logged_model(name=name, source_run_id=run.info.run_id if run else None,
                                           model_type="dpsynth.generator/1")
    with _temp_file(data, "generator.pt") as path:
        MlflowClient().log_model_artifact(model.model_id, str(path))
    return mlflow.finalize_logged_model(model.model_id, "READY")


def registered_model_name(population_id: str, method: str) -> str:
    """The registered model of a population's released generators by one method: ``dpsynth-<population>-<method>``
    (characters outside ``A-Za-z0-9._-`` become ``-``; the population id itself is a tag of the model)."""
    return f"dpsynth-{re.sub(r'[^A-Za-z0-9._-]+', '-', population_id).strip('-') or 'population'}-{method}"


def register_release(*, tracking_uri: str, model_id: str, population_id: str, method: str,
                     tags: Mapping[str, str]):
    """Register the logged model ``model_id`` (an audited generator: :func:`log_generator`'s
    ``ModelInfo.model_id``) as a new version of the population's registered model for ``method``, with
    ``tags`` on the version (its run is the logged model's: the sample stage's run), and move the
    ``released`` alias to it.

    Only the sample stage calls this, after its release gate (a passed audit of this very generator and
    trace). Needs a tracking store with the Model Registry: a database (``sqlite:///``, PostgreSQL) or a
    tracking server; a ``DpsynthError`` naming ``tracking.uri`` otherwise. Returns the ``ModelVersion``."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from dpsynth.errors import DpsynthError

    name = registered_model_name(population_id, method)
    try:
        client = MlflowClient(tracking_uri)
        try:
            model = client.get_registered_model(name)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            model = client.create_registered_model(
                name, tags={TAG_POPULATION: population_id, TAG_METHOD: method},
                description=f"Generators trained by dpsynth ({method}) on population {population_id!r} and "
                            f"released after a passed privacy audit; @{RELEASED_ALIAS} is the newest release.")
        owner = model.tags.get(TAG_POPULATION)
        if owner is not None and owner != population_id:
            raise DpsynthError(f"ledger.population_id: registered model {name!r} holds population {owner!r}'s "
                               f"releases, not {population_id!r}; choose a population id that differs in its "
                               "letters, digits or ._- characters")
        logged = client.get_logged_model(model_id)  # as mlflow.register_model("models:/<id>") does, by this client
        version = client.create_model_version(name, source=f"models:/{model_id}", run_id=logged.source_run_id,
                                              tags=run_tags(tags), model_id=model_id)
        client.set_registered_model_alias(name, RELEASED_ALIAS, version.version)
    except MlflowException as exc:
        raise DpsynthError(f"tracking.uri: cannot register the released generator in the MLflow Model Registry at "
                           f"{tracking_uri} ({exc.message}); the registry needs a database-backed store "
                           "(sqlite:///…, postgresql+psycopg2://…) or a tracking server (http://…)") from exc
    return version


@contextlib.contextmanager
def _temp_file(data: bytes, filename: str) -> Iterator[Path]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / filename
        path.write_bytes(data)
        yield path


def empirical_tags(result: dict) -> dict[str, str]:
    """The MLflow tags of an empirical audit's result (:mod:`dpsynth.audit.empirical`): on the audit run, the
    pipeline's parent run and the release."""
    each = ", ".join(f"{p['name']} {p['epsilon_lower']:.4g} ({p['verdict']})" for p in result["components"])
    return {TAG_EPSILON_LOWER: f"{result['epsilon_lower']:.4g}",
            TAG_EMPIRICAL_VERDICT: result["verdict"],
            TAG_EMPIRICAL_AUDIT: (f"m={result['canaries']}, {result['confidence']:.0%} confidence, "
                                  f"{result['mode']}: {result['verdict']}; {each}")}
