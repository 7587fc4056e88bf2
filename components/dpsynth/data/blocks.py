"""Privacy blocks by arrival (issue #54): a record belongs to the block of the import in which it first arrived.

Every ``dpsynth data import --versioned`` to ``DST`` records its records' blocks beside the versions
(``<DST without .parquet>/blocks.json``, in the sensitive zone: it holds record ids). The first import that keeps
blocks opens block 0 and puts in it every record it brings and every record of a version imported before (all that
a run before blocks may have read: the ledger charges such runs to block 0); each later import that brings records
never seen before opens the next block, holding exactly those. A record that leaves and comes back keeps its first
block. An import that brings no new record opens none.

A block's number, its import's time and its record count are public, like n: the arrival of a record is public
metadata (docs/privacy.md, "Privacy blocks"). Which record is in which block stays in the sensitive zone.

Blocks are numbered per import folder. The folder's numbering has a random id (``series``) that the ledger ties its
population to: a population moved to a new folder would restart at block 0 there, and its records would be charged
again under fresh block budgets, so the ledger refuses blocks of another series. Moving the folder whole (its
``blocks.json`` with it) keeps the series.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone

from dpsynth import storage
from dpsynth.data import versions
from dpsynth.errors import DatasetError

FILE = "blocks.json"


def _at(folder: str) -> str:
    return storage.join(folder, FILE)


def load(folder: str) -> dict | None:
    """``{"series", "blocks": [{"block", "arrived_at", "version", "records"}, …], "records": {record_id: block}}`` of
    the versions in ``folder`` (None: no import there kept blocks). ``series``: the id of this numbering of blocks,
    random, made by the import that opened block 0 (a map written before it had one: its block 0's import time)."""
    at = _at(folder)
    if not storage.exists(at):
        return None
    try:
        state = json.loads(storage.read_bytes(at))
        found = list(state["blocks"])
        return {"series": str(state.get("series") or f"arrived-{found[0]['arrived_at']}"), "blocks": found,
                "records": {str(k): int(v) for k, v in state["records"].items()}}
    except (ValueError, KeyError, TypeError):
        raise DatasetError(f"data.uri: {at} is not a block map written by `dpsynth data import --versioned`; "
                           "restore it from a backup (its blocks are what the ledger charged)") from None


def record_import(dst: str, version: str, record_ids: list[str], *, now: datetime | None = None) -> int | None:
    """Give the records of the import of ``version`` to ``dst`` that arrive for the first time the next block;
    returns it (None: no new record, no block)."""
    folder = versions.root(dst)
    state = load(folder)
    if state is None:
        state = {"series": uuid.uuid4().hex, "blocks": [], "records": {}}
        seen = set()  # block 0: every record of an earlier version as well
        for uri in storage.list_uris(folder):
            if uri.endswith(".parquet") and uri.rsplit("/", 1)[-1] != f"{version}.parquet":
                from dpsynth.data.dataset import read_parquet

                seen.update(read_parquet(uri).record_ids)
        record_ids = sorted(seen | set(record_ids))
    new = sorted({rid for rid in record_ids if rid not in state["records"]})
    if not new:
        return None
    block = len(state["blocks"])
    state["blocks"].append({"block": block, "version": version, "records": len(new),
                            "arrived_at": (now or datetime.now(timezone.utc)).isoformat(timespec="seconds")})
    state["records"].update({rid: block for rid in new})
    storage.write_text(_at(folder), json.dumps(state, sort_keys=True))
    return block


def of_records(uri: str, record_ids: list[str]) -> list[int] | None:
    """Each record's block, when ``uri`` is a version of an import that kept blocks (None otherwise: the data is
    one block, 0)."""
    found = versions.version_of(uri)
    state = None if found is None else load(found[0])
    if state is None:
        return None
    missing = [rid for rid in record_ids if rid not in state["records"]]
    if missing:
        raise DatasetError(f"data.uri: {len(missing)} records of {uri} are in no block of its import folder's "
                           f"{FILE}; import the data again with `dpsynth data import --versioned`")
    return [state["records"][rid] for rid in record_ids]


def series(uri: str) -> str | None:
    """The id of the numbering of blocks of the import folder of ``uri`` (None: it keeps none). The ledger ties a
    population to the first it is charged on: blocks numbered afresh in another folder (restarting at 0) are refused
    (:meth:`dpsynth.ledger.store.Ledger.open_attempt`). Public: a random id, made before any record is read."""
    found = versions.version_of(uri)
    state = None if found is None else load(found[0])
    return None if state is None else state["series"]


def arrivals(uri: str) -> list[dict] | None:
    """The blocks of the import folder of ``uri`` (number, import time, records), oldest first; None when it keeps
    none. Public, like n (the version ids stay inside the sensitive zone)."""
    found = versions.version_of(uri)
    state = None if found is None else load(found[0])
    return None if state is None else [{k: b[k] for k in ("block", "arrived_at", "records")} for b in state["blocks"]]
