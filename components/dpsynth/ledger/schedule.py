"""Scheduled retraining on privacy blocks: which blocks a run reads (its window), and a forecast before spending.

A run's window is chosen by public rules only — the blocks' arrival order and what the ledger holds, never the
records: the last ``last`` blocks (every block when ``last`` is None), less every block whose remaining budget
cannot pay the run's (ε, δ). Those are left out *before* anything is read, so no run ever demands more than a
block holds (PrivateKube's privacy blocks, Luo et al., OSDI 2021; docs/privacy.md, "Privacy blocks").

:func:`forecast` plays the schedule forward — each future run after one more import, hence one more block — and
says how many more runs each block funds, after which run it retires, and what the next run charges to which
blocks; it refuses (PrivacyError naming the block) a schedule whose next run could not read its newest block,
the one its import brought.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from dpsynth.errors import PrivacyError
from dpsynth.ledger.store import TOLERANCE, check_blocks

MAX_RUNS = 100_000  # the forecast's horizon: a block funds at most budget/ε runs, so this is never reached


def window(blocks: Sequence[int], remaining: dict[int, tuple[float, float]], *, epsilon: float, delta: float,
           last: int | None) -> tuple[list[int], dict[int, str]]:
    """The blocks the next run reads, and those the rule leaves out, with why.

    ``blocks``: every block of the data, in arrival order; ``remaining``: each block's (ε, δ) left (a block
    missing from it has its whole budget — pass :func:`remaining_of` of a balance); ``last``: the window's width
    (None: every block with budget left)."""
    ordered = list(check_blocks(blocks))
    candidates = ordered if last is None else ordered[-int(last):]
    read, left_out = [], {}
    for b in ordered:
        if b not in candidates:
            left_out[b] = f"older than the last {last} blocks"
            continue
        eps_left, delta_left = remaining[b]
        if eps_left < epsilon * (1 - TOLERANCE) - TOLERANCE:
            left_out[b] = f"ε left {max(eps_left, 0.0):.6g} < the run's ε={epsilon:g}"
        elif delta_left < delta * (1 - TOLERANCE):
            left_out[b] = f"δ left {max(delta_left, 0.0):.3g} < the run's δ={delta:g}"
        else:
            read.append(b)
    return read, left_out


def remaining_of(balance: dict[str, Any], blocks: Sequence[int]) -> dict[int, tuple[float, float]]:
    """Each of ``blocks``' (ε, δ) left in a :meth:`~dpsynth.ledger.store.Ledger.balance` (a block no reservation
    has read yet has the whole budget)."""
    charged = {b["block"]: b for b in balance["blocks"]}
    return {b: (balance["budget"] - charged[b]["committed"] - charged[b]["reserved"],
                balance["delta"] - charged[b]["delta_used"]) if b in charged else (balance["budget"], balance["delta"])
            for b in blocks}


def plan(balance: dict[str, Any], blocks: Sequence[int], *, epsilon: float, delta: float,
         last: int | None) -> list[int]:
    """The blocks the next run reads (:func:`window`); PrivacyError naming the block when it cannot read the
    newest one, the block its import brought (a schedule that would over-spend it)."""
    ordered = list(check_blocks(blocks))
    read, left_out = window(ordered, remaining_of(balance, ordered), epsilon=epsilon, delta=delta, last=last)
    newest = ordered[-1]
    if newest not in read:
        pid = balance["population_id"]
        why = left_out[newest]
        if epsilon > balance["budget"] * (1 + TOLERANCE) or delta > balance["delta"] * (1 + TOLERANCE):
            why = (f"a run's (ε={epsilon:g}, δ={delta:g}) is more than a whole block's budget "
                   f"(ε={balance['budget']:g}, δ={balance['delta']:g}): no block can ever fund it")
        raise PrivacyError(
            f"privacy.epsilon: block {newest} of population {pid!r}, the newest, cannot fund the next scheduled run "
            f"({why}); this schedule would over-spend it: lower privacy.epsilon, or an operator raises the block "
            "budget with `dpsynth ledger set-budget` (docs/privacy.md, \"Privacy blocks\")")
    return read


def forecast(balance: dict[str, Any], blocks: Sequence[int], *, epsilon: float, delta: float,
             last: int | None) -> dict[str, Any]:
    """The schedule played forward: ``next`` (the blocks the next run reads, ε and δ charged to each, and those
    left out with why) and, per block, ``funds`` (how many more runs charge it), ``retires_after`` (the run, 1 =
    the next, after which no run reads it again; 0: none will) and ``why``. Each run after the next is assumed to
    follow one more import (one more block) and to spend its whole reservation."""
    ordered = list(check_blocks(blocks))
    next_read = plan(balance, ordered, epsilon=epsilon, delta=delta, last=last)
    _, next_left_out = window(ordered, remaining_of(balance, ordered), epsilon=epsilon, delta=delta, last=last)
    left = remaining_of(balance, ordered)
    funds = {b: 0 for b in ordered}
    retires = {b: 0 for b in ordered}
    live = list(ordered)
    fresh = ordered[-1]
    for run in range(1, MAX_RUNS + 1):
        read, _ = window(live, left, epsilon=epsilon, delta=delta, last=last)
        if not any(b in funds for b in read):
            break
        for b in read:
            left[b] = (left[b][0] - epsilon, left[b][1] - delta)
            if b in funds:
                funds[b] += 1
                retires[b] = run
        fresh += 1  # the import that triggers the run after this one
        live.append(fresh)
        left[fresh] = (balance["budget"], balance["delta"])
    per_block = []
    for b in ordered:
        eps_left, delta_left = remaining_of(balance, [b])[b]
        exhausted = left[b][0] < epsilon * (1 - TOLERANCE) - TOLERANCE or left[b][1] < delta * (1 - TOLERANCE)
        per_block.append({"block": b, "epsilon_left": eps_left, "delta_left": delta_left, "funds": funds[b],
                          "retires_after": retires[b],
                          "why": "its budget is spent" if exhausted else f"it leaves the window of the last {last}"})
    return {"population_id": balance["population_id"], "epsilon": epsilon, "delta": delta, "window": last,
            "block_budget": {"epsilon": balance["budget"], "delta": balance["delta"]},
            "next": {"blocks": next_read, "charges": {str(b): {"epsilon": epsilon, "delta": delta} for b in next_read},
                     "left_out": {str(b): why for b, why in next_left_out.items()}},
            "blocks": per_block, "steady_state_runs": _steady(balance, epsilon=epsilon, delta=delta, last=last)}


def _steady(balance: dict[str, Any], *, epsilon: float, delta: float, last: int | None) -> str:
    """How long the schedule lasts once it runs on fresh blocks only: every block funds this many runs."""
    per_block = min(math.floor(balance["budget"] * (1 + TOLERANCE) / epsilon),
                    math.floor(balance["delta"] * (1 + TOLERANCE) / delta))
    width = per_block if last is None else min(per_block, int(last))
    return (f"each new block funds {width} run(s) at ε={epsilon:g}; one import a run keeps the schedule going "
            "for as long as imports arrive" if width >= 1 else "no block can fund a run")
