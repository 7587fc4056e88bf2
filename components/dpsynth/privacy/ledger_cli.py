"""``dpsynth ledger show | set-budget | history``: the lifetime privacy-budget ledger."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any, Sequence

from dpsynth import commands

if TYPE_CHECKING:  # SQLAlchemy: only when a command runs
    from dpsynth.privacy.ledger import Ledger

ENV_URL = "DPSYNTH_LEDGER_URL"


def register(subparsers) -> None:
    ledger = subparsers.add_parser(
        "ledger",
        help="show and set each dataset's lifetime privacy budget",
        description="The lifetime (ε, δ) budget of each population (a dataset across its versions), "
        "what pipeline runs have committed and reserved against it, and the history of every charge. "
        "Runs compose by the basic composition theorem: their ε's and δ's add up.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db", metavar="URL",
        help=f"SQLAlchemy URL of the ledger (default: ${ENV_URL}, else the SQLite file outputs/ledger.db, "
        "where `make run` keeps it)",
    )
    common.add_argument("--json", action="store_true", help="print as JSON")
    actions = ledger.add_subparsers(dest="ledger_command", required=True, metavar="ACTION")

    show = actions.add_parser(
        "show", parents=[common], help="budget, committed, reserved and remaining ε",
        description="Show the balance of POPULATION, or of every population.",
    )
    show.add_argument("population", nargs="?", metavar="POPULATION", help="one population id (default: all)")
    show.set_defaults(func=run_show)

    budget = actions.add_parser(
        "set-budget", parents=[common], help="create a population or change its lifetime budget",
        description="Set the lifetime (ε, δ) budget of POPULATION, creating it if new. "
        "A budget below what is already committed + reserved is refused.",
    )
    budget.add_argument("population", metavar="POPULATION", help="population id")
    budget.add_argument("--epsilon", required=True, type=float, metavar="E", help="lifetime ε (> 0)")
    budget.add_argument("--delta", required=True, type=float, metavar="D", help="lifetime δ, in (0, 1)")
    budget.set_defaults(func=run_set_budget)

    history = actions.add_parser(
        "history", parents=[common], help="every reservation, commit and release",
        description="List every charge to POPULATION (or to all populations), oldest first.",
    )
    history.add_argument("population", nargs="?", metavar="POPULATION", help="one population id (default: all)")
    history.set_defaults(func=run_history)


def open_ledger(args: argparse.Namespace) -> Ledger:
    from dpsynth.privacy.ledger import DEFAULT_URL, Ledger

    return Ledger(args.db or os.environ.get(ENV_URL) or DEFAULT_URL)


def run_show(args: argparse.Namespace) -> int:
    ledger = open_ledger(args)
    rows = [ledger.balance(args.population)] if args.population else ledger.populations()
    if args.json:
        print(json.dumps(rows if not args.population else rows[0]))
    elif not rows:
        print(f"no populations yet; add one with `{commands.dpsynth('ledger', 'set-budget', 'POPULATION --epsilon E --delta D')}`")
    else:
        print(_table(rows, ["population_id", "budget", "committed", "reserved", "remaining", "delta", "delta_used"]))
    return 0


def run_set_budget(args: argparse.Namespace) -> int:
    balance = open_ledger(args).set_budget(args.population, epsilon=args.epsilon, delta=args.delta)
    if args.json:
        print(json.dumps(balance))
    else:
        print(f"population {balance['population_id']}: lifetime budget ε={_fmt(balance['budget'])}, "
              f"δ={_fmt(balance['delta'])}; committed {_fmt(balance['committed'])}, "
              f"reserved {_fmt(balance['reserved'])}, remaining {_fmt(balance['remaining'])}")
    return 0


def run_history(args: argparse.Namespace) -> int:
    rows = open_ledger(args).history(args.population)
    if args.json:
        print(json.dumps(rows))
    elif not rows:
        print("no reservations yet")
    else:
        for row in rows:
            row["dataset_sha256"] = row["dataset_sha256"][:12]
            row["created_at"] = row["created_at"][:19]
            row["closed_at"] = row["closed_at"] and row["closed_at"][:19]
        print(_table(rows, ["id", "population_id", "pipeline_run_id", "stage", "status", "epsilon_reserved",
                            "epsilon_spent", "delta", "accountant", "dataset_sha256", "created_at",
                            "closed_at", "note"]))
    return 0


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    cells = [[_fmt(row.get(col)) for col in columns] for row in rows]
    widths = [max(len(col), *(len(r[i]) for r in cells)) for i, col in enumerate(columns)]
    lines = [columns, ["-" * w for w in widths], *cells]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
