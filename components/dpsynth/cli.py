"""The ``dpsynth`` command line. Each concept registers its own sub-commands here."""

from __future__ import annotations

import argparse
import sys

from dpsynth.errors import DpsynthError


def build_parser() -> argparse.ArgumentParser:
    from dpsynth.data import cli as data_cli
    from dpsynth.privacy import cli as privacy_cli
    from dpsynth.privacy import ledger_cli
    from dpsynth.methods import cli as train_cli
    from dpsynth.stages import cli as stages_cli

    parser = argparse.ArgumentParser(
        prog="dpsynth",
        description="Train differentially private GANs and release generators with an auditable (ε, δ).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    data_cli.register(sub)
    privacy_cli.register(sub)
    ledger_cli.register(sub)
    train_cli.register(sub)
    stages_cli.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except DpsynthError as exc:
        print(f"dpsynth: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
