"""``dpsynth train --run-dir URI``: the private training of the chosen method, on the training shards.

Reads the shards the partition manifest lists (never the held-out records), trains with the
method's trainer, and writes the generator, the mechanism trace, the result and a sample grid
to ``sensitive/train/``: the generator is releasable only after ``audit``. ε consumed: what
the trainer's accountant reports for the trace (the audit recomputes it independently).

The trainer works in a local directory: ``sensitive/train`` itself when the run directory is
local (so an interrupted run resumes from ``checkpoints/`` when its settings are unchanged;
a checkpoint of other settings, or any with ``--force``, is discarded), else a temporary directory whose
outputs are then uploaded; there every checkpoint and generator snapshot is also copied to
``sensitive/train/checkpoints/`` in the run directory as it is written, and pulled from there by the next
attempt, so an orchestrator's retry (on any machine) resumes it under the killed attempt's reservation.

Every attempt is charged to the ledger (:mod:`dpsynth.ledger.attempt`): it opens its own reservation
before building the trainer, adopting the reservation of the checkpoint it resumes, and commits the ε
of the steps it added. A reused stage opens none (it spends nothing).

Under ``torchrun`` (a data-parallel method, :mod:`dpsynth.distributed.data_parallel`) every rank runs
``dpsynth train --run-dir RUN_DIR``: rank 0 is the stage — :func:`run`: the reuse decision, the
ledger attempt, the trainer's MLflow child run, the outputs and the manifest — and tells the other
ranks whether it trains; they (:func:`follow`) read the same shards and pre-training, train in step
with it, and write nothing.

``gswgan_federated`` always runs so, on K + 1 ranks (:mod:`dpsynth.distributed.federation`): in one process
:func:`run` starts that torchrun job and returns its rank 0's outcome; in the job rank 0 is the stage
and the server, given the number of records only (it opens no shard), and rank k + 1 is client k,
which reads its own shard and warm D_k only and writes only its own checkpoints.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import types
import uuid
from pathlib import Path

from dpsynth import storage, threads, tracking
from dpsynth.config import dump_config
from dpsynth.data import blocks as data_blocks, read_parquet
from dpsynth.errors import ConfigError, DpsynthError, StageError
from dpsynth.distributed import data_parallel
from dpsynth.training import checkpoint, loop
from dpsynth.methods import registry
from dpsynth.ledger import charging
from dpsynth.stages import protocol, manifest

STAGE = "train"
SECTIONS = ("data", "partition", "privacy", "train", "warmup")  # plus the method's own (registry: Method.sections)
# The train run is the trainer's: it logs the config and what its class declares (Trainer.MLFLOW_KEYS).
MLFLOW_KEYS = protocol.STAGE_RUN_KEYS | tracking.config_params()
MARKER = "inputs.sha256"  # in checkpoints/: the settings and training data its checkpoint belongs to
OUTPUTS = {"generator": "generator.pt", "trace": "trace.json", "result": "result.json",
           "grid": "samples.png", "config": "config.yaml"}


def logged_keys(method: str) -> tracking.LoggedKeys:
    """What a train run of ``method`` may hold: the stage's keys and its trainer's."""
    return MLFLOW_KEYS | registry.get(method).trainer.MLFLOW_KEYS


def warm_discriminators(pretrain_manifest: dict | None, *, own: range | None = None) -> dict[int, bytes]:
    """Shard index → the bytes of its pre-trained D_k file, from the pretrain stage's manifest (``own``: only
    those shards')."""
    found = {}
    for item in (pretrain_manifest or {}).get("outputs", []):
        if item.get("role") == "discriminator" and (own is None or int(item["shard"]) in own):
            found[int(item["shard"])] = storage.read_bytes(manifest.verify(item)["uri"])
    return found


def own_shards(method: registry.Method, count: int) -> range:
    """The shards this rank reads: all of them, but under torchrun a method training on the K shards (GS-WGAN,
    DPAC) spreads them over the ranks, and a rank reads only its own block (its trainer holds only those)."""
    spread = method.pretrain == "shard" and method.data_parallel
    return range(*data_parallel.current().part(count)) if spread else range(count)


def read_shards(method: registry.Method, shards: list[dict]) -> list:
    """The shards' records, ``None`` for those another rank holds (:func:`own_shards`)."""
    own = own_shards(method, len(shards))
    return [read_parquet(s["uri"]) if i in own else None for i, s in enumerate(shards)]


def method_inputs(ctx: protocol.StageContext, method: registry.Method, *, dataset, shards, pretrain) -> tuple:
    """``(data, inputs)`` for the method's trainer (see :mod:`dpsynth.methods.registry`), from the
    partition's and the pretrain stage's manifests."""
    if method.pretrain == "shard":
        inputs = {"warm": warm_discriminators(pretrain, own=own_shards(method, len(shards)))}
        if None in shards:  # a rank holding its own shards only: n from the partition's manifest
            inputs["records"] = protocol.upstream(ctx, "partition")[0]["details"]["training_records"]
        return shards, inputs
    if method.pretrain == "public":
        from dpsynth.methods.networks import load_pretrained

        partition, _ = protocol.upstream(ctx, "partition")
        found = manifest.outputs(partition, "public")
        warm = manifest.outputs(pretrain, "pretrain")
        return dataset, {
            "public": read_parquet(manifest.verify(found[0])["uri"]) if found else None,
            "pretrained_state": load_pretrained(storage.read_bytes(manifest.verify(warm[0])["uri"])) if warm else None}
    return dataset, {}


def _discard_stale_checkpoints(workdir: str, *, stamp: str, force: bool, mirror: str | None = None) -> None:
    """Keep ``checkpoints/`` only for an interrupted run of the same settings *and* training data. ``mirror``: where
    a remote run directory keeps them (:func:`dpsynth.training.checkpoint.mirroring`): pulled first, cleared with
    the local copy."""
    ckpt = Path(workdir) / "checkpoints"
    if mirror is not None:
        checkpoint.pull(mirror, ckpt)
    marker = ckpt / MARKER
    if ckpt.exists() and (force or not marker.exists() or marker.read_text() != stamp):
        shutil.rmtree(ckpt)
        if mirror is not None:
            checkpoint.clear_mirror(mirror)
    ckpt.mkdir(parents=True, exist_ok=True)
    marker.write_text(stamp)
    if mirror is not None:
        storage.write_text(storage.join(mirror, MARKER), stamp)


@dataclasses.dataclass(frozen=True)
class _Inputs:
    """What the stage reads, the same on every rank: the upstream manifests, the shards, the fingerprint."""

    method: registry.Method
    partition: dict
    pretrain: dict
    shards: list[dict]
    inputs: list[dict]
    fingerprint: str


def _inputs(ctx: protocol.StageContext, *, verify_shards: bool = True) -> _Inputs:
    cfg = ctx.cfg
    method = registry.get(cfg.train.method)
    partition, partition_entry = protocol.upstream(ctx, "partition")
    pretrain_manifest, pretrain_entry = protocol.upstream(ctx, "pretrain")
    shards = [manifest.verify(s) if verify_shards else s for s in manifest.outputs(partition, "shard")]
    return _Inputs(method=method, partition=partition, pretrain=pretrain_manifest, shards=shards,
                   inputs=[partition_entry, pretrain_entry, *shards],
                   fingerprint=protocol.fingerprint(cfg, SECTIONS + method.sections))


def _trainer_config(ctx: protocol.StageContext, shards: list[dict], workdir: str):
    cfg = ctx.cfg
    return dataclasses.replace(
        protocol.redacted(cfg),
        data=dataclasses.replace(cfg.data, uri=shards[0]["uri"] if len(shards) == 1 else ctx.stage_dir("partition")),
        output=dataclasses.replace(cfg.output, dir=workdir),
        tracking=dataclasses.replace(cfg.tracking, uri=ctx.tracking_uri if cfg.tracking.enabled else None,
                                     experiment=ctx.experiment),
    )


def run(ctx: protocol.StageContext) -> protocol.Outcome:
    cfg = ctx.cfg
    ranks = data_parallel.current()  # under torchrun this is rank 0; the other ranks run follow()
    federated = registry.get(cfg.train.method).federated  # rank 0 is its server (methods.federated_processes)
    if federated and not ranks.distributed:  # in one process: start the job of the server and K clients
        return _federated_job(ctx)
    read = _inputs(ctx, verify_shards=not federated)  # each client verifies its own shard; the server reads none
    method, partition, shards, inputs, fp = read.method, read.partition, read.shards, read.inputs, read.fingerprint
    reused = protocol.reuse(ctx, STAGE, fingerprint=fp, inputs=inputs)
    ranks.from_main(reused is None)  # the other ranks train only when rank 0 does
    if reused is not None:
        return reused
    charging.population_id(cfg)  # ConfigError before the data is read
    records = sum(s["rows"] for s in shards)
    if federated:  # the server is given the number of records, never a shard or a D_k
        data, method_kwargs = records, {}
    else:  # a rank of a shard method holds its own shards only (None for the others')
        shard_data = read_shards(method, shards)
        dataset = protocol.concat(shard_data) if None not in shard_data else None
        data, method_kwargs = method_inputs(ctx, method, dataset=dataset, shards=shard_data, pretrain=read.pretrain)
    remote = storage.is_remote(ctx.run_dir)
    with tempfile.TemporaryDirectory(prefix="dpsynth-train-") as scratch:
        workdir = scratch if remote else str(storage.local_path(ctx.stage_dir(STAGE)))
        mirror = ctx.uri(STAGE, "checkpoints") if remote else None  # a retry elsewhere resumes from it
        stamp = hashlib.sha256(json.dumps([fp, [s["sha256"] for s in shards]]).encode()).hexdigest()
        _discard_stale_checkpoints(workdir, stamp=stamp, force=ctx.force, mirror=mirror)
        tcfg = _trainer_config(ctx, shards, workdir)
        tracking_uri = ctx.tracking_uri if cfg.tracking.enabled else None
        ledger = charging.open_ledger(charging.ledger_url(cfg, run_dir=ctx.run_dir, tracking_uri=tracking_uri))
        source = next(i for i in partition["inputs"] if i["role"] == "source")
        with checkpoint.mirroring(mirror), charging.attempt(  # one charged attempt (dpsynth.ledger.attempt)
                tcfg, ledger=ledger, dataset_version=partition["dataset_sha256"], workdir=workdir,
                pipeline_run_id=ctx.pipeline_run_id or f"stage-{uuid.uuid4().hex[:12]}",
                records=partition["details"]["records"], content_sha256=source["content_sha256"],
                blocks=partition["details"].get("blocks"), block_series=data_blocks.series(source["uri"])) as charge:
            trainer = charge.admit(method.trainer(tcfg, data, parent_run_id=ctx.parent_run_id,
                                                          run_tags=ctx.run_tags(), **method_kwargs))
            charge.result = loop.train(trainer)  # the one loop, for every method (the federated server's too)
        result = dataclasses.asdict(charge.result)
        # generator snapshots a trainer left at its checkpoints (evaluate's ε-vs-metric curve)
        snapshots = sorted(p.relative_to(workdir).as_posix()
                           for p in (Path(workdir) / "checkpoints" / checkpoint.SNAPSHOTS).glob("generator-*.pt"))
        if remote:
            for name in [*OUTPUTS.values(), *snapshots]:
                storage.copy(storage.join(workdir, name), ctx.uri(STAGE, name))
    outputs = [ctx.entry(ctx.uri(STAGE, name), role=role) for role, name in OUTPUTS.items()]
    outputs += [ctx.entry(ctx.uri(STAGE, name), role="generator_snapshot") for name in snapshots]
    trace = json.loads(storage.read_bytes(ctx.uri(STAGE, OUTPUTS["trace"])))
    privacy = {"epsilon": result["epsilon"], "delta": result["delta"], "accountant": result["accountant"],
               "events": trace["events"], "note": "as reported by the trainer; the audit recomputes it from the trace"}
    details = {"method": cfg.train.method, "training_records": records, "ranks": ranks.world_size,
               **{k: result[k] for k in ("steps", "generator_steps", "noise_multiplier", "sample_rate", "stopped_by")
                  if k in result}}
    with protocol.child_run(ctx, STAGE, run_id=result.get("mlflow_run_id")) as run:
        return protocol.finish(ctx, STAGE, run, fingerprint=fp, dataset_sha256=partition["dataset_sha256"],
                             inputs=inputs, outputs=outputs, privacy=privacy, details=details)


def follow(ctx: protocol.StageContext) -> None:
    """A rank other than 0 of a ``torchrun`` job: when rank 0 trains (:func:`run`), the same trainer on the same
    shards and pre-training, step for step with it; it opens no ledger attempt, no MLflow run, and writes nothing
    (its trainer's ``output.dir`` is rank 0's work directory, which only rank 0 writes)."""
    ranks = data_parallel.current()
    if ranks.is_main:
        raise RuntimeError("train.follow: rank 0 runs the stage itself (train.run)")
    if registry.get(ctx.cfg.train.method).federated:  # client k = rank k + 1: its own shard and D_k only
        return _federated_client(ctx)
    read = _inputs(ctx)
    if not ranks.from_main(None):  # rank 0 reused the stage's outputs: nothing to train
        return
    shard_data = read_shards(read.method, read.shards)
    tcfg = _trainer_config(ctx, read.shards, str(ctx.stage_dir(STAGE)))  # never written here
    dataset = protocol.concat(shard_data) if None not in shard_data else None
    data, method_kwargs = method_inputs(ctx, read.method, dataset=dataset, shards=shard_data,
                                        pretrain=read.pretrain)
    loop.train(read.method.trainer(tcfg, data, **method_kwargs))


# --- the federated GS-WGAN: the job of its server and K clients (dpsynth.distributed.federation) ---


def _federated_client(ctx) -> None:
    """Rank k + 1 of the job running the train stage (:func:`follow`): client k. It reads
    and verifies its own shard and its own warm D_k, nothing of another shard; it writes only its checkpoints
    (local run directories: the stage's ``checkpoints/clients/``; none for a remote one, which does not resume)."""
    from dpsynth.distributed import federation
    from dpsynth.methods import federated_processes as fed

    k = data_parallel.current().rank - 1
    partition, _ = protocol.upstream(ctx, "partition")
    pretrain, _ = protocol.upstream(ctx, "pretrain")
    entries = manifest.outputs(partition, "shard")
    if len(entries) != ctx.cfg.partition.num_shards:
        raise ConfigError(f"partition.num_shards: {ctx.cfg.partition.num_shards}, but the partition wrote "
                          f"{len(entries)} shards")
    if not data_parallel.current().from_main(None):  # rank 0 reused the stage's outputs: nothing to train
        return
    shard = read_parquet(manifest.verify(entries[k])["uri"])
    warm = [storage.read_bytes(manifest.verify(item)["uri"]) for item in pretrain.get("outputs", [])
            if item.get("role") == "discriminator" and int(item["shard"]) == k]
    stage_dir = ctx.stage_dir("train")
    checkpoints = None if storage.is_remote(stage_dir) else (
        Path(storage.local_path(stage_dir)) / "checkpoints" / federation.CLIENT_CHECKPOINTS)
    fed.client_main(ctx.cfg, shard, warm=warm[0] if warm else None, checkpoints=checkpoints)


def _run_job(command: list[str], *, env: dict[str, str] | None = None) -> tuple[str, int]:
    """Run torchrun (stdout captured; stderr, every rank's log, passed through as it comes); stopped by SIGTERM
    (a task's time limit), this process stops torchrun first, which stops the ranks."""
    job = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        stdout, _ = job.communicate()
        return stdout, job.returncode
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if job.poll() is None:
            job.terminate()
            try:
                job.wait(timeout=60)
            except subprocess.TimeoutExpired:
                job.kill()
                job.wait()


def _federated_job(ctx) -> protocol.Outcome:
    """The train stage of a one-process ``dpsynth train --run-dir`` / ``dpsynth pipeline run``: run it as a
    torchrun job of K + 1 ranks on this machine (``python -m torch.distributed.run --standalone``, an argv list,
    no shell) and return rank 0's outcome. The job reads this run's settings from a private copy of the
    configuration (it holds the partition key), removed afterwards."""
    from dpsynth.distributed import federation as fed
    from dpsynth.distributed.launch import stage_argv

    with tempfile.TemporaryDirectory(prefix="dpsynth-federated-") as private:  # mode 0700
        config = Path(private) / "config.yaml"
        config.touch(mode=0o600)
        config.write_text(dump_config(ctx.cfg))
        args = types.SimpleNamespace(config=str(config), overrides=[], run_dir=ctx.run_dir,
                                     parent_run_id=ctx.parent_run_id, pipeline_run_id=ctx.pipeline_run_id,
                                     force=ctx.force, json=True)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                   str(fed.world_size(ctx.cfg)), "-m", "dpsynth", *stage_argv(args)]
        stdout, returncode = _run_job(command, env=threads.environment_for(fed.world_size(ctx.cfg)))  # CPUs shared
    if returncode != 0:
        raise DpsynthError(f"train: the federated job (server and {ctx.cfg.partition.num_shards} clients under "
                           f"torchrun) failed with exit status {returncode}; the failing rank's error is above")
    start = re.search(r"^\{", stdout, re.MULTILINE)
    if start is None:
        raise DpsynthError("train: the federated job succeeded but its rank 0 printed no outcome")
    out, _ = json.JSONDecoder().raw_decode(stdout, start.start())  # rank 0's `--json` outcome
    return protocol.Outcome(stage=out["stage"], status=out["status"], manifest=out["manifest"],
                          manifest_uri=out["manifest_uri"], mlflow_run_id=out["mlflow_run_id"])


def launched(ctx: protocol.StageContext, job: dict, *, as_json: bool) -> None:
    """Print the outcome of the train stage a TrainJob or PyTorchJob ran (``job``: its kind, name, namespace and
    shape, :func:`dpsynth.distributed.launch.run_trainjob`), from the manifest its rank 0 wrote."""
    what = f"{job['kind']} {job['name']}"
    uri = ctx.manifest_uri(STAGE)
    m = manifest.read(uri)
    if m.get("status") != "succeeded":
        raise StageError(f"train: {what} finished but {uri} records status {m.get('status')!r}")
    # what the orchestrators keep (Airflow: return.json and an XCom; KFP: the pod log): through the egress gate, as
    # every stage's --json (no raw hash of a shard, a manifest or D_k, no per-shard count: #52 item 1)
    outcome = protocol.outside_outcome(ctx, {
        "stage": STAGE, "status": m["status"], "manifest_uri": uri, "mlflow_run_id": m.get("mlflow_run_id"),
        "manifest": m, "trainjob": job})
    if as_json:
        print(json.dumps(outcome, indent=2))
    else:
        print(f"train: {m['status']} ({what}), ε consumed {m['privacy']['epsilon']:.4g}, "
              f"{len(m['outputs'])} outputs; manifest {uri}")
