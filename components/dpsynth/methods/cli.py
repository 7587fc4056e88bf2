"""``dpsynth train``: run a training method on a dataset under an (ε, δ) budget."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from dpsynth.config import load_config
from dpsynth.errors import DatasetError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a DP GAN (DPGAN of 'Private GANs, Revisited') and print the ε spent",
        description=(
            "Train a differentially private GAN. Settings come from --config (YAML with sections "
            "data, privacy, train, output, tracking) and --set overrides, e.g. "
            "--set privacy.epsilon=10 --set train.steps=2000. Without privacy.noise_multiplier the "
            "noise is calibrated so that train.steps spend at most privacy.epsilon; with it, training "
            "stops before the step that would exceed privacy.epsilon. A run resumes from the last "
            "checkpoint in output.dir."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--config", help="YAML configuration file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override one setting (repeatable)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run_train)


def load_training_data(cfg):
    from dpsynth.data import import_source, validate

    ds = import_source(cfg.data.uri)
    if cfg.data.train_split is not None:
        if ds.splits is None:
            raise DatasetError(f"data.train_split: {cfg.data.uri} has no split column")
        ds = ds.subset([s == cfg.data.train_split for s in ds.splits])
    validate(ds, num_classes=cfg.data.num_classes)
    return ds


def run_train(args) -> int:
    from dpsynth.methods.dpgan import DPGANTrainer

    cfg = load_config(args.config, overrides=args.overrides)
    result = DPGANTrainer(cfg, load_training_data(cfg)).train()
    if args.json:
        print(json.dumps(asdict(result), indent=2))
    else:
        print(
            f"trained {result.steps} private discriminator steps ({result.generator_steps} generator steps) "
            f"in {result.seconds:.0f} s\n"
            f"  ε = {result.epsilon:.4f}  δ = {result.delta:g}  accountant = {result.accountant} "
            f"(noise multiplier {result.noise_multiplier:.4f}, sample rate {result.sample_rate:.5f}, "
            f"stopped by {result.stopped_by})\n"
            f"  generator: {result.generator_path}\n  samples:   {result.grid_path}\n"
            f"  trace:     {result.trace_path}\n  MLflow run: {result.mlflow_run_id}"
        )
    return 0
