"""The ``dpsynth`` command line. Each concept registers its own sub-commands here.

Building the parser must stay cheap (``dpsynth --help`` in well under a second): the modules that
register sub-commands import only the standard library, PyYAML and ``dpsynth.config`` at the top,
and import torch, Opacus, MLflow, pyarrow or NumPy inside the functions that run a command
(``tests/test_cli.py`` checks that ``--help`` imports none of them).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from dpsynth import __version__, log, termination, threads
from dpsynth.errors import DpsynthError


RENAMED_COMMANDS = {"warmstart": "pretrain"}  # an old command name: refused with the new one (#53)
QUIET_COMMANDS = {"config", "ledger", "privacy", "release"}  # they compute little: their thread count is not logged


def build_parser() -> argparse.ArgumentParser:
    from dpsynth.data import cli as data_cli
    from dpsynth.runner import train_cli
    from dpsynth.privacy import cli as privacy_cli
    from dpsynth.ledger import cli as ledger_cli
    from dpsynth.runner import cli as stages_cli
    from dpsynth.release import cli as release_cli

    parser = argparse.ArgumentParser(
        prog="dpsynth",
        description="Train differentially private GANs on sensitive images and release generators and\n"
        "synthetic data with an (ε, δ) guarantee an auditor can recompute.",
        epilog=train_cli.methods_text() + "\n\nRun `dpsynth COMMAND --help` for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dpsynth {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more messages on stderr (debug); messages never go to stdout")
    parser.add_argument("-q", "--quiet", action="count", default=0,
                        help="fewer messages: -q warnings and errors, no progress bars; -qq errors only")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    data_cli.register(sub)
    privacy_cli.register(sub)
    ledger_cli.register(sub)
    train_cli.register(sub)
    stages_cli.register(sub)
    release_cli.register(sub)
    _register_config(sub)
    return parser


def _register_config(subparsers) -> None:
    from dpsynth.runner.cli import add_config_options

    config = subparsers.add_parser("config", help="print the resolved configuration",
                                   description="Show the settings a command given the same --config and --set "
                                   "would run with: every section, defaults filled in, validated.")
    actions = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    show = actions.add_parser("show", help="print the resolved configuration as YAML (or JSON)",
                              description="Load --config, apply the --set overrides, validate, and print the "
                              "result as YAML (with --json, as JSON). The partition key is shown as a digest.")
    add_config_options(show)
    show.set_defaults(func=run_config_show)
    schema = actions.add_parser("schema", help="print the JSON Schema of a config file (every setting)",
                                description="Print the JSON Schema (2020-12) of a config file: every section and "
                                "setting with its type, bounds, default and description. The Airflow trigger form, "
                                "the chart's values.schema.json and the KFP pipeline's inputs are built from it "
                                "(scripts/config_schema.py writes the copies the repository keeps).")
    schema.set_defaults(func=run_config_schema)


def run_config_show(args: argparse.Namespace) -> int:
    from dpsynth.config import dump_config
    from dpsynth.methods.registry import load_config
    from dpsynth.stages.protocol import redacted

    cfg = redacted(load_config(args.config, overrides=args.overrides))
    if args.json:
        print(json.dumps(cfg.to_dict(), indent=2))
    else:
        print(dump_config(cfg), end="")
    return 0


def run_config_schema(args: argparse.Namespace) -> int:
    from dpsynth.config import json_schema

    print(json.dumps(json_schema(), indent=2, ensure_ascii=False))
    return 0


def refuse_ranks(command: str) -> None:
    """Under torchrun (``WORLD_SIZE`` > 1) only ``dpsynth train`` runs: every other command would run once per
    rank, each writing the same outputs (and a pipeline run would charge the ledger once per rank)."""
    import os

    if command == "train" or "WORLD_SIZE" not in os.environ:  # torch is imported only under a launcher
        return
    from dpsynth.distributed.ranks import env_ranks

    ranks = env_ranks()
    if ranks.distributed:
        raise DpsynthError(f"{command}: runs in one process, but this is one rank of a torchrun job "
                           f"(WORLD_SIZE={ranks.world_size}); only `dpsynth train` runs under torchrun "
                           f"(`dpsynth train --launch torchrun` starts it from a pipeline run's train stage)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    command = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    if command in RENAMED_COMMANDS:
        print(f"dpsynth: error: COMMAND: `dpsynth {command}` is now `dpsynth {RENAMED_COMMANDS[command]}`",
              file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    log.configure(args.verbose - args.quiet)
    try:
        threads.configure(announce=args.command not in QUIET_COMMANDS)  # before torch or a BLAS starts its threads
        termination.install()  # SIGTERM ends an attempt cleanly: checkpointed, charged, its reservation closed
        refuse_ranks(args.command)
        return int(args.func(args) or 0)
    except DpsynthError as exc:
        logging.getLogger("dpsynth").debug("failed", exc_info=True)
        print(f"dpsynth: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
