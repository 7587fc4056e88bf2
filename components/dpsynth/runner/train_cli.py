"""``dpsynth train``: run a training method on a dataset under an (ε, δ) budget."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from dpsynth import config
from dpsynth.runner import cli as stage_cli

# train.method -> one line for `dpsynth --help` and `dpsynth train --help`: the configuration's names (the method
# registry imports every trainer, and --help imports no torch), and auto (its rule: registry.for_schema)
METHODS = {**config.METHODS,
           "auto": "picked from the data's public schema before anything private runs: colour (3 channels) "
                   "private-evolution, else dpgan"}


def methods_text() -> str:
    return "training methods (--set train.method=NAME):\n" + "\n".join(
        f"  {name:<17} {text}" for name, text in METHODS.items())


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a DP GAN with the chosen method (train.method, default dpgan) and print the ε spent",
        description=(
            "Train a differentially private GAN. Settings come from --config (YAML with sections "
            "data, privacy, train, output, tracking, …) and --set overrides, e.g. "
            "--set privacy.epsilon=10 --set train.steps=2000; `dpsynth config show` prints the result. "
            "Without privacy.noise_multiplier the noise is calibrated so that train.steps spend at most "
            "privacy.epsilon; with it, training stops before the step that would exceed privacy.epsilon. "
            "Without --run-dir only dpgan trains on its own (outputs in output.dir; a run resumes from the "
            "last checkpoint there). Every attempt is charged to ledger.population_id's lifetime budget in the "
            "ledger (ledger.url, else $DPSYNTH_LEDGER_URL, else outputs/ledger.db; see `dpsynth ledger --help`). With --run-dir (or pipeline.run_dir) it is the pipeline's train stage, "
            "for every method: it trains on the shards of RUN_DIR/sensitive/partition and writes "
            "RUN_DIR/sensitive/train (output.dir is not used) with a manifest and an MLflow child run. Under "
            "torchrun (`torchrun --nproc-per-node N -m dpsynth train ...`) dpgan and zhang train data-parallel "
            "and gswgan and dpac spread their shards over the ranks, with or without --run-dir: rank 0 alone is "
            "charged and writes (docs/distributed.md). gswgan_federated always runs as a torchrun job of K + 1 ranks "
            "(server, K clients): --run-dir in one process starts it."
        ),
        epilog=methods_text(),
        formatter_class=_Formatter,
    )
    p.add_argument("--config", help="YAML configuration file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override one setting (repeatable)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    stage_cli.add_stage_options(p)
    p.add_argument("--launch", choices=("torchrun", "trainjob"),
                   help="start the train stage (--run-dir) on train.nodes × train.gpus_per_node ranks and wait for it: "
                        "torchrun on this machine, or a Kubeflow TrainJob or PyTorchJob (the chart's template, "
                        "$DPSYNTH_TRAINJOB_TEMPLATE) on Kubernetes; what the orchestrators run when it exceeds 1")
    p.set_defaults(func=run_train)


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in the option help; the method list (epilog) kept one line per method."""

    def _fill_text(self, text, width, indent):  # the description is a paragraph, the epilog a table
        return text if "\n" in text else argparse.HelpFormatter._fill_text(self, text, width, indent)


def run_train(args) -> int:
    from dpsynth.methods import registry
    from dpsynth.stages.protocol import resolve_method

    # train.method auto: picked from the data's public schema before anything else reads it
    cfg = registry.load_config(args.config, overrides=args.overrides)
    cfg = resolve_method(cfg, args.run_dir or cfg.pipeline.run_dir)
    if args.launch:  # the stage on several ranks, started and waited for (dpsynth.distributed.launch)
        from dpsynth.distributed import launch
        from dpsynth.stages import train as train_stage

        return launch.run(args.launch, cfg, args, methods=registry.data_parallel_methods(),
                          federated=registry.get(cfg.train.method).federated,
                          report=lambda job: train_stage.launched(stage_cli.context(args, cfg), job, as_json=args.json))
    from dpsynth.distributed import data_parallel
    from dpsynth.training.result import resolve_device

    method = registry.get(cfg.train.method)
    if method.federated:  # its server and K clients are the job's ranks (dpsynth.distributed.federation)
        from dpsynth.distributed import federation

        ranks = federation.launch(cfg)
    else:  # under torchrun: join the job
        ranks = data_parallel.launch(cfg, registry.data_parallel_methods(), resolve_device(cfg.train.device),
                                     sharded=method.pretrain == "shard")
    code = None
    try:
        if not (args.run_dir or cfg.pipeline.run_dir):
            code = _standalone(args, cfg, ranks)
            return code
        from dpsynth.runner.run import stage_run
        from dpsynth.stages import train as train_stage

        ctx = stage_cli.context(args, cfg)
        if not ranks.is_main:  # torchrun's other ranks: rank 0 is the stage (ledger, MLflow, outputs, manifest)
            train_stage.follow(ctx)
            code = 0
            return code
        with stage_run(ctx, "train") as done:  # the stage's lineage in the environment, its start and end logged
            done.outcome = train_stage.run(ctx)  # the walk to a D step: docs/architecture.md
        code = stage_cli.report(args, ctx, done.outcome)
        return code
    finally:
        data_parallel.shutdown(barrier=code == 0)  # every rank leaves together when all succeeded


def _standalone(args, cfg, ranks) -> int:
    """``dpsynth train`` without a run directory: dpgan on ``data.uri``, its outputs in ``output.dir``."""
    from dpsynth.methods import registry

    method = registry.standalone_or_refuse(cfg.train.method)  # ConfigError (exit 2) names the command to use
    import secrets
    from pathlib import Path

    from dpsynth.ledger import charging
    from dpsynth.stages.partition import load_source
    from dpsynth.training import loop

    charging.population_id(cfg)  # ConfigError before the data is read
    dataset = load_source(cfg)
    if not ranks.is_main:  # torchrun's other ranks: rank 0 alone holds the ledger attempt and writes the outputs
        loop.train(method.trainer(cfg, dataset))
        return 0
    ledger = charging.open_ledger(charging.ledger_url(cfg, run_dir=None, tracking_uri=None))
    out = Path(cfg.output.dir).resolve()
    # the attempt is charged like the train stage's; re-runs in one output.dir are one "run" of the ledger
    with charging.attempt(cfg, ledger=ledger,
                          dataset_version=secrets.token_hex(32),  # a random version id: no content hash leaves the data
                          pipeline_run_id=f"train:{out}"[-200:], records=len(dataset), workdir=str(out),
                          content_sha256=dataset.content_sha256()) as charge:
        charge.result = loop.train(charge.admit(method.trainer(cfg, dataset)))
    result = charge.result
    if args.json:
        print(json.dumps(asdict(result), indent=2))
    else:
        print(
            f"{method.name}: trained {result.steps} private steps ({result.generator_steps} generator steps) "
            f"in {result.seconds:.0f} s\n"
            f"  ε = {result.epsilon:.4f}  δ = {result.delta:g}  accountant = {result.accountant} "
            f"(noise multiplier {result.noise_multiplier:.4f}, sample rate {result.sample_rate:.5f}, "
            f"stopped by {result.stopped_by})\n"
            f"  generator: {result.generator_path}\n  samples:   {result.grid_path}\n"
            f"  trace:     {result.trace_path}\n  MLflow run: {result.mlflow_run_id}"
        )
    return 0
