"""``dpsynth partition``: validate the dataset, hold out records for evaluation, split the rest into K shards.

A record's place depends on its ``record_id`` and the partition key alone:
``h = HMAC-SHA256(partition.key, record_id)``; the first 8 bytes of ``h``, as a fraction of
2⁶⁴, below ``data.heldout_fraction`` hold the record out; otherwise the next 8 bytes mod K
name its shard. The assignment is data-independent, so neighbouring datasets differ in one
shard only, and stable: adding a record changes only its own shard's file, and raising the
held-out fraction only moves training records into the held-out set, never back.

Held-out records are never trained on; ``evaluate`` tests on them. Every output is in the
sensitive zone. ε consumed: 0 (no release; the assignment does not look at the data).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac

import numpy as np

from dpsynth import storage
from dpsynth.data import ImageDataset, import_source, read_parquet, validate, write_parquet
from dpsynth.errors import DatasetError
from dpsynth.stages import common, manifest

STAGE = "partition"
SECTIONS = ("data", "partition")
HELDOUT = -1


def assign(record_ids: list[str], *, key: str, heldout_fraction: float, num_shards: int) -> np.ndarray:
    """Each record's shard in ``[0, num_shards)``, or ``HELDOUT`` (-1).

    >>> assign(["a", "b", "c"], key="k", heldout_fraction=0.0, num_shards=1).tolist()
    [0, 0, 0]
    """
    out = np.empty(len(record_ids), np.int64)
    secret = key.encode()
    for i, rid in enumerate(record_ids):
        h = hmac.new(secret, rid.encode(), hashlib.sha256).digest()
        u = int.from_bytes(h[:8], "big") / 2**64
        out[i] = HELDOUT if u < heldout_fraction else int.from_bytes(h[8:16], "big") % num_shards
    return out


def shard_name(k: int, num_shards: int) -> str:
    return f"shard-{k:05d}-of-{num_shards:05d}"


def load_source(cfg) -> ImageDataset:
    """``data.uri`` (a local source of any supported kind, or canonical Parquet at any URI),
    restricted to ``data.train_split`` when set."""
    uri = cfg.data.uri
    ds = read_parquet(uri) if storage.is_remote(uri) else import_source(uri)
    if cfg.data.train_split is not None:
        if ds.splits is None:
            raise DatasetError(f"data.train_split: {uri} has no split column")
        ds = ds.subset([s == cfg.data.train_split for s in ds.splits])
    validate(ds, num_classes=cfg.data.num_classes)
    return ds


def split(ds: ImageDataset, cfg) -> dict[str, ImageDataset]:
    """``{"shard-…": …, "heldout": …}``, each sorted by record_id (so files are reproducible)."""
    k = cfg.partition.num_shards
    where = assign(ds.record_ids, key=cfg.partition.key, heldout_fraction=cfg.data.heldout_fraction, num_shards=k)
    order = np.argsort(np.array(ds.record_ids, dtype=object), kind="stable")
    parts = {}
    for name, label in [(shard_name(i, k), i) for i in range(k)] + [("heldout", HELDOUT)]:
        index = order[where[order] == label]
        if label == HELDOUT and cfg.data.heldout_fraction == 0:
            continue
        if index.size == 0:
            field = "data.heldout_fraction" if label == HELDOUT else "partition.num_shards"
            raise DatasetError(f"{field}: {name} would be empty ({len(ds)} records, {k} shards, "
                               f"held-out fraction {cfg.data.heldout_fraction})")
        parts[name] = dataclasses.replace(ds.subset(index), source=f"{ds.source} | dpsynth partition: {name}")
    return parts


def run(ctx: common.StageContext) -> common.Outcome:
    cfg = ctx.cfg
    ds = load_source(cfg)
    content = ds.content_sha256()
    is_file = storage.is_remote(cfg.data.uri) or storage.local_path(cfg.data.uri).is_file()
    source = ctx.entry(cfg.data.uri, role="source", rows=len(ds), sha256=None if is_file else content,
                       content_sha256=content)
    fp = common.fingerprint(cfg, SECTIONS)
    if (reused := common.reuse(ctx, STAGE, fingerprint=fp, inputs=[source])) is not None:
        return reused
    parts = split(ds, cfg)  # every check before the first write
    with common.child_run(ctx, STAGE) as run:
        outputs = []
        for name, part in parts.items():
            uri = ctx.uri(STAGE, f"{name}.parquet")
            write_parquet(part, uri)
            role = "heldout" if name == "heldout" else "shard"
            outputs.append(ctx.entry(uri, role=role, rows=len(part), content_sha256=part.content_sha256()))
        rows = {o["role"]: 0 for o in outputs}
        for o in outputs:
            rows[o["role"]] += o["rows"]
        details = {"num_shards": cfg.partition.num_shards, "heldout_fraction": cfg.data.heldout_fraction,
                   "records": len(ds), "training_records": rows["shard"], "heldout_records": rows.get("heldout", 0),
                   "num_classes": ds.num_classes, "image_shape": list(ds.shape),
                   "key": common.redacted(cfg).partition.key, "assignment": "HMAC-SHA256(key, record_id)"}
        if run is not None:
            import mlflow

            mlflow.log_metrics({"records": len(ds), "training_records": rows["shard"],
                                "heldout_records": rows.get("heldout", 0)})
        return common.finish(
            ctx, STAGE, run, fingerprint=fp, dataset_sha256=content, inputs=[source], outputs=outputs, details=details,
            privacy=manifest.no_privacy(delta=cfg.privacy.delta, note="no release: the assignment is a keyed hash "
                                        "of record ids and never looks at the data"),
        )
