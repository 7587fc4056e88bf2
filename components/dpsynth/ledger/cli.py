"""``dpsynth ledger show | set-budget | history | settle | forecast | grant-roles``: the lifetime privacy-budget
ledger."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any, Sequence

from dpsynth import commands

if TYPE_CHECKING:  # SQLAlchemy: only when a command runs
    from dpsynth.ledger.store import Ledger

ENV_URL = "DPSYNTH_LEDGER_URL"
STAGE_PASSWORD, AUDITOR_PASSWORD = "DPSYNTH_LEDGER_STAGE_PASSWORD", "DPSYNTH_LEDGER_AUDITOR_PASSWORD"


def register(subparsers) -> None:
    ledger = subparsers.add_parser(
        "ledger",
        help="show and set each dataset's lifetime privacy budget",
        description="The lifetime (ε, δ) budget of each population (a dataset across its versions), "
        "what training attempts have committed and reserved against it, the history of every charge and "
        "of every budget change. Attempts compose by the basic composition theorem: their ε's and δ's add "
        "up. A population has no budget until an operator sets one.",
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
        description="Set the lifetime (ε, δ) budget of POPULATION, creating it if new; the change, who made "
        "it and why go into its budget history. A budget below what is already committed + reserved is "
        "refused, and so is a δ ≥ 1/n (checked here with --records, and by every attempt).",
    )
    budget.add_argument("population", metavar="POPULATION", help="population id")
    budget.add_argument("--epsilon", required=True, type=float, metavar="E", help="lifetime ε (> 0)")
    budget.add_argument("--delta", required=True, type=float, metavar="D", help="lifetime δ, in (0, 1), < 1/n")
    budget.add_argument("--reason", required=True, metavar="TEXT", help="why (kept in the budget history)")
    budget.add_argument("--records", type=int, metavar="N", help="the dataset's records: refuse δ >= 1/N now")
    budget.add_argument("--allow-shared-data", metavar="REASON",
                        help="let POPULATION be charged for records already charged to another population (a new "
                        "id for the same data is refused otherwise: it would start a fresh budget); REASON is kept")
    budget.add_argument("--if-new", action="store_true",
                        help="only create the population: leave an existing one's budget as it is")
    budget.set_defaults(func=run_set_budget)

    settle = actions.add_parser(
        "settle", parents=[common], help="charge a stale open reservation in full",
        description="Close the open reservation ID, whose attempt died without closing it, at its whole "
        "reserved ε (it may have run up to it); REASON is recorded. Attempts also settle stale reservations "
        "themselves: see docs/operations.md.",
    )
    settle.add_argument("reservation", type=int, metavar="ID", help="reservation id (`dpsynth ledger history`)")
    settle.add_argument("--reason", required=True, metavar="TEXT", help="why it is stale (recorded)")
    settle.set_defaults(func=run_settle)

    roles = actions.add_parser(
        "grant-roles", parents=[common], help="a PostgreSQL role per zone: stages reserve and commit, auditors read",
        description="As the ledger database's owner (the platform's role, which sets budgets): create its tables, "
        "then create or update the stage pods' role (may reserve and commit, not set a budget) and the auditors' "
        "role (reads only), with their passwords from $" + STAGE_PASSWORD + " and $" + AUDITOR_PASSWORD
        + ". Re-running resets their grants and passwords. The chart runs it at every install and upgrade.",
    )
    roles.add_argument("--stage-role", required=True, metavar="NAME", help="the stage pods' database role")
    roles.add_argument("--auditor-role", required=True, metavar="NAME", help="the ledger page's database role")
    roles.set_defaults(func=run_grant_roles)

    forecast = actions.add_parser(
        "forecast", parents=[common], help="what scheduled retrains each privacy block can still fund",
        description="Play the retraining schedule of a configuration forward on POPULATION's privacy blocks (the "
        "imports of its data.uri, docs/privacy.md \"Privacy blocks\"): the blocks the next run reads and what it "
        "charges each, and per block how many more runs it funds and after which it retires, each run after the "
        "next following one more import. Refuses (exit 2, naming the block) a schedule that would over-spend the "
        "newest block. Reads the ledger and the blocks' arrivals only, never the records.",
    )
    forecast.add_argument("population", metavar="POPULATION", help="population id")
    forecast.add_argument("--config", metavar="FILE", help="the retrain's YAML configuration (privacy.epsilon, "
                          "privacy.delta, ledger.window, data.uri)")
    forecast.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                          help="override one setting (repeatable)")
    forecast.set_defaults(func=run_forecast)

    history = actions.add_parser(
        "history", parents=[common], help="every reservation, commit and release, and every budget change",
        description="List every charge to POPULATION (or to all populations), then every change of its "
        "budget, oldest first.",
    )
    history.add_argument("population", nargs="?", metavar="POPULATION", help="one population id (default: all)")
    history.set_defaults(func=run_history)


def open_ledger(args: argparse.Namespace) -> Ledger:
    from dpsynth.ledger.store import DEFAULT_URL, Ledger

    return Ledger(args.db or os.environ.get(ENV_URL) or DEFAULT_URL)


def run_show(args: argparse.Namespace) -> int:
    ledger = open_ledger(args)
    rows = [ledger.balance(args.population)] if args.population else ledger.populations()
    if args.json:
        print(_json(rows[0], "balance") if args.population else _json(rows, "populations"))
    elif not rows:
        print(f"no populations yet; add one with `{commands.dpsynth('ledger', 'set-budget', 'POPULATION --epsilon E --delta D')}`")
    else:
        print(_table(rows, ["population_id", "budget", "committed", "reserved", "remaining", "delta", "delta_used"]))
        for row in rows:  # privacy blocks (#54): the line above is the most charged block's
            if [b["block"] for b in row["blocks"]] not in ([], [0]):
                print(f"\npopulation {row['population_id']}, per privacy block (each with the budget above):")
                print(_table(row["blocks"], ["block", "committed", "reserved", "remaining", "delta_used"]))
    return 0


def run_set_budget(args: argparse.Namespace) -> int:
    ledger = open_ledger(args)
    known = {p["population_id"]: p for p in ledger.populations()}
    if args.if_new and args.population.strip() in known:
        balance = known[args.population.strip()]
        if not args.json:
            print(f"population {balance['population_id']} exists: its budget stays ε={_fmt(balance['budget'])}, "
                  f"δ={_fmt(balance['delta'])} (remaining ε {_fmt(balance['remaining'])}); to raise it: "
                  f"{commands.dpsynth('ledger', 'set-budget', balance['population_id'], '--epsilon E --delta D --reason TEXT')}")
    else:
        balance = ledger.set_budget(args.population, epsilon=args.epsilon, delta=args.delta, reason=args.reason,
                                    records=args.records, allow_shared_data=args.allow_shared_data)
    if args.json:
        print(_json(balance, "balance"))
    elif not (args.if_new and args.population.strip() in known):
        print(f"population {balance['population_id']}: lifetime budget ε={_fmt(balance['budget'])}, "
              f"δ={_fmt(balance['delta'])}; committed {_fmt(balance['committed'])}, "
              f"reserved {_fmt(balance['reserved'])}, remaining {_fmt(balance['remaining'])}")
    return 0


def run_settle(args: argparse.Namespace) -> int:
    row = open_ledger(args).settle(args.reservation, reason=args.reason)
    if args.json:
        print(_json(row, "reservation"))
    else:
        print(f"reservation {row['id']} (population {row['population_id']}): committed at its whole "
              f"ε={_fmt(row['epsilon_spent'])}; {row['note']}")
    return 0


def run_forecast(args: argparse.Namespace) -> int:
    from dpsynth.config import load_config
    from dpsynth.data import blocks
    from dpsynth.ledger.schedule import forecast
    from dpsynth.ledger.store import DEFAULT_URL, Ledger

    cfg = load_config(args.config, overrides=args.overrides)
    ledger = Ledger(args.db or cfg.ledger.url or os.environ.get(ENV_URL) or DEFAULT_URL)
    arrivals = (blocks.arrivals(cfg.data.uri) if cfg.data.uri else None) or [{"block": 0}]
    plan = forecast(ledger.balance(args.population), [b["block"] for b in arrivals], epsilon=cfg.privacy.epsilon,
                    delta=cfg.privacy.delta, last=cfg.ledger.window)
    when = {b["block"]: b.get("arrived_at") for b in arrivals}
    for row in plan["blocks"]:
        row["arrived_at"] = when[row["block"]]
    if args.json:
        print(_json(plan, "forecast"))
        return 0
    nxt = plan["next"]
    print(f"population {plan['population_id']}: each block's lifetime budget ε={_fmt(plan['block_budget']['epsilon'])}, "
          f"δ={_fmt(plan['block_budget']['delta'])}; a run charges ε={_fmt(plan['epsilon'])}, δ={_fmt(plan['delta'])} "
          f"to each block it reads, the last {plan['window'] or 'every'} block(s) with budget left")
    print(f"next run reads blocks {', '.join(map(str, nxt['blocks']))}"
          + "".join(f"; leaves out block {b} ({why})" for b, why in nxt["left_out"].items()))
    print(_table(plan["blocks"], ["block", "arrived_at", "epsilon_left", "delta_left", "funds", "retires_after", "why"]))
    print(plan["steady_state_runs"])
    return 0


def run_grant_roles(args: argparse.Namespace) -> int:
    from dpsynth.ledger.roles import grant_roles
    from dpsynth.ledger.store import DEFAULT_URL

    done = grant_roles(args.db or os.environ.get(ENV_URL) or DEFAULT_URL,
                       stage_role=args.stage_role, stage_password=os.environ.get(STAGE_PASSWORD, ""),
                       auditor_role=args.auditor_role, auditor_password=os.environ.get(AUDITOR_PASSWORD, ""))
    if args.json:
        print(_json({"stage_role": args.stage_role, "auditor_role": args.auditor_role, "statements": done}, "roles"))
    else:
        print("\n".join(done))
        print(f"ledger roles: {args.stage_role} (stage pods: reserve and commit), {args.auditor_role} (auditors: read)")
    return 0


def run_history(args: argparse.Namespace) -> int:
    ledger = open_ledger(args)
    rows, changes = ledger.history(args.population), ledger.budget_history(args.population)
    if args.json:
        print(_json({"reservations": rows, "budget_changes": changes}, "history"))
        return 0
    if changes:
        for row in changes:
            row["changed_at"] = row["changed_at"][:19]
        print("budget changes:")
        print(_table(changes, ["id", "population_id", "changed_at", "changed_by", "old_epsilon", "old_delta",
                               "new_epsilon", "new_delta", "reason"]))
        print()
    if not rows:
        print("no reservations yet")
    else:
        for row in rows:
            row["dataset_sha256"] = row["dataset_sha256"][:12]
            row["created_at"] = row["created_at"][:19]
            row["closed_at"] = row["closed_at"] and row["closed_at"][:19]
            row["blocks"] = ",".join(map(str, row["blocks"]))
        print(_table(rows, ["id", "population_id", "blocks", "pipeline_run_id", "stage", "status", "epsilon_reserved",
                            "epsilon_spent", "delta", "accountant", "resumes_id", "steps", "dataset_sha256",
                            "created_at", "closed_at", "note"]))
    return 0


def _json(obj, shape: str) -> str:
    """``--json``'s output: through the egress gate (:data:`dpsynth.egress.LEDGER`'s ``shape``)."""
    from dpsynth import egress

    return json.dumps(egress.let_out(obj, egress.LEDGER[shape]))


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
