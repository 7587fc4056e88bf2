"""``dpsynth partition``: validate the dataset, hold out records for evaluation, split the rest into K shards.

A record's place depends on its ``record_id`` and the partition key alone:
``h = HMAC-SHA256(partition.key, record_id)``; the first 8 bytes of ``h``, as a fraction of
2⁶⁴, below ``data.heldout_fraction`` hold the record out; otherwise the next 8 bytes mod K
name its shard. The assignment is data-independent, so neighbouring datasets differ in one
shard only, and stable: adding a record changes only its own shard's file, and raising the
held-out fraction only moves training records into the held-out set, never back.

Held-out records are never trained on; ``evaluate`` tests on them. Public records (for methods
that use public data: dp-GAN's pre-training and clipping bounds) are declared by
``data.public_fraction``, a keyed-hash band right above the held-out one (``h``'s fraction in
[heldout_fraction, heldout_fraction + public_fraction)), or by ``data.public_split``, the records
of a named split; they are written to ``public.parquet`` (role "public") and are in no training
shard. ``data.public_source`` takes them from a separate source instead (``sklearn:digits``, or any
source ``dpsynth data import`` reads; :mod:`dpsynth.data.public`), which is the honest choice: a
``public_fraction`` slice of the sensitive data is refused unless the config acknowledges that those
records are unprotected. Every output is in the sensitive zone. ε consumed: 0 (no release; the assignment does not look at the data).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dpsynth import storage, tracking
from dpsynth.data import ImageDataset, import_source, read_parquet, validate, versions, write_parquet
from dpsynth.data.assignment import HELDOUT, PUBLIC, assign, partition_key, public_mask, with_platform_key  # noqa: F401
from dpsynth.data.validation import with_public_classes
from dpsynth.errors import DatasetError
from dpsynth.stages import protocol, manifest

STAGE = "partition"
SECTIONS = ("data", "partition")
_COUNT = "a record count; n is public in this design (the audit checks δ < 1/n against it)"
MLFLOW_KEYS = protocol.STAGE_RUN_KEYS | tracking.LoggedKeys(metrics={
    "records": _COUNT, "training_records": _COUNT, "heldout_records": _COUNT, "public_records": _COUNT})


def shard_name(k: int, num_shards: int) -> str:
    return f"shard-{k:05d}-of-{num_shards:05d}"


def load_source(cfg) -> ImageDataset:
    """``data.uri`` (a local source of any supported kind, or canonical Parquet at any URI),
    restricted to ``data.train_split`` when set, without the ``data.public_split`` records."""
    return load_sources(cfg)[0]


def load_sources(cfg) -> tuple[ImageDataset, ImageDataset | None]:
    """The source as :func:`load_source` reads it, and the ``data.public_split`` records (None when unset)."""
    uri = cfg.data.uri
    full = read_parquet(uri) if storage.is_remote(uri) else import_source(uri)
    full = with_public_classes(full, cfg.data.num_classes)  # the public label set, never max(label) + 1
    ds, public = full, None
    if cfg.data.train_split is not None:
        if full.splits is None:
            raise DatasetError(f"data.train_split: {uri} has no split column")
        ds = full.subset([s == cfg.data.train_split for s in full.splits])
    if cfg.data.public_split is not None:
        if full.splits is None:
            raise DatasetError(f"data.public_split: {uri} has no split column")
        public = full.subset(public_mask(full, cfg))
        if len(public) == 0:
            raise DatasetError(f"data.public_split: {uri} has no records in split {cfg.data.public_split!r}")
        public = dataclasses.replace(public, source=f"{full.source} | dpsynth partition: public")
        validate(public, num_classes=cfg.data.num_classes)
        ds = ds.subset(~public_mask(ds, cfg))
    validate(ds, num_classes=cfg.data.num_classes)
    return ds, public


def split(ds: ImageDataset, cfg) -> dict[str, ImageDataset]:
    """``{"shard-…": …, "heldout": …, "public": …}``, each sorted by record_id (so files are reproducible)."""
    k = cfg.partition.num_shards
    public_fraction = cfg.data.public_fraction if cfg.data.public_split is None else 0.0
    where = assign(ds.record_ids, key=partition_key(cfg), heldout_fraction=cfg.data.heldout_fraction, num_shards=k,
                   public_fraction=public_fraction)
    order = np.argsort(np.array(ds.record_ids, dtype=object), kind="stable")
    parts = {}
    for name, label in [(shard_name(i, k), i) for i in range(k)] + [("heldout", HELDOUT), ("public", PUBLIC)]:
        index = order[where[order] == label]
        if (label == HELDOUT and cfg.data.heldout_fraction == 0) or (label == PUBLIC and public_fraction == 0):
            continue
        if index.size == 0:
            field = {HELDOUT: "data.heldout_fraction", PUBLIC: "data.public_fraction"}.get(label, "partition.num_shards")
            raise DatasetError(f"{field}: {name} would be empty ({len(ds)} records, {k} shards, "
                               f"held-out fraction {cfg.data.heldout_fraction})")
        parts[name] = dataclasses.replace(ds.subset(index), source=f"{ds.source} | dpsynth partition: {name}")
    return parts


def _window(ctx: protocol.StageContext, ds: ImageDataset) -> tuple[ImageDataset, list[int] | None]:
    """The records of the privacy blocks this run reads (:func:`dpsynth.ledger.charging.window`; all, None: the
    data keeps no blocks)."""
    from dpsynth.data import blocks
    from dpsynth.ledger import charging

    if blocks.arrivals(ctx.cfg.data.uri) is None:
        return ds, None
    return charging.window(ctx.cfg, charging.run_ledger(ctx), ds)


def run(ctx: protocol.StageContext) -> protocol.Outcome:
    cfg = with_platform_key(ctx.cfg)  # a cluster's key comes from its Secret, never from a config or a form
    ds, public_split = load_sources(cfg)
    content = ds.content_sha256()
    versions.check(cfg.data.uri, content)  # a versioned import's file: still the version its name says
    is_file = storage.is_remote(cfg.data.uri) or storage.local_path(cfg.data.uri).is_file()
    source = ctx.entry(cfg.data.uri, role="source", rows=len(ds), sha256=None if is_file else content,
                       content_sha256=content)
    fp = protocol.fingerprint(cfg, SECTIONS)
    if (reused := protocol.reuse(ctx, STAGE, fingerprint=fp, inputs=[source])) is not None:
        return reused
    ds, blocks = _window(ctx, ds)  # the blocks this run reads (#54), before anything is trained on
    parts = split(ds, cfg)  # every check before the first write
    if cfg.data.public_source is not None:  # a separate source: never a record of the sensitive dataset
        from dpsynth.data.public import load_public_source

        public_split = load_public_source(cfg.data.public_source, shape=ds.shape)
        shared = set(public_split.record_ids) & set(ds.record_ids)
        if shared:
            raise DatasetError("data.public_source: shares record ids with data.uri (the overlap check; neither "
                               "the ids nor their count are shown)")
    if public_split is not None:
        parts["public"] = public_split.subset(np.argsort(np.array(public_split.record_ids, dtype=object), kind="stable"))
    with protocol.child_run(ctx, STAGE) as run:
        outputs = []
        for name, part in parts.items():
            uri = ctx.uri(STAGE, f"{name}.parquet")
            write_parquet(part, uri)
            role = name if name in ("heldout", "public") else "shard"
            outputs.append(ctx.entry(uri, role=role, rows=len(part), content_sha256=part.content_sha256()))
        rows = {o["role"]: 0 for o in outputs}
        for o in outputs:
            rows[o["role"]] += o["rows"]
        details = {"num_shards": cfg.partition.num_shards, "heldout_fraction": cfg.data.heldout_fraction,
                   "records": len(ds), "training_records": rows["shard"], "heldout_records": rows.get("heldout", 0),
                   "public_records": rows.get("public", 0), "public_fraction": cfg.data.public_fraction,
                   "public_split": cfg.data.public_split, "public_source": cfg.data.public_source,
                   "num_classes": ds.num_classes, "image_shape": list(ds.shape),
                   "key": protocol.redacted(cfg).partition.key, "assignment": "HMAC-SHA256(key, record_id)",
                   **({} if blocks is None else {"blocks": blocks})}
        if run is not None:
            tracking.log_run(MLFLOW_KEYS, metrics={"records": len(ds), "training_records": rows["shard"],
                                                   "heldout_records": rows.get("heldout", 0),
                                                   "public_records": rows.get("public", 0)})
        return protocol.finish(
            ctx, STAGE, run, fingerprint=fp, dataset_sha256=protocol.dataset_version(ctx, content), inputs=[source], outputs=outputs, details=details,
            privacy=manifest.no_privacy(delta=cfg.privacy.delta, note="no release: the assignment is a keyed hash "
                                        "of record ids and never looks at the data"),
        )
