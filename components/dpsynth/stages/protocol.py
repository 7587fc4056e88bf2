"""What every stage shares: where a run's files live, its MLflow child run, and the stage protocol.

A stage ``run(ctx)`` (1) reads its upstream manifests and checks the files it uses against
them, (2) returns the existing manifest untouched — "skipped" — when it already ran with the
same config fingerprint and the same inputs and its outputs are intact (``--force`` runs it
again; a private stage run again spends its ε again), (3) otherwise writes its outputs
atomically, one file at a time, and then its manifest, last, inside one MLflow child run.
Downstream stages read only what a manifest lists, so a stage that dies halfway leaves
nothing anyone will use.

Layout under the run directory (local path or ``s3://``)::

    sensitive/partition/   shard-*.parquet, heldout.parquet, manifest.json
    sensitive/pretrain/   manifest.json (and per-shard pre-training models, for methods that have them)
    sensitive/train/       generator.pt, trace.json, result.json, samples.png, config.yaml, checkpoints/
    sensitive/audit/       audit.json, audit.md, manifest.json
    release/sample/        generator.pt, synthetic.parquet, samples.png, audit.json, audit.md, manifest.json
    release/evaluate/      report.json, manifest.json
    release/card/          the release card (written by ``pipeline finish``: :mod:`dpsynth.release.card`)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from dpsynth import egress, storage, tracking
from dpsynth.config import RunConfig, dump_config, without_launch
from dpsynth.data import ImageDataset
from dpsynth.data.versions import keyed_version
from dpsynth.errors import ConfigError, StageError
from dpsynth.stages import manifest

STAGES = ("partition", "pretrain", "train", "audit", "sample", "evaluate")
ZONE = {"partition": "sensitive", "pretrain": "sensitive", "train": "sensitive", "audit": "sensitive",
        "sample": "release", "evaluate": "release"}
TAG_STATUS = "dpsynth.stage_status"  # succeeded | failed | skipped
TAG_REUSED_RUN = "dpsynth.reused_run_id"  # a skipped stage: the run that made the outputs it reuses
# What every stage run logs (finish / reuse); each stage's MLFLOW_KEYS adds its own.
STAGE_RUN_KEYS = tracking.LoggedKeys(metrics={
    "epsilon_spent": "the stage's ε from its manifest: the accountant's bound of the recorded trace, or 0"})
# The pipeline's parent run (dpsynth.stage = "pipeline"): what ``dpsynth pipeline finish`` logs.
PARENT_RUN_KEYS = tracking.LoggedKeys(metrics={
    "epsilon_total": "the sum of the stages' recorded ε (accounted)",
    "ledger_epsilon_charged": "the ε the ledger charged this run (accounted)"})


@dataclass(frozen=True)
class Outcome:
    """What a stage did: ``status`` is "succeeded", "skipped" (outputs reused) or "failed"."""

    stage: str
    status: str
    manifest: dict | None
    manifest_uri: str
    mlflow_run_id: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class StageContext:
    """One pipeline run as a stage sees it: config, run directory, MLflow parent run."""

    cfg: RunConfig
    run_dir: str
    parent_run_id: str | None = None
    pipeline_run_id: str | None = None
    force: bool = False

    @classmethod
    def create(cls, cfg: RunConfig, *, run_dir: str | None = None, parent_run_id: str | None = None,
               pipeline_run_id: str | None = None, force: bool = False) -> StageContext:
        run_dir = run_dir or cfg.pipeline.run_dir
        if not run_dir:
            raise ConfigError("pipeline.run_dir: required by the pipeline stages; set it or pass --run-dir")
        run_dir = str(run_dir).rstrip("/")
        cfg = dataclasses.replace(resolve_method(cfg, run_dir), pipeline=dataclasses.replace(cfg.pipeline,
                                                                                             run_dir=run_dir))
        return cls(cfg=cfg, run_dir=run_dir, parent_run_id=parent_run_id, pipeline_run_id=pipeline_run_id, force=force)

    @property
    def zones(self) -> storage.Zones:
        return storage.Zones.from_root(self.run_dir)

    def stage_dir(self, stage: str) -> str:
        return storage.join(getattr(self.zones, ZONE[stage]), stage)

    def uri(self, stage: str, name: str) -> str:
        return storage.join(self.stage_dir(stage), name)

    def manifest_uri(self, stage: str) -> str:
        return self.uri(stage, manifest.NAME)

    @property
    def tracking_uri(self) -> str:
        """tracking.uri, else $MLFLOW_TRACKING_URI, else SQLite beside a local run directory."""
        if self.cfg.tracking.uri:
            return self.cfg.tracking.uri
        if os.environ.get("MLFLOW_TRACKING_URI"):
            return os.environ["MLFLOW_TRACKING_URI"]
        if storage.is_remote(self.run_dir):
            raise ConfigError("tracking.uri: required (or MLFLOW_TRACKING_URI) when pipeline.run_dir is remote")
        return tracking.default_tracking_uri(storage.local_path(self.run_dir))

    @property
    def experiment(self) -> str:
        return self.cfg.tracking.experiment or tracking.experiment_name(self.cfg.data.name)

    def entry(self, uri: str, *, role: str, **kwargs) -> dict:
        return manifest.entry(uri, role=role, zones=self.zones, **kwargs)

    def run_tags(self) -> dict[str, str]:
        return {tracking.TAG_PIPELINE_RUN_ID: self.pipeline_run_id or "", tracking.TAG_METHOD: self.cfg.train.method,
                tracking.TAG_DELTA: f"{self.cfg.privacy.delta:.3g}"}


def public_channels(cfg: RunConfig, run_dir: str | None) -> int:
    """The channels of the data's images (public schema): the partition manifest's ``image_shape`` once the
    partition stage has recorded it under ``run_dir``, else the source's (``data.uri``, read as the partition stage
    reads it)."""
    if run_dir:
        uri = storage.join(storage.Zones.from_root(str(run_dir).rstrip("/")).sensitive, "partition", manifest.NAME)
        if storage.exists(uri):
            shape = manifest.read(uri).get("details", {}).get("image_shape")
            if shape:
                return int(shape[2])
    from dpsynth.data import import_source, read_parquet

    uri = cfg.data.uri
    return (read_parquet(uri) if storage.is_remote(uri) else import_source(uri)).shape[2]


def resolve_method(cfg: RunConfig, run_dir: str | None = None) -> RunConfig:
    """``cfg`` with ``train.method: auto`` resolved from the data's public schema (:func:`public_channels`) by the
    method registry's rule (:func:`dpsynth.methods.registry.resolve`): before any stage reads the method, so every
    stage, its stored configuration and its MLflow parameters name the method that ran."""
    from dpsynth.config import AUTO
    from dpsynth.methods import registry

    if cfg.train.method != AUTO:
        return cfg
    return registry.resolve(cfg, channels=public_channels(cfg, run_dir))


VERSION_KEY = "dataset-version.key"  # under the run's sensitive zone: 32 random bytes


def dataset_version(ctx: StageContext, sha256: str) -> str:
    """What names a dataset (or a data file) outside the sensitive zone: HMAC-SHA256(key, its sha256), the
    key random and kept in the run's sensitive zone. A raw content hash would let anyone holding a
    candidate dataset test whether it is the one trained on (membership); the raw hashes stay in the
    sensitive manifests only. Every manifest's ``dataset_sha256`` field and the ``dpsynth.dataset_version``
    tag hold this version id (64 hex digits); ids are comparable within one run directory."""
    key = version_key(ctx)
    if key is None:
        key = os.urandom(32)
        write_version_key(ctx, key)
    return keyed_version(key, sha256)


def version_key(ctx: StageContext) -> bytes | None:
    """The run's dataset-version key (sensitive zone), None while it has none."""
    uri = storage.join(ctx.zones.sensitive, VERSION_KEY)
    return storage.read_bytes(uri) if storage.exists(uri) else None


def write_version_key(ctx: StageContext, key: bytes) -> None:
    storage.write_bytes(storage.join(ctx.zones.sensitive, VERSION_KEY), key)


def key_of(ctx: StageContext) -> Callable[[str], str]:
    """The egress gate's key for this run: a raw hash → its keyed version id (:func:`dataset_version`)."""
    return functools.partial(dataset_version, ctx)


def outside_view(ctx: StageContext, items: list[dict]) -> list[dict]:
    """Manifest entries as they may appear outside the sensitive zone (MLflow, release-zone manifests): through the
    egress gate (:func:`dpsynth.egress.let_out`).

    No raw hash of a file outside the release zone leaves the sensitive zone: every such entry (the source, the
    shards, the held-out and public records, the pre-trained discriminators — deterministic given train.seed and
    their shard, so a raw hash would let anyone who knows the other records test a record's membership by
    retraining —, the generator and trace before the audit, every manifest) is named by keyed version ids
    (:func:`dataset_version`; deterministic, so a re-run still matches) instead of its raw hashes. Nor does its
    row count (``rows`` is null): a per-shard count tells D from D ∪ {x} once the partition key is known; the counts that are
    public (n, the held-out count: docs/privacy.md) are in the partition manifest's details. Release-zone entries
    are shown as they are."""
    return egress.let_out({"items": items}, {"items": egress.Each(egress.ENTRY)}, key=key_of(ctx))["items"]


def key_for(ctx: StageContext, m: dict) -> Callable[[str], str] | None:
    """The gate's ``key`` for manifest ``m``: None for a release-zone manifest, whose entries were keyed when it was
    written (:func:`release_inputs`), this run's key otherwise."""
    return None if ZONE[m["stage"]] == "release" else key_of(ctx)


def outside_manifest(ctx: StageContext, m: dict) -> dict:
    """A stage's manifest as it may leave the sensitive zone (MLflow, the ``--json`` outcome an orchestrator logs):
    through the egress gate (:data:`dpsynth.egress.MANIFEST`)."""
    return egress.let_out(m, "manifest", key=key_for(ctx, m))


def outside_outcome(ctx: StageContext, outcome: dict) -> dict:
    """A stage command's ``--json`` outcome (``{"stage", "status", "manifest_uri", "mlflow_run_id", "manifest"}``,
    the launcher's also ``"trainjob"``) as the orchestrators keep it: through the egress gate
    (:data:`dpsynth.egress.OUTCOME`)."""
    return egress.let_out(outcome, "outcome", key=key_for(ctx, outcome["manifest"]))


def release_inputs(ctx: StageContext, stage: str, inputs: list[dict]) -> list[dict]:
    """``inputs`` as the manifest of ``stage`` records them: keyed (:func:`outside_view`) in the release zone."""
    return outside_view(ctx, inputs) if ZONE[stage] == "release" else inputs


def redacted(cfg: RunConfig) -> RunConfig:
    """``cfg`` with the partition key replaced by a digest: what stages log and write."""
    if cfg.partition.key is None:
        return cfg
    digest = hashlib.sha256(cfg.partition.key.encode()).hexdigest()[:16]
    return dataclasses.replace(cfg, partition=dataclasses.replace(cfg.partition, key=f"redacted:sha256:{digest}"))


def fingerprint(cfg: RunConfig, sections: tuple[str, ...]) -> str:
    """sha256 of the config sections a stage's outputs depend on (partition key redacted; not where the train
    stage's ranks run: ``config.LAUNCH_FIELDS``)."""
    d = without_launch(redacted(cfg).to_dict())
    return hashlib.sha256(json.dumps({s: d[s] for s in sections}, sort_keys=True).encode()).hexdigest()


def upstream(ctx: StageContext, stage: str, *, role: str = "manifest") -> tuple[dict, dict]:
    """The manifest of ``stage`` (which must have succeeded) and an input entry for it."""
    uri = ctx.manifest_uri(stage)
    m = manifest.read(uri)
    if m.get("status") != "succeeded":
        raise StageError(f"stage {stage}: its manifest {uri} records status {m.get('status')!r}; run it successfully first")
    return m, ctx.entry(uri, role=f"{stage}_{role}")


def concat(parts: list[ImageDataset]) -> ImageDataset:
    """The records of ``parts`` in order, as one dataset."""
    first = parts[0]
    splits = None
    if any(p.splits is not None for p in parts):
        splits = [s for p in parts for s in (p.splits or [None] * len(p))]
    return dataclasses.replace(
        first, record_ids=[r for p in parts for r in p.record_ids], labels=np.concatenate([p.labels for p in parts]),
        images=np.concatenate([p.images for p in parts]), splits=splits,
    )


# --- MLflow --------------------------------------------------------------------------------------


@contextlib.contextmanager
def child_run(ctx: StageContext, stage: str, *, run_id: str | None = None) -> Iterator[object | None]:
    """The stage's MLflow run, None when tracking is off: a new child of the pipeline's parent
    run, or (``run_id``) the run a trainer already opened, reopened to add the manifest."""
    if not ctx.cfg.tracking.enabled:
        yield None
        return
    import mlflow

    if run_id is not None:
        mlflow.set_tracking_uri(ctx.tracking_uri)
        with mlflow.start_run(run_id=run_id) as run:
            yield run
        return
    with tracking.start_run(tracking_uri=ctx.tracking_uri, experiment=ctx.experiment, stage=stage,
                            run_name=stage, parent_run_id=ctx.parent_run_id, tags=ctx.run_tags(),
                            artifact_location=ctx.cfg.tracking.artifact_location) as run:
        mlflow.log_text(dump_config(redacted(ctx.cfg)), "config.yaml")
        yield run


def _log_manifest(ctx: StageContext, m: dict, *, epsilon: float, status: str) -> None:
    view = outside_manifest(ctx, m)
    for item in view["inputs"]:
        if "rows" in item:  # datasets: lineage by URI and keyed version id (never the raw file hash)
            tracking.log_dataset_input(uri=item["uri"], digest=item["sha256"], name=item["role"], context=m["stage"])
    tracking.log_run(STAGE_RUN_KEYS, metrics={"epsilon_spent": epsilon}, tags={
        tracking.TAG_DATASET_VERSION: m["dataset_sha256"],  # the dataset version id (keyed), on every stage
        tracking.TAG_EPSILON_SPENT: f"{epsilon:.6g}",
        tracking.TAG_DELTA: f"{m['privacy']['delta']:.3g}",
        tracking.TAG_ACCOUNTANT: m["privacy"]["accountant"],
        TAG_STATUS: status,
    })
    tracking.log_json(view, "manifest.json", shape="manifest")  # the view is keyed: the gate passes it as it is


def finish(ctx: StageContext, stage: str, run, *, status: str = "succeeded", **fields) -> Outcome:
    """Write the stage's manifest (its commit record) and log it, its inputs and its ε to ``run``."""
    run_id = run.info.run_id if run is not None else None
    fields["inputs"] = release_inputs(ctx, stage, fields["inputs"])
    m = manifest.build(stage=stage, status=status, pipeline_run_id=ctx.pipeline_run_id,
                       parent_run_id=ctx.parent_run_id, mlflow_run_id=run_id, **fields)
    for item in m["outputs"]:
        if item.get("zone") != ZONE[stage]:
            raise StageError(f"stage {stage}: output {item['uri']} is outside the {ZONE[stage]} zone")
    if ZONE[stage] == "release":  # the release zone is outside: its manifest as the gate lets it out (entries keyed)
        m = egress.let_out(m, "manifest")
    uri = ctx.manifest_uri(stage)
    manifest.write(uri, m)
    if run is not None:
        _log_manifest(ctx, m, epsilon=m["privacy"]["epsilon"], status=status)
    return Outcome(stage=stage, status=status, manifest=m, manifest_uri=uri, mlflow_run_id=run_id)


def reuse(ctx: StageContext, stage: str, *, fingerprint: str, inputs: list[dict]) -> Outcome | None:
    """The stage's existing outcome, as "skipped", when its manifest matches (see the module
    docstring); its MLflow child run records the reuse and spends no ε."""
    uri = ctx.manifest_uri(stage)
    if ctx.force or not storage.exists(uri):
        return None
    old = manifest.read(uri)
    if not manifest.matches(old, fingerprint=fingerprint, inputs=release_inputs(ctx, stage, inputs)):
        return None
    with child_run(ctx, stage) as run:
        if run is not None:
            tracking.log_run(None, tags={TAG_REUSED_RUN: old.get("mlflow_run_id") or ""})
            _log_manifest(ctx, old, epsilon=0.0, status="skipped")
    return Outcome(stage=stage, status="skipped", manifest=old, manifest_uri=uri,
                   mlflow_run_id=run.info.run_id if run is not None else None)


def inconclusive(check: dict) -> bool:
    """Whether an audit check is inconclusive: it neither passes nor fails (no audit of its size could have failed)."""
    return isinstance(check, dict) and check.get("passed", False) is None and check.get("verdict") == "inconclusive"
