"""``dpsynth partition | pretrain | audit | sample | evaluate`` and ``dpsynth pipeline run | start | finish``.

``dpsynth train`` (registered by ``dpsynth.runner.train_cli``) becomes the train stage when given
``--run-dir`` (or ``pipeline.run_dir``); without, it is the plain trainer it always was.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import shlex
import sys

from dpsynth.config import RunConfig
from dpsynth.egress import let_out

HELP = {
    "partition": "validate the dataset, hold out records for evaluation, split the rest into K shards (sensitive zone)",
    "pretrain": "non-private pre-training for methods that pre-train: one discriminator per shard (GS-WGAN, "
                 "DPAC), G and D on public data (dp-GAN); a recorded no-op for DPGAN",
    "audit": "recompute ε from the mechanism trace with the RDP and PRV accountants; fail unless within target "
             "(with audit.empirical, also unless a canary audit's lower bound ε_lower stays within the accounted ε)",
    "sample": "after a passed audit: release the generator, a synthetic Parquet dataset and sample grids",
    "evaluate": "accuracy of a classifier trained on the synthetic data, tested on held-out real data",
}
_COMMON = (
    "Inputs and outputs live under --run-dir (local path or s3://): RUN_DIR/sensitive/<stage>/ or "
    "RUN_DIR/release/<stage>/, with a manifest.json (URIs, sha256, row counts, ε) written last. A stage "
    "whose manifest matches its config and inputs is skipped (--force runs it again)."
)


def add_config_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML configuration file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override one setting (repeatable)")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")


def add_stage_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", metavar="URI", help="root of the pipeline run, local or s3:// (else pipeline.run_dir)")
    p.add_argument("--parent-run-id", metavar="ID", help="MLflow parent run to nest this stage's run under")
    p.add_argument("--pipeline-run-id", metavar="ID", help="the pipeline run's id (tag dpsynth.pipeline_run_id)")
    p.add_argument("--force", action="store_true", help="run even when the manifest says it already ran "
                   "(a private stage spends its ε again)")


def register(subparsers) -> None:
    for stage, text in HELP.items():
        p = subparsers.add_parser(stage, help=text, description=f"{text[0].upper()}{text[1:]}. {_COMMON}")
        add_config_options(p)
        add_stage_options(p)
        if stage == "audit":
            p.add_argument("action", nargs="?", choices=["empirical"], metavar="empirical",
                           help="only the empirical audit (audit.empirical, quick unless full): audit runs with "
                           "canaries on public stand-ins of the training data's shape (--run-dir's partition "
                           "manifest, or --records/--image-shape/--num-classes), of the training steps and each "
                           "warm-up release; ε_lower beside the accounted ε, the verdict (passed, failed, "
                           "inconclusive); exit 2 when it failed. Writes nothing.")
            p.add_argument("--records", type=int, metavar="N", help="empirical: training records n (else the partition manifest's)")
            p.add_argument("--image-shape", metavar="HxWxC", help="empirical: image shape, e.g. 28x28x1")
            p.add_argument("--num-classes", type=int, metavar="K", help="empirical: number of classes")
        if stage == "pretrain":
            p.add_argument("--shard", type=int, metavar="K", help="pre-training shard K only (one fan-out task: "
                           "no manifest, no MLflow run); without it, run every shard not yet done and write "
                           "the stage manifest")
        p.set_defaults(func=functools.partial(run_stage_command, stage))

    pipeline = subparsers.add_parser("pipeline", help="run the six stages in order under one MLflow parent run",
                                     description="Run partition, pretrain, train, audit, sample and evaluate.")
    actions = pipeline.add_subparsers(dest="pipeline_command", required=True, metavar="ACTION")
    run = actions.add_parser("run", help="run all six stages in-process, stopping at the first failure",
                             description="Open the MLflow parent run, run the six stages in order (stopping at "
                             "the first that fails), log total ε and the per-stage table to the parent run. " + _COMMON)
    add_config_options(run)
    run.add_argument("--run-dir", metavar="URI", help="root of the pipeline run, local or s3:// (else pipeline.run_dir)")
    run.add_argument("--pipeline-run-id", metavar="ID", help="id of this pipeline run (default: a random one)")
    run.add_argument("--force", action="store_true", help="run every stage even when its manifest matches")
    run.set_defaults(func=run_pipeline_command)
    begin = actions.add_parser("start", help="open the parent run for stages run one by one; print its ids",
                               description="For orchestrators: open the MLflow parent run and print "
                               '{"parent_run_id", "pipeline_run_id", "run_dir", "train"} as JSON ("train": the train '
                               "stage's nodes, gpus_per_node, ranks and whether it is distributed).")
    add_config_options(begin)
    begin.add_argument("--run-dir", metavar="URI")
    begin.add_argument("--pipeline-run-id", metavar="ID")
    begin.add_argument("--unless-released", action="store_true",
                       help="a retrain's start: when data.uri is the version of an import last released for "
                       "ledger.population_id (its sample stage ran past a passed audit), open no run, charge nothing "
                       'and print {"skipped": why, ...}')
    begin.set_defaults(func=start_command)
    end = actions.add_parser("finish", help="summarise the stage manifests into the parent run and close it",
                             description="For orchestrators: log total ε and the per-stage table to the parent run "
                             "and close it (FINISHED, or FAILED unless every stage succeeded). Without "
                             "--parent-run-id: the parent run `start` opened for --pipeline-run-id (an exit task's "
                             "way; none found: the summary only).")
    add_config_options(end)
    add_stage_options(end)
    end.set_defaults(func=finish_command)
    show = actions.add_parser("show", help="print the per-stage table of a pipeline run from its manifests",
                              description="Read the stage manifests under --run-dir and print stage, status, "
                              "ε consumed and outputs; exit 2 unless every stage succeeded.")
    add_config_options(show)
    show.add_argument("--run-dir", metavar="URI", help="root of the pipeline run (else pipeline.run_dir)")
    show.add_argument("--pipeline-run-id", metavar="ID", help="the pipeline run id, to name its MLflow parent run")
    show.set_defaults(func=show_command)


def load_config(args) -> RunConfig:
    """The command's configuration (``--config``, ``--set``), with the method's rules
    (:func:`dpsynth.methods.registry.load_config`)."""
    from dpsynth.methods import registry

    return registry.load_config(args.config, overrides=args.overrides)


def context(args, cfg: RunConfig | None = None):
    from dpsynth.stages.protocol import StageContext

    cfg = cfg or load_config(args)
    return StageContext.create(cfg, run_dir=args.run_dir, parent_run_id=getattr(args, "parent_run_id", None) or None,
                               pipeline_run_id=getattr(args, "pipeline_run_id", None), force=getattr(args, "force", False))


def _outside_record(ctx, record: dict) -> dict:
    """A pre-training shard's record as ``--json`` prints it (an XCom on Airflow): through the egress gate
    (:data:`dpsynth.egress.SHARD`): its shard and D_k by keyed version ids (a raw hash of D_k, deterministic given
    train.seed and the shard, is a membership test), no seconds (one shard's time depends on its size)."""
    from dpsynth import egress
    from dpsynth.stages.protocol import key_of

    return egress.let_out(record, "shard", key=key_of(ctx))


def run_stage_command(stage: str, args, cfg: RunConfig | None = None) -> int:
    from dpsynth.runner.run import run_stage

    if getattr(args, "action", None) == "empirical":
        return empirical_command(args)

    if getattr(args, "shard", None) is not None:
        from dpsynth.stages import pretrain

        log = logging.getLogger(__name__)
        log.info("pretrain shard %d: started", args.shard)
        ctx = context(args, cfg)
        record = pretrain.run_shard(ctx, args.shard)
        log.info("pretrain shard %d: %s", args.shard, record.get("status") or record.get("reason") or "done")
        print(json.dumps(_outside_record(ctx, record), indent=2) if args.json else
              f"pretrain shard {args.shard}: {record.get('status', 'not performed')}"
              + (f", {record['output']['uri']}" if "output" in record else f" ({record.get('reason')})"))
        return 0
    ctx = context(args, cfg)
    return report(args, ctx, run_stage(ctx, stage))


def report(args, ctx, outcome) -> int:
    """Print a stage command's outcome (``--json``: as an orchestrator reads it); returns its exit status, 0."""
    stage, m = outcome.stage, outcome.manifest
    if args.json:  # what an orchestrator logs: no raw hash or per-shard count of the sensitive zone (#33)
        from dpsynth.stages.protocol import outside_outcome

        print(json.dumps(outside_outcome(ctx, {"stage": stage, "status": outcome.status, "manifest_uri":
                                               outcome.manifest_uri, "mlflow_run_id": outcome.mlflow_run_id,
                                               "manifest": m}), indent=2))
    else:
        print(f"{stage}: {outcome.status}, ε consumed {m['privacy']['epsilon']:.4g}, {len(m['outputs'])} outputs; "
              f"manifest {outcome.manifest_uri}")
    return 0


def empirical_command(args) -> int:
    """``dpsynth audit empirical``: one audit run with canaries; exit 2 when ε_lower > the accounted ε."""
    from dpsynth.errors import AuditFailed, ConfigError
    from dpsynth.audit import empirical
    from dpsynth.stages import protocol

    cfg = load_config(args)
    mode = cfg.audit.empirical if cfg.audit.empirical in ("quick", "full") else "quick"
    given = [args.records, args.image_shape, args.num_classes]
    if any(v is not None for v in given):
        if any(v is None for v in given):
            raise ConfigError("--records, --image-shape and --num-classes: give all three (or none, with --run-dir)")
        try:
            shape = [int(d) for d in args.image_shape.lower().split("x")]
            assert len(shape) == 3 and min(shape) >= 1
        except (ValueError, AssertionError):
            raise ConfigError(f"--image-shape: expected HxWxC, e.g. 28x28x1, got {args.image_shape!r}") from None
        if args.records < 1 or args.num_classes < 2:
            raise ConfigError("--records must be >= 1 and --num-classes >= 2")
        n, classes = args.records, args.num_classes
    else:
        if not (args.run_dir or cfg.pipeline.run_dir):
            raise ConfigError("--run-dir: needed to read the partition manifest (or give --records, --image-shape "
                              "and --num-classes)")
        partition, _ = protocol.upstream(context(args, cfg), "partition")
        n, shape, classes = empirical.stand_in_shape(partition)
    result = empirical.audit_all(cfg, n=n, image_shape=shape, num_classes=classes, mode=mode)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"empirical audit of {cfg.train.method} ({mode}; public stand-ins, no privacy spent): "
              f"{result['verdict'].upper()}, ε_lower = {result['epsilon_lower']:.4g} at {result['confidence']:.0%} "
              f"confidence; {result['cpu_seconds']:.1f} CPU-s")
        for part in result["components"]:
            print(f"  {part['name']}: {part['verdict']}, ε_lower = {part['epsilon_lower']:.4g} vs accounted ε = "
                  f"{part['accounted_epsilon']:.4g} ({part['accountant']})")
            for a in part.get("attacks", ()):
                print(f"    {a['name']}: ε_lower = {a['epsilon_lower']:.4g} (m = {a['canaries']}, {a['correct']}/"
                      f"{a['guesses']} correct; {a['attack']})")
            print(f"    {part['check']['detail']}")
    if result["verdict"] == "failed":
        raise AuditFailed("; ".join(c["detail"] for c in result["checks"] if c["passed"] is False))
    return 0


def run_pipeline_command(args) -> int:
    from dpsynth.errors import StageError
    from dpsynth.runner.run import run_pipeline, table

    cfg = load_config(args)
    ctx, s = run_pipeline(cfg, run_dir=args.run_dir, pipeline_run_id=args.pipeline_run_id, force=args.force)
    if args.json:
        print(json.dumps(let_out(s, "summary"), indent=2))
    else:
        print(table(s))
        print(_where(ctx))
    failed = next((r for r in s["stages"] if r["status"] == "failed"), None)
    if failed:
        raise StageError(f"stage {failed['stage']} failed: {failed['error']}")
    return 0


def start_command(args) -> int:
    from dpsynth.runner.run import start, unchanged_since_release

    from dpsynth.distributed.launch import shape

    cfg = load_config(args)
    if args.unless_released and (why := unchanged_since_release(cfg)):
        print(json.dumps(let_out({"skipped": why, "parent_run_id": None, "pipeline_run_id": args.pipeline_run_id,
                                  "run_dir": args.run_dir, "train": shape(cfg)}, "start")))
        return 0
    ctx = start(cfg, run_dir=args.run_dir, pipeline_run_id=args.pipeline_run_id)
    # "train": where the train stage runs (the orchestrators launch it on several ranks when "distributed")
    print(json.dumps(let_out({"parent_run_id": ctx.parent_run_id, "pipeline_run_id": ctx.pipeline_run_id,
                              "run_dir": ctx.run_dir, "train": shape(ctx.cfg)}, "start")))
    return 0


def finish_command(args) -> int:
    from dpsynth.runner.run import finish, table

    import dataclasses

    from dpsynth.runner.run import find_parent_run

    ctx = context(args)
    if not ctx.parent_run_id:  # an exit task (KFP ExitHandler) has no upstream output: find start's parent run
        ctx = dataclasses.replace(ctx, parent_run_id=find_parent_run(ctx))
    s = finish(ctx)
    print(json.dumps(let_out(s, "summary"), indent=2) if args.json else table(s) + "\n" + _where(ctx))
    return 0


def show_command(args) -> int:
    from dpsynth.runner.run import summary, table

    ctx = context(args)
    s = summary(ctx)
    if args.json:
        print(json.dumps(let_out(s, "summary"), indent=2))
    else:
        print(table(s))
        if ctx.cfg.tracking.enabled:
            print(f"MLflow: experiment {ctx.experiment!r} at {ctx.tracking_uri}, parent run "
                  f"pipeline-{ctx.pipeline_run_id}\n  open it: {mlflow_ui(ctx.tracking_uri)}")
    return 0 if s["succeeded"] else 2


def _where(ctx) -> str:
    if not (ctx.parent_run_id and ctx.cfg.tracking.enabled):
        return f"run directory: {ctx.run_dir} (MLflow tracking is off)"
    return (f"MLflow: parent run {ctx.parent_run_id} in experiment {ctx.experiment!r} at {ctx.tracking_uri}\n"
            f"  open it: {mlflow_ui(ctx.tracking_uri)}  (then the experiment, run "
            f"pipeline-{ctx.pipeline_run_id})")


def mlflow_ui(tracking_uri: str) -> str:
    """The command that opens the MLflow UI on ``tracking_uri``, runnable as printed (this interpreter,
    by its absolute path: nothing needs to be on PATH or activated)."""
    return shlex.join([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking_uri, "--port", "5000"])
