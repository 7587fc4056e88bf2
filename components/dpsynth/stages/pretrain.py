"""``dpsynth pretrain [--shard K]``: non-private pre-training, for the methods that pre-train.

* GS-WGAN and DPAC pre-train one discriminator per shard, on that shard only. Each shard is one
  task — ``dpsynth pretrain --shard K`` — which Airflow maps and KFP loops over; it writes
  ``sensitive/pretrain/shard-K/discriminator.pt`` and a small ``shard.json`` record (config
  fingerprint, input shard sha256, output sha256), then logs nothing to MLflow (K can be 1000).
  The fan-in, ``dpsynth pretrain`` without ``--shard``, runs every shard not yet done (in
  ``pretrain.workers`` local processes), then writes the stage manifest listing one
  "discriminator" output per shard (``"shard": K``) and logs the stage's one MLflow run.
* dp-GAN (Zhang) pre-trains G and D on the partition's *public* records (output "pretrain").
* DPGAN does not pre-training: the stage records that in its manifest and does nothing else.

Every output stays in the sensitive zone, which is the only reason the stage consumes ε = 0.
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import tempfile
import time
from pathlib import Path

from dpsynth import egress, storage, threads as dpsynth_threads, tracking
from dpsynth.data import read_parquet
from dpsynth.errors import StageError
from dpsynth.methods import registry
from dpsynth.stages import protocol, manifest

STAGE = "pretrain"
SECTIONS = ("data", "partition", "train")
SHARD_FORMAT = "dpsynth.pretrain-shard/1"
_TIME = ("wall-clock of a fixed number of iterations at fixed batch sizes: depends on the machine and the "
         "shard sizes (record counts), not on record contents")
MLFLOW_KEYS = protocol.STAGE_RUN_KEYS | tracking.LoggedKeys(metrics={
    "shards": "K = partition.num_shards (configuration)",
    "ran_here": "how many shard pre-training runs this invocation ran (the rest were current): orchestration, not data",
    "workers": "pretrain.workers (configuration)",
    "fan_in_seconds": _TIME,  # the whole stage's; none per shard (#52 item 8: one shard's time depends on its size)
    "public_records": "the public records' count (public data)",
    "iterations": "zhang.pretrain_iterations (configuration)",
    "critic_steps_per_iteration": "train.n_d, dp-GAN's n_critic (configuration)",
    "seconds": "wall-clock of the pre-training on public data",
})
# What runs comes from the method registry (dpsynth.methods.registry): Method.pretrain is the kind,
# Method.pretrain_function the function. "shard": fn(cfg, shard: ImageDataset, *, shard_index, out_path) -> details,
# training on that shard alone and writing its discriminator to the local file out_path; "public":
# fn(cfg, public: ImageDataset, *, out_path) -> details.


def _fingerprint(cfg) -> str:
    return protocol.fingerprint(cfg, SECTIONS + registry.get(cfg.train.method).sections)


def _shards(partition: dict) -> list[dict]:
    return manifest.outputs(partition, "shard")


def _shard_dir(ctx: protocol.StageContext, index: int) -> str:
    return storage.join(ctx.stage_dir(STAGE), f"shard-{index:05d}")


def _shard_record(ctx: protocol.StageContext, index: int) -> dict | None:
    """The record of shard ``index``'s pre-training, when it was done with this config on this shard."""
    uri = storage.join(_shard_dir(ctx, index), "shard.json")
    if not storage.exists(uri):
        return None
    try:
        record = json.loads(storage.read_bytes(uri))
    except json.JSONDecodeError:
        return None
    if record.get("format") != SHARD_FORMAT:
        return None
    return record


def _is_current(record: dict | None, *, fingerprint: str, shard: dict) -> bool:
    if (record is None or record.get("config_fingerprint") != fingerprint
            or record.get("input_sha256") != shard["sha256"] or "output" not in record):
        return False
    try:
        manifest.verify(record["output"])
    except StageError:
        return False
    return True


def run_shard(ctx: protocol.StageContext, index: int) -> dict:
    """Pre-training shard ``index`` (one fan-out task); returns its record. Skipped when already done."""
    cfg = ctx.cfg
    method = registry.get(cfg.train.method)
    partition, _ = protocol.upstream(ctx, "partition")
    shards = _shards(partition)
    if method.pretrain != "shard":
        return {"format": SHARD_FORMAT, "shard": index, "performed": False,
                "reason": f"method {method.name!r} has no per-shard pre-training"}
    if not 0 <= index < len(shards):
        raise StageError(f"--shard {index}: the partition has {len(shards)} shards (0..{len(shards) - 1})")
    shard = manifest.verify(shards[index])
    fp = _fingerprint(cfg)
    record = _shard_record(ctx, index)
    if not ctx.force and _is_current(record, fingerprint=fp, shard=shard):
        return {**record, "status": "skipped"}
    started = time.monotonic()
    out_uri = storage.join(_shard_dir(ctx, index), "discriminator.pt")
    with tempfile.TemporaryDirectory(prefix="dpsynth-pretrain-") as scratch:
        local = str(Path(scratch) / "discriminator.pt")
        details = method.pretrain_function(cfg, read_parquet(shard["uri"]), shard_index=index, out_path=local)
        storage.copy(local, out_uri)
    record = {"format": SHARD_FORMAT, "shard": index, "config_fingerprint": fp, "input_sha256": shard["sha256"],
              "output": manifest.entry(out_uri, role="discriminator", zones=ctx.zones, shard=index),
              "seconds": time.monotonic() - started, "details": details}
    storage.write_text(storage.join(_shard_dir(ctx, index), "shard.json"), json.dumps(record, indent=2) + "\n")
    return {**record, "status": "succeeded"}


def _run_shard_in_worker(ctx: protocol.StageContext, index: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    return run_shard(ctx, index)


def _run_missing(ctx: protocol.StageContext, indices: list[int]) -> None:
    workers = min(ctx.cfg.pretrain.workers, len(indices))
    if workers <= 1:
        for i in indices:
            run_shard(ctx, i)
        return
    threads = max(1, dpsynth_threads.count() // workers)  # the CPUs this process really has (threads.py)
    spawn = multiprocessing.get_context("spawn")  # torch and fork do not mix
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=spawn) as pool:
        for future in concurrent.futures.as_completed([pool.submit(_run_shard_in_worker, ctx, i, threads)
                                                       for i in indices]):
            future.result()


def _per_shard(ctx: protocol.StageContext, partition: dict) -> tuple[list[dict], dict]:
    fp = _fingerprint(ctx.cfg)
    shards = [manifest.verify(s) for s in _shards(partition)]
    missing = [i for i, s in enumerate(shards)
               if ctx.force or not _is_current(_shard_record(ctx, i), fingerprint=fp, shard=s)]
    started = time.monotonic()
    _run_missing(ctx, missing)
    records = [_shard_record(ctx, i) for i in range(len(shards))]
    for i, (record, shard) in enumerate(zip(records, shards)):
        if not _is_current(record, fingerprint=fp, shard=shard):
            raise StageError(f"pretrain shard {i}: no current pre-training after running it")
    outputs = [r["output"] for r in records]
    # no per-shard time (nor their maximum) leaves the sensitive zone: a shard smaller than the batch takes less time
    # (#52 item 8); the egress gate withholds these from MLflow and --json (dpsynth/egress.py's DETAILS names neither)
    seconds = [r["seconds"] for r in records]
    details = {"shards": len(shards), "ran_here": len(missing), "workers": ctx.cfg.pretrain.workers,
               "fan_in_seconds": time.monotonic() - started, "shard_seconds_total": sum(seconds),
               "shard_seconds_max": max(seconds)}
    return outputs, details


def _public(ctx: protocol.StageContext, partition: dict) -> tuple[list[dict], dict]:
    found = manifest.outputs(partition, "public")
    if not found:
        raise StageError(f"train.method={ctx.cfg.train.method!r} pre-trains on public data, but the partition "
                         "declared no public records (set the data section's public data)")
    public = manifest.verify(found[0])
    out_uri = ctx.uri(STAGE, "pretrained.pt")
    with tempfile.TemporaryDirectory(prefix="dpsynth-pretrain-") as scratch:
        local = str(Path(scratch) / "pretrained.pt")
        details = registry.get(ctx.cfg.train.method).pretrain_function(ctx.cfg, read_parquet(public["uri"]),
                                                                      out_path=local)
        storage.copy(local, out_uri)
    return [ctx.entry(out_uri, role="pretrain")], {"public_records": public.get("rows"), **details}


def run(ctx: protocol.StageContext, *, shard: int | None = None) -> protocol.Outcome | dict:
    """The fan-in (``shard=None``): the stage. With ``shard``: one fan-out task, returning its record."""
    if shard is not None:
        return run_shard(ctx, shard)
    cfg = ctx.cfg
    partition, partition_entry = protocol.upstream(ctx, "partition")
    inputs = [partition_entry]
    fp = _fingerprint(cfg)
    if (reused := protocol.reuse(ctx, STAGE, fingerprint=fp, inputs=inputs)) is not None:
        return reused
    method = registry.get(cfg.train.method)
    if method.pretrain == "shard":
        outputs, details = _per_shard(ctx, partition)
    elif method.pretrain == "public":
        outputs, details = _public(ctx, partition)
    else:
        outputs, details = [], {"performed": False, "reason": f"method {method.name!r} does not pre-training"}
    with protocol.child_run(ctx, STAGE) as run:
        if run is not None and outputs:
            public = egress.let_out(details, egress.DETAILS)  # the gate: no per-shard figure (#52 item 8)
            tracking.log_run(MLFLOW_KEYS, metrics={k: v for k, v in public.items() if isinstance(v, (int, float))})
        return protocol.finish(
            ctx, STAGE, run, fingerprint=fp, dataset_sha256=partition["dataset_sha256"], inputs=inputs,
            outputs=outputs, details={"performed": bool(outputs), **details},
            privacy=manifest.no_privacy(delta=cfg.privacy.delta, note="non-private, so its outputs never "
                                        "leave the sensitive zone"),
        )
