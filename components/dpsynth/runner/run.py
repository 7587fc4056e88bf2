"""``dpsynth pipeline``: the six stages in order, under one MLflow parent run.

``start`` opens the parent run (left RUNNING, so stages in other processes or pods can nest
under it: an orchestrator passes its id to each stage as ``--parent-run-id``), ``finish``
summarises the stage manifests into it — total ε as metric and tag, the per-stage table as an
artifact — and closes it. ``run_pipeline`` does all three in-process, stopping at the first
stage that fails.

The ε column is the ε the stage's outputs consumed (a skipped stage reuses outputs made earlier:
their ε, no new spending; a failed stage shows "?", since a private one may have spent some
before failing); the total is their sum, the ε of what this pipeline run releases.

The lifetime ledger (``dpsynth.ledger.store``, section ``ledger``): ``start`` checks, before
anything is written or tracked, that the population's budget can afford the run's target (ε, δ),
refusing the run otherwise. The charge itself is made by each *attempt* of the train stage
(:mod:`dpsynth.ledger.attempt`): every attempt — a retry, a re-run, a resume — holds its own
reservation and commits what it spent. ``finish`` settles any reservation of this pipeline run that
an attempt left open (it was killed) at its whole amount, and reports what the run was charged: the
sum over its attempts. Their ids are tagged on the parent run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import types
import uuid

from dpsynth import storage, tracking
from dpsynth.config import RunConfig, dump_config
from dpsynth.errors import DpsynthError
from dpsynth.data import blocks as data_blocks
from dpsynth.stages import audit, protocol, evaluate, manifest, partition, sample, train, pretrain
from dpsynth.ledger import charging

MODULES = {m.STAGE: m for m in (partition, pretrain, train, audit, sample, evaluate)}
assert tuple(MODULES) == protocol.STAGES
# The parent run (dpsynth.stage = "pipeline"): what finish() logs.
MLFLOW_KEYS = protocol.PARENT_RUN_KEYS


LEDGER_ENV = charging.LEDGER_ENV
log = logging.getLogger(__name__)


def run_stage(ctx: protocol.StageContext, stage: str) -> protocol.Outcome:
    with stage_run(ctx, stage) as done:
        done.outcome = MODULES[stage].run(ctx)
    return done.outcome


@contextlib.contextmanager
def stage_run(ctx: protocol.StageContext, stage: str):
    """Around the stage's ``run`` in this process (a pipeline run's :func:`run_stage`, or ``dpsynth train``'s call
    of the train stage's ``run``), which sets ``done.outcome`` on what this yields: the stage's lineage in the
    environment while it runs (:func:`lineage_env`), its start, its failure and its outcome logged."""
    log.info("%s: started, pipeline run %s, writing under %s", stage, ctx.pipeline_run_id, ctx.stage_dir(stage))
    started = time.monotonic()
    done = types.SimpleNamespace(outcome=None)
    try:
        with lineage_env(ctx, stage):
            yield done
    except BaseException as exc:
        log.error("%s: failed after %.0f s: %s", stage, time.monotonic() - started, str(exc) or repr(exc))
        raise
    outcome = done.outcome
    eps = _epsilon(outcome.manifest, outcome.status)
    log.info("%s: %s in %.0f s, ε consumed %s, manifest %s", stage, outcome.status, time.monotonic() - started,
             "?" if eps is None else f"{eps:.4g}", outcome.manifest_uri)


@contextlib.contextmanager
def lineage_env(ctx: protocol.StageContext, stage: str):
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
    return charging.population_id(cfg)


def check_budget(ctx: protocol.StageContext) -> dict:
    """Refuse (PrivacyError, nothing written) a run whose target (ε, δ) the population (each block the run would
    read) cannot afford."""
    cfg = ctx.cfg
    source = partition.load_source(cfg)
    ledger = charging.run_ledger(ctx)
    read, blocks = charging.window(cfg, ledger, source)  # privacy blocks: the window this run would read (#54)
    bal = ledger.check_affordable(population_id(cfg), epsilon=cfg.privacy.epsilon, delta=cfg.privacy.delta,
                                  records=len(read), blocks=blocks, block_series=data_blocks.series(cfg.data.uri))
    ledger.check_data(population_id(cfg), content_sha256=source.content_sha256())  # not another population's
    return bal


def settle(ctx: protocol.StageContext) -> list[dict]:
    """Settle this run's reservations still open (their attempt ended without closing them: killed) at their
    whole amount; returns all of this run's reservations."""
    ledger = charging.run_ledger(ctx)
    for res in ledger.reservations(pipeline_run_id=ctx.pipeline_run_id, status="reserved"):
        ledger.settle(res["id"], reason=f"pipeline run {ctx.pipeline_run_id!r} finished while the attempt's "
                                        "reservation was open: the attempt ended without closing it")
    return _this_runs_reservations(ctx)


def _ledger_summary(ctx: protocol.StageContext, rows: list[dict] | None) -> dict | None:
    if rows is None:
        return None
    charged = {"reserved": "epsilon_reserved", "committed": "epsilon_spent"}
    return {"population_id": population_id(ctx.cfg), "reservation_ids": [r["id"] for r in rows],
            "attempts": len(rows), "open": sum(r["status"] == "reserved" for r in rows),
            "epsilon_charged": sum(r[charged[r["status"]]] for r in rows if r["status"] in charged),
            "notes": [f"reservation {r['id']} {r['status']}: {r.get('note') or ''}".rstrip(": ") for r in rows]}


def start(cfg: RunConfig, *, run_dir: str | None = None, pipeline_run_id: str | None = None,
          force: bool = False) -> protocol.StageContext:
    """A context for the stages of a new pipeline run, with its parent run open when tracking is on."""
    pipeline_run_id = pipeline_run_id or uuid.uuid4().hex[:12]
    ctx = protocol.StageContext.create(cfg, run_dir=run_dir, pipeline_run_id=pipeline_run_id, force=force)
    bal = check_budget(ctx)  # before anything is written or tracked: a run the budget cannot afford stops here
    log.info("pipeline %s: population %r can afford ε=%.4g, δ=%g (remaining ε=%.4g); each train attempt "
             "reserves its own", pipeline_run_id, bal["population_id"], cfg.privacy.epsilon, cfg.privacy.delta,
             bal["remaining"])
    if not cfg.tracking.enabled:
        return ctx
    from mlflow import MlflowClient

    tags = {**ctx.run_tags(), tracking.TAG_ACCOUNTANT: cfg.privacy.accountant, "dpsynth.run_dir": ctx.run_dir,
            tracking.TAG_POPULATION: population_id(cfg)}
    parent = tracking.create_parent_run(tracking_uri=ctx.tracking_uri, experiment=ctx.experiment,
                                        run_name=f"pipeline-{pipeline_run_id}", tags=tags,
                                        artifact_location=cfg.tracking.artifact_location)
    MlflowClient(ctx.tracking_uri).log_text(parent, dump_config(protocol.redacted(ctx.cfg)), "config.yaml")
    return protocol.StageContext.create(ctx.cfg, run_dir=ctx.run_dir, parent_run_id=parent,
                                      pipeline_run_id=pipeline_run_id, force=force)


def unchanged_since_release(cfg: RunConfig) -> str | None:
    """Why a retrain on ``data.uri`` would release nothing new (its version of an import is the one last released for
    ``ledger.population_id``), or None: the data changed since the last release, or was never released, or is no
    version of an import (:mod:`dpsynth.data.versions`). Compares version ids only: reads no records."""
    from dpsynth.data import versions

    found = versions.version_of(cfg.data.uri)
    pid = population_id(cfg)
    if found is None or versions.last_release(found[0], pid) != found[1]:
        return None
    return (f"data.uri: version {found[1]} is the one last released for population {pid!r}: the data did not change "
            "since that release, so no run (no ε spent)")


def find_parent_run(ctx: protocol.StageContext) -> str | None:
    """The id of the parent run ``start`` opened for ``ctx.pipeline_run_id`` (found by its tags: stage "pipeline",
    the pipeline run id), None when there is none (tracking off, or ``start`` refused the run before opening it).
    For an orchestrator's exit task, which cannot take ``start``'s output (a KFP ``dsl.ExitHandler`` exit task
    depends on no task)."""
    if not (ctx.cfg.tracking.enabled and ctx.pipeline_run_id):
        return None
    from mlflow import MlflowClient

    client = MlflowClient(ctx.tracking_uri)
    exp = client.get_experiment_by_name(ctx.experiment)
    if exp is None:
        return None
    quoted = ctx.pipeline_run_id.replace("'", "\\'")
    runs = client.search_runs([exp.experiment_id], max_results=2, order_by=["attributes.start_time DESC"],
                              filter_string=f"tags.`{tracking.TAG_STAGE}` = 'pipeline' and "
                                            f"tags.`{tracking.TAG_PIPELINE_RUN_ID}` = '{quoted}'")
    if len(runs) > 1:
        log.warning("pipeline %s: %d parent runs carry its id; closing the newest", ctx.pipeline_run_id, len(runs))
    return runs[0].info.run_id if runs else None


def summary(ctx: protocol.StageContext, outcomes: dict[str, protocol.Outcome] | None = None) -> dict:
    """One row per stage — status, ε, outputs — from ``outcomes`` where given, else from the manifests."""
    rows = []
    for stage in protocol.STAGES:
        outcome = (outcomes or {}).get(stage)
        m = outcome.manifest if outcome else _manifest_or_none(ctx, stage)
        status = outcome.status if outcome else (m["status"] if m else "not run")
        rows.append({"stage": stage, "status": status,
                     "epsilon": _epsilon(m, status),
                     "outputs": len(m["outputs"]) if m else 0, "where": ctx.stage_dir(stage),
                     "mlflow_run_id": outcome.mlflow_run_id if outcome else (m or {}).get("mlflow_run_id"),
                     "error": outcome.error if outcome else None})
    audit_row = rows[protocol.STAGES.index("audit")]
    audit_status = {"succeeded": "passed", "skipped": "passed", "failed": "failed"}.get(audit_row["status"], "not run")
    return {"pipeline_run_id": ctx.pipeline_run_id, "parent_run_id": ctx.parent_run_id, "run_dir": ctx.run_dir,
            "succeeded": all(r["status"] in ("succeeded", "skipped") for r in rows),
            "epsilon_total": sum(r["epsilon"] or 0.0 for r in rows), "delta": ctx.cfg.privacy.delta, "audit": audit_status,
            "empirical": _empirical_verdict(ctx, outcomes), "stages": rows, "ledger": _ledger_summary(ctx, charging.quietly(_this_runs_reservations, ctx))}


def _empirical_verdict(ctx: protocol.StageContext, outcomes: dict | None) -> str:
    """The empirical audit's verdict as the audit manifest records it: passed | failed | inconclusive | not run."""
    outcome = (outcomes or {}).get("audit")
    m = outcome.manifest if outcome else _manifest_or_none(ctx, "audit")
    return ((m or {}).get("details") or {}).get("empirical") or "not run"


def _this_runs_reservations(ctx: protocol.StageContext) -> list[dict] | None:
    if not ctx.pipeline_run_id:
        return None
    return [r for r in charging.run_ledger(ctx).reservations(pipeline_run_id=ctx.pipeline_run_id)
            if r["population_id"] == population_id(ctx.cfg)]


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
    lines.append(f"| **total** | audit {s['audit']}, empirical audit {s.get('empirical', 'not run')} | "
                 f"**{s['epsilon_total']:.4g}** (δ = {s['delta']:g}) | |")
    if s.get("card"):
        lines.append(f"\nRelease card: {s['card']}")
    if s.get("ledger"):
        g = s["ledger"]
        lines.append(f"\nLedger: population {g['population_id']!r} charged ε={g['epsilon_charged']:.4g} for "
                     f"{g['attempts']} train attempt(s)" + (f", {g['open']} still open" if g["open"] else ""))
        lines += [f"- {note}" for note in g["notes"]]
    return "\n".join(lines)


def release_card(ctx: protocol.StageContext) -> str | None:
    """The auditor's card of this run (:mod:`dpsynth.release.card`: the release zone after a passed audit and a
    release, the sensitive zone after a refusal); its URI, None when there is none. A card that cannot be
    written is logged as an error, and the run's summary says so, but the release stands."""
    from dpsynth.release import card

    try:
        return card.write(ctx)
    except Exception as exc:  # noqa: BLE001 — the summary and the parent run must still be written
        log.error("release card: not written: %s", str(exc) or repr(exc))
        return f"not written: {exc}"


def finish(ctx: protocol.StageContext, outcomes: dict[str, protocol.Outcome] | None = None) -> dict:
    """Settle the run's ledger reservation, summarise the run into its parent MLflow run (when
    there is one) and close it."""
    s = summary(ctx, outcomes)
    s["ledger"] = _ledger_summary(ctx, settle(ctx))
    s["card"] = release_card(ctx)
    log.info("pipeline %s: %s, total ε %.4g, audit %s, empirical audit %s", ctx.pipeline_run_id,
             "succeeded" if s["succeeded"] else "failed", s["epsilon_total"], s["audit"], s["empirical"])
    if ctx.parent_run_id and ctx.cfg.tracking.enabled:
        from mlflow import MlflowClient

        client, run_id = MlflowClient(ctx.tracking_uri), ctx.parent_run_id
        metrics = {"epsilon_total": s["epsilon_total"]}
        tags = {tracking.TAG_EPSILON_SPENT: f"{s['epsilon_total']:.6g}", tracking.TAG_AUDIT: s["audit"]}
        part = _manifest_or_none(ctx, "partition")
        if part:
            tags[tracking.TAG_DATASET_SHA256] = part["dataset_sha256"]
        if s["ledger"]:
            tags[tracking.TAG_LEDGER_RESERVATION] = ",".join(map(str, s["ledger"]["reservation_ids"]))
            metrics["ledger_epsilon_charged"] = s["ledger"]["epsilon_charged"]
        tracking.log_run(MLFLOW_KEYS, metrics=metrics, tags=tags, run_id=run_id, tracking_uri=ctx.tracking_uri)
        columns = ("stage", "status", "epsilon", "outputs", "where", "mlflow_run_id")
        client.log_table(run_id, {c: [r[c] for r in s["stages"]] for c in columns}, "pipeline/stages.json")
        client.log_text(run_id, table(s) + "\n", "pipeline/stages.md")
        client.set_terminated(run_id, "FINISHED" if s["succeeded"] else "FAILED")
    return s


def run_pipeline(cfg: RunConfig, *, run_dir: str | None = None, pipeline_run_id: str | None = None,
                 force: bool = False) -> tuple[protocol.StageContext, dict]:
    """Start, run the six stages in order (stopping at the first failure), finish. Returns the summary."""
    ctx = start(cfg, run_dir=run_dir, pipeline_run_id=pipeline_run_id, force=force)
    outcomes: dict[str, protocol.Outcome] = {}
    try:
        for stage in protocol.STAGES:
            try:
                outcomes[stage] = run_stage(ctx, stage)
            except BaseException as exc:  # an unexpected error or an interrupt fails the stage too
                m = _manifest_or_none(ctx, stage)
                failed = m if m and m["status"] == "failed" and m["pipeline_run_id"] == ctx.pipeline_run_id else None
                outcomes[stage] = protocol.Outcome(stage=stage, status="failed", manifest=failed,
                                                 manifest_uri=ctx.manifest_uri(stage), error=str(exc) or repr(exc))
                if not isinstance(exc, DpsynthError):
                    raise
                break
    finally:
        for stage in protocol.STAGES:
            outcomes.setdefault(stage, protocol.Outcome(stage=stage, status="not run", manifest=None,
                                                      manifest_uri=ctx.manifest_uri(stage)))
        s = finish(ctx, outcomes)
    return ctx, s
