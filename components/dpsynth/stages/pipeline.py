"""``dpsynth pipeline``: the six stages in order, under one MLflow parent run.

``start`` opens the parent run (left RUNNING, so stages in other processes or pods can nest
under it: an orchestrator passes its id to each stage as ``--parent-run-id``), ``finish``
summarises the stage manifests into it — total ε as metric and tag, the per-stage table as an
artifact — and closes it. ``run_pipeline`` does all three in-process, stopping at the first
stage that fails.

The ε column is the ε the stage's outputs consumed (a skipped stage reuses outputs made earlier:
their ε, no new spending; a failed stage shows "?", since a private one may have spent some
before failing); the total is their sum, the ε of what this pipeline run releases.

The lifetime ledger (``dpsynth.privacy.ledger``, section ``ledger``): ``start`` reserves the run's
target (ε, δ) against the population's budget before any stage runs — refusing the run, before
anything is written or tracked, when it would exceed the budget — and ``finish`` settles it
(:func:`settle`): it commits what the private stages of *this* run spent (the trainer's ε, or the
audit's recomputed upper bound when larger, at most the reservation), releases the reservation
when provably nothing was spent (the private stage never started, or reused earlier outputs),
and, conservatively, charges the whole reservation when a private stage failed or may have
started without leaving a record (a killed task). Every run is charged on its own: a re-run or a
retry with a new pipeline run id reserves again; ``start`` retried for the same id reuses its
open reservation. A private stage that ran more than once inside one pipeline run (a retried
task: MLflow shows several attempts) is charged the whole reservation — which may still be less
than two attempts spent: reserving per attempt in the stage itself would close that gap. The
reservation id is tagged on the parent run and reported in the summary.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from pathlib import Path

from dpsynth import storage, tracking
from dpsynth.config import RunConfig, dump_config
from dpsynth.errors import ConfigError, DpsynthError
from dpsynth.stages import audit, common, evaluate, manifest, partition, sample, train, warmstart

MODULES = {m.STAGE: m for m in (partition, warmstart, train, audit, sample, evaluate)}
assert tuple(MODULES) == common.STAGES
# The parent run (dpsynth.stage = "pipeline"): what finish() logs.
MLFLOW_KEYS = tracking.LoggedKeys(metrics={
    "epsilon_total": "the sum of the stages' recorded ε (accounted)",
    "ledger_epsilon_charged": "the ε the ledger charged this run (accounted)"})


def logged_keys(stage: str, method: str) -> tracking.LoggedKeys | None:
    """The allow-list of an MLflow run of ``stage`` (``"pipeline"``: the parent run); None: unknown stage."""
    if stage == "pipeline":
        return MLFLOW_KEYS
    if stage == "train":
        return train.logged_keys(method)
    module = MODULES.get(stage)
    return module.MLFLOW_KEYS if module is not None else None


PRIVATE_STAGES = ("train",)  # the stages that spend ε on the sensitive data
LEDGER_ENV = "DPSYNTH_LEDGER_URL"
log = logging.getLogger(__name__)


def run_stage(ctx: common.StageContext, stage: str) -> common.Outcome:
    log.info("%s: started, pipeline run %s, writing under %s", stage, ctx.pipeline_run_id, ctx.stage_dir(stage))
    started = time.monotonic()
    try:
        with lineage_env(ctx, stage):
            outcome = MODULES[stage].run(ctx)
    except BaseException as exc:
        log.error("%s: failed after %.0f s: %s", stage, time.monotonic() - started, str(exc) or repr(exc))
        raise
    eps = _epsilon(outcome.manifest, outcome.status)
    log.info("%s: %s in %.0f s, ε consumed %s, manifest %s", stage, outcome.status, time.monotonic() - started,
             "?" if eps is None else f"{eps:.4g}", outcome.manifest_uri)
    return outcome


@contextlib.contextmanager
def lineage_env(ctx: common.StageContext, stage: str):
    """Expose the stage's lineage to the MLflow run-context provider of ``mlflow_plugins``
    (``tracking.ENV_CONTEXT``) while the stage runs; restores the environment after."""
    values = {tracking.TAG_STAGE: stage, tracking.TAG_PIPELINE_RUN_ID: ctx.pipeline_run_id,
              tracking.TAG_POPULATION: population_id(ctx.cfg)}
    part = _manifest_or_none(ctx, "partition") if stage != "partition" else None
    if part and part.get("status") == "succeeded":
        values[tracking.TAG_DATASET_SHA256] = part["dataset_sha256"]
    env = {tracking.ENV_CONTEXT[tag]: value for tag, value in values.items() if value}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# --- the ledger ------------------------------------------------------------------------------------


def population_id(cfg: RunConfig) -> str:
    """``ledger.population_id``, else the dataset's name."""
    return (cfg.ledger.population_id or common.dataset_name(cfg.data.uri)).strip()


def ledger_url(ctx: common.StageContext) -> str:
    """``ledger.url``, else $DPSYNTH_LEDGER_URL, else SQLite ``ledger.db`` beside the run's SQLite
    MLflow store (``make run``: outputs/ledger.db, the CLI's default), else beside a local run directory."""
    if ctx.cfg.ledger.url:
        return ctx.cfg.ledger.url
    if os.environ.get(LEDGER_ENV):
        return os.environ[LEDGER_ENV]
    tracking_uri = _quietly(lambda: ctx.tracking_uri) if ctx.cfg.tracking.enabled else None
    if tracking_uri and tracking_uri.startswith("sqlite:///"):
        return f"sqlite:///{Path(tracking_uri[len('sqlite:///'):]).resolve().parent / 'ledger.db'}"
    if storage.is_remote(ctx.run_dir):
        raise ConfigError(f"ledger.url: required (or ${LEDGER_ENV}) when pipeline.run_dir is remote")
    return f"sqlite:///{Path(storage.local_path(ctx.run_dir)).resolve().parent / 'ledger.db'}"


def open_ledger(ctx: common.StageContext):
    from dpsynth.privacy.ledger import Ledger

    return Ledger(ledger_url(ctx))


def reserve(ctx: common.StageContext) -> dict | None:
    """Reserve the run's target (ε, δ) for its population (see the module docstring); the
    reservation as ``Ledger.history`` lists it, None when the ledger is off. PrivacyError
    when the budget cannot afford it."""
    cfg = ctx.cfg
    if not cfg.ledger.enabled:
        return None
    ledger, pid = open_ledger(ctx), population_id(cfg)
    for open_one in ledger.reservations(pipeline_run_id=ctx.pipeline_run_id, status="reserved"):
        if open_one["population_id"] == pid:  # `start` retried: its reservation stands
            return open_one
    if cfg.ledger.default_epsilon is not None:
        ledger.ensure_budget(pid, epsilon=cfg.ledger.default_epsilon, delta=cfg.ledger.default_delta)
    # the version this run is charged for, as its keyed id (the raw content hash never leaves the sensitive
    # zone); a fresh key is written only once the ledger accepted the run, so a refused run writes nothing
    key = common.version_key(ctx)
    fresh = key is None
    key = os.urandom(32) if fresh else key
    dataset_sha256 = common.keyed_version(key, partition.load_source(cfg).content_sha256())
    rid = ledger.reserve(pid, epsilon=cfg.privacy.epsilon, delta=cfg.privacy.delta, dataset_sha256=dataset_sha256,
                         pipeline_run_id=ctx.pipeline_run_id, accountant=cfg.privacy.accountant, stage="train")
    if fresh:
        common.write_version_key(ctx, key)
    return ledger.reservation(rid)


def _stage_runs(ctx: common.StageContext, stage: str) -> list | None:
    """This pipeline run's MLflow child runs of ``stage`` (one per attempt); None without tracking."""
    if not (ctx.parent_run_id and ctx.cfg.tracking.enabled):
        return None
    from mlflow import MlflowClient

    client = MlflowClient(ctx.tracking_uri)
    exp = client.get_run(ctx.parent_run_id).info.experiment_id
    return client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{ctx.parent_run_id}' and "
                                     f"tags.`{tracking.TAG_STAGE}` = '{stage}'")


def spending(ctx: common.StageContext, s: dict,
             outcomes: dict[str, common.Outcome] | None) -> tuple[float | None, str]:
    """What this run's private stages spent: (ε, why), or (None, why) when it must be charged in full."""
    spent, notes = 0.0, []
    upstream = _manifest_or_none(ctx, "warmstart")
    for row in (r for r in s["stages"] if r["stage"] in PRIVATE_STAGES):
        stage, status = row["stage"], row["status"]
        m = _manifest_or_none(ctx, stage)
        this_run = bool(m) and m.get("pipeline_run_id") == ctx.pipeline_run_id
        if status == "failed":
            return None, f"stage {stage} failed and may have spent ε before failing: charged in full"
        runs = _stage_runs(ctx, stage)
        attempts = [r for r in runs or () if r.data.tags.get(common.TAG_STATUS) != "skipped"]
        if len(attempts) > 1:  # a retried task spent again: at least the whole reservation
            return None, f"stage {stage} ran {len(attempts)} times in this pipeline run: charged in full"
        if this_run and m["status"] == "succeeded":
            eps = m["privacy"]["epsilon"]
            a = _manifest_or_none(ctx, "audit")
            bound = (a or {}).get("details", {}).get("epsilon_upper_bound")
            if a and a.get("pipeline_run_id") == ctx.pipeline_run_id and isinstance(bound, (int, float)):
                eps = max(eps, bound)  # the audit's recomputed upper bound, when larger
            spent += eps
            notes.append(f"{stage} spent ε={eps:.6g}")
        elif status == "skipped" or (status == "succeeded" and runs and not attempts):
            notes.append(f"{stage} reused earlier outputs (no new spending)")
        elif status == "not run" and (outcomes is not None or not upstream or upstream.get("status") != "succeeded"):
            notes.append(f"{stage} did not run")
        else:  # no record of this run's private stage, though it could have started: be conservative
            return None, f"stage {stage} has no record of this run ({status}) but could have started: charged in full"
    return spent, "; ".join(notes)


def settle(ctx: common.StageContext, s: dict, outcomes: dict[str, common.Outcome] | None = None) -> dict | None:
    """Commit or release this run's open reservation (see the module docstring); returns it, settled."""
    res = _this_runs_reservation(ctx)
    if res is None or res["status"] != "reserved":  # no ledger, nothing reserved, or `finish` called again
        return res
    ledger = open_ledger(ctx)
    spent, why = spending(ctx, s, outcomes)
    if spent is None:
        ledger.commit(res["id"], epsilon_spent=res["epsilon_reserved"], note=why)
    elif spent == 0:
        ledger.release(res["id"], note=f"nothing spent: {why}")
    else:
        if spent > res["epsilon_reserved"]:
            why += f"; the recomputed ε={spent:.6g} exceeds the reservation, which is charged"
        ledger.commit(res["id"], epsilon_spent=min(spent, res["epsilon_reserved"]), note=why)
    return ledger.reservation(res["id"])


def _ledger_summary(res: dict | None) -> dict | None:
    if res is None:
        return None
    charged = {"reserved": res["epsilon_reserved"], "committed": res["epsilon_spent"], "released": 0.0}[res["status"]]
    return {"reservation_id": res["id"], "population_id": res["population_id"], "status": res["status"],
            "epsilon_reserved": res["epsilon_reserved"], "epsilon_charged": charged, "delta": res["delta"],
            "dataset_sha256": res["dataset_sha256"], "note": res.get("note")}


def start(cfg: RunConfig, *, run_dir: str | None = None, pipeline_run_id: str | None = None,
          force: bool = False) -> common.StageContext:
    """A context for the stages of a new pipeline run, with its parent run open when tracking is on."""
    pipeline_run_id = pipeline_run_id or uuid.uuid4().hex[:12]
    ctx = common.StageContext.create(cfg, run_dir=run_dir, pipeline_run_id=pipeline_run_id, force=force)
    res = reserve(ctx)  # before anything is written or tracked: a run the budget cannot afford stops here
    if res is not None:
        log.info("pipeline %s: reserved ε=%.4g, δ=%g of population %r (ledger reservation %s)", pipeline_run_id,
                 res["epsilon_reserved"], res["delta"], res["population_id"], res["id"])
    if not cfg.tracking.enabled:
        return ctx
    from mlflow import MlflowClient

    tags = {**ctx.run_tags(), tracking.TAG_ACCOUNTANT: cfg.privacy.accountant, "dpsynth.run_dir": ctx.run_dir,
            tracking.TAG_POPULATION: population_id(cfg)}
    if res is not None:
        tags.update({tracking.TAG_LEDGER_RESERVATION: str(res["id"]),
                     tracking.TAG_DATASET_SHA256: res["dataset_sha256"]})
    try:
        parent = tracking.create_parent_run(tracking_uri=ctx.tracking_uri, experiment=ctx.experiment,
                                            run_name=f"pipeline-{pipeline_run_id}", tags=tags,
                                            artifact_location=cfg.tracking.artifact_location)
        MlflowClient(ctx.tracking_uri).log_text(parent, dump_config(common.redacted(ctx.cfg)), "config.yaml")
    except BaseException:
        if res is not None:
            open_ledger(ctx).release(res["id"], note="the pipeline's MLflow parent run could not be created")
        raise
    return common.StageContext.create(ctx.cfg, run_dir=ctx.run_dir, parent_run_id=parent,
                                      pipeline_run_id=pipeline_run_id, force=force)


def summary(ctx: common.StageContext, outcomes: dict[str, common.Outcome] | None = None) -> dict:
    """One row per stage — status, ε, outputs — from ``outcomes`` where given, else from the manifests."""
    rows = []
    for stage in common.STAGES:
        outcome = (outcomes or {}).get(stage)
        m = outcome.manifest if outcome else _manifest_or_none(ctx, stage)
        status = outcome.status if outcome else (m["status"] if m else "not run")
        rows.append({"stage": stage, "status": status,
                     "epsilon": _epsilon(m, status),
                     "outputs": len(m["outputs"]) if m else 0, "where": ctx.stage_dir(stage),
                     "mlflow_run_id": outcome.mlflow_run_id if outcome else (m or {}).get("mlflow_run_id"),
                     "error": outcome.error if outcome else None})
    audit_row = rows[common.STAGES.index("audit")]
    audit_status = {"succeeded": "passed", "skipped": "passed", "failed": "failed"}.get(audit_row["status"], "not run")
    return {"pipeline_run_id": ctx.pipeline_run_id, "parent_run_id": ctx.parent_run_id, "run_dir": ctx.run_dir,
            "succeeded": all(r["status"] in ("succeeded", "skipped") for r in rows),
            "epsilon_total": sum(r["epsilon"] or 0.0 for r in rows), "delta": ctx.cfg.privacy.delta, "audit": audit_status,
            "stages": rows, "ledger": _ledger_summary(_quietly(_this_runs_reservation, ctx))}


def _quietly(fn, *args):
    """``fn(*args)``, or None when it fails with a user-facing or database error (a summary still
    shows the stages when the ledger cannot be read)."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return fn(*args)
    except (DpsynthError, SQLAlchemyError):
        return None


def _this_runs_reservation(ctx: common.StageContext) -> dict | None:
    if not ctx.cfg.ledger.enabled or not ctx.pipeline_run_id:
        return None
    mine = [r for r in open_ledger(ctx).reservations(pipeline_run_id=ctx.pipeline_run_id)
            if r["population_id"] == population_id(ctx.cfg)]
    return mine[-1] if mine else None


def _epsilon(m: dict | None, status: str) -> float | None:
    """ε of a stage's outputs; None (unknown) for a failed stage, which may have spent some before failing."""
    if status == "failed":
        return None
    return m["privacy"]["epsilon"] if m else 0.0


def _manifest_or_none(ctx, stage):
    uri = ctx.manifest_uri(stage)
    return manifest.read(uri) if storage.exists(uri) else None


def table(s: dict) -> str:
    """The per-stage table as Markdown."""
    lines = ["| stage | status | ε consumed | outputs |", "|---|---|---|---|"]
    for r in s["stages"]:
        where = f"{r['outputs']} files in {r['where']}" if r["outputs"] else "-"
        eps = "?" if r["epsilon"] is None else f"{r['epsilon']:.4g}"
        lines.append(f"| {r['stage']} | {r['status']} | {eps} | {where} |")
    lines.append(f"| **total** | audit {s['audit']} | **{s['epsilon_total']:.4g}** (δ = {s['delta']:g}) | |")
    if s.get("ledger"):
        g = s["ledger"]
        lines.append(f"\nLedger: population {g['population_id']!r}, reservation {g['reservation_id']} "
                     f"{g['status']} (ε reserved {g['epsilon_reserved']:.4g}, charged {g['epsilon_charged']:.4g})"
                     + (f": {g['note']}" if g.get("note") else ""))
    return "\n".join(lines)


def finish(ctx: common.StageContext, outcomes: dict[str, common.Outcome] | None = None) -> dict:
    """Settle the run's ledger reservation, summarise the run into its parent MLflow run (when
    there is one) and close it."""
    s = summary(ctx, outcomes)
    s["ledger"] = _ledger_summary(settle(ctx, s, outcomes))
    log.info("pipeline %s: %s, total ε %.4g, audit %s", ctx.pipeline_run_id,
             "succeeded" if s["succeeded"] else "failed", s["epsilon_total"], s["audit"])
    if ctx.parent_run_id and ctx.cfg.tracking.enabled:
        from mlflow import MlflowClient

        client, run_id = MlflowClient(ctx.tracking_uri), ctx.parent_run_id
        client.log_metric(run_id, "epsilon_total", s["epsilon_total"])
        tags = {tracking.TAG_EPSILON_SPENT: f"{s['epsilon_total']:.6g}", tracking.TAG_AUDIT: s["audit"]}
        part = _manifest_or_none(ctx, "partition")
        if part:
            tags[tracking.TAG_DATASET_SHA256] = part["dataset_sha256"]
        if s["ledger"]:
            tags.update({tracking.TAG_LEDGER_RESERVATION: str(s["ledger"]["reservation_id"]),
                         "dpsynth.ledger_status": s["ledger"]["status"]})
            client.log_metric(run_id, "ledger_epsilon_charged", s["ledger"]["epsilon_charged"])
        for key, value in tags.items():
            client.set_tag(run_id, key, value)
        columns = ("stage", "status", "epsilon", "outputs", "where", "mlflow_run_id")
        client.log_table(run_id, {c: [r[c] for r in s["stages"]] for c in columns}, "pipeline/stages.json")
        client.log_text(run_id, table(s) + "\n", "pipeline/stages.md")
        client.set_terminated(run_id, "FINISHED" if s["succeeded"] else "FAILED")
    return s


def run_pipeline(cfg: RunConfig, *, run_dir: str | None = None, pipeline_run_id: str | None = None,
                 force: bool = False) -> tuple[common.StageContext, dict]:
    """Start, run the six stages in order (stopping at the first failure), finish. Returns the summary."""
    ctx = start(cfg, run_dir=run_dir, pipeline_run_id=pipeline_run_id, force=force)
    outcomes: dict[str, common.Outcome] = {}
    try:
        for stage in common.STAGES:
            try:
                outcomes[stage] = run_stage(ctx, stage)
            except BaseException as exc:  # an unexpected error or an interrupt fails the stage too
                m = _manifest_or_none(ctx, stage)
                failed = m if m and m["status"] == "failed" and m["pipeline_run_id"] == ctx.pipeline_run_id else None
                outcomes[stage] = common.Outcome(stage=stage, status="failed", manifest=failed,
                                                 manifest_uri=ctx.manifest_uri(stage), error=str(exc) or repr(exc))
                if not isinstance(exc, DpsynthError):
                    raise
                break
    finally:
        for stage in common.STAGES:
            outcomes.setdefault(stage, common.Outcome(stage=stage, status="not run", manifest=None,
                                                      manifest_uri=ctx.manifest_uri(stage)))
        s = finish(ctx, outcomes)
    return ctx, s
