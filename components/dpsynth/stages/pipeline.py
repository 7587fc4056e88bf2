"""``dpsynth pipeline``: the six stages in order, under one MLflow parent run.

``start`` opens the parent run (left RUNNING, so stages in other processes or pods can nest
under it: an orchestrator passes its id to each stage as ``--parent-run-id``), ``finish``
summarises the stage manifests into it — total ε as metric and tag, the per-stage table as an
artifact — and closes it. ``run_pipeline`` does all three in-process, stopping at the first
stage that fails.

The ε column is the ε the stage's outputs consumed (a skipped stage reuses outputs made earlier:
their ε, no new spending; a failed stage shows "?", since a private one may have spent some
before failing); the total is their sum, the ε of what this pipeline run releases.
"""

from __future__ import annotations

import uuid

from dpsynth import storage, tracking
from dpsynth.config import RunConfig, dump_config
from dpsynth.errors import DpsynthError
from dpsynth.stages import audit, common, evaluate, manifest, partition, sample, train, warmstart

MODULES = {m.STAGE: m for m in (partition, warmstart, train, audit, sample, evaluate)}
assert tuple(MODULES) == common.STAGES


def run_stage(ctx: common.StageContext, stage: str) -> common.Outcome:
    return MODULES[stage].run(ctx)


def start(cfg: RunConfig, *, run_dir: str | None = None, pipeline_run_id: str | None = None,
          force: bool = False) -> common.StageContext:
    """A context for the stages of a new pipeline run, with its parent run open when tracking is on."""
    pipeline_run_id = pipeline_run_id or uuid.uuid4().hex[:12]
    ctx = common.StageContext.create(cfg, run_dir=run_dir, pipeline_run_id=pipeline_run_id, force=force)
    if not cfg.tracking.enabled:
        return ctx
    from mlflow import MlflowClient

    tags = {**ctx.run_tags(), tracking.TAG_ACCOUNTANT: cfg.privacy.accountant, "dpsynth.run_dir": ctx.run_dir}
    parent = tracking.create_parent_run(tracking_uri=ctx.tracking_uri, experiment=ctx.experiment,
                                        run_name=f"pipeline-{pipeline_run_id}", tags=tags)
    MlflowClient(ctx.tracking_uri).log_text(parent, dump_config(common.redacted(ctx.cfg)), "config.yaml")
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
            "stages": rows}


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
    return "\n".join(lines)


def finish(ctx: common.StageContext, outcomes: dict[str, common.Outcome] | None = None) -> dict:
    """Summarise the run into its parent MLflow run (when there is one) and close it."""
    s = summary(ctx, outcomes)
    if ctx.parent_run_id and ctx.cfg.tracking.enabled:
        from mlflow import MlflowClient

        client, run_id = MlflowClient(ctx.tracking_uri), ctx.parent_run_id
        client.log_metric(run_id, "epsilon_total", s["epsilon_total"])
        tags = {tracking.TAG_EPSILON_SPENT: f"{s['epsilon_total']:.6g}", tracking.TAG_AUDIT: s["audit"]}
        part = _manifest_or_none(ctx, "partition")
        if part:
            tags[tracking.TAG_DATASET_SHA256] = part["dataset_sha256"]
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
            except DpsynthError as exc:
                m = _manifest_or_none(ctx, stage)
                failed = m if m and m["status"] == "failed" and m["pipeline_run_id"] == ctx.pipeline_run_id else None
                outcomes[stage] = common.Outcome(stage=stage, status="failed", manifest=failed,
                                                 manifest_uri=ctx.manifest_uri(stage), error=str(exc))
                break
    finally:
        for stage in common.STAGES:
            outcomes.setdefault(stage, common.Outcome(stage=stage, status="not run", manifest=None,
                                                      manifest_uri=ctx.manifest_uri(stage)))
        s = finish(ctx, outcomes)
    return ctx, s
