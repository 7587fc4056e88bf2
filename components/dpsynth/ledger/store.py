"""The lifetime privacy-budget ledger: every attempt at a private stage is charged to the blocks it reads.

It holds :class:`Ledger` (populations and their budgets, reservations, commits, releases, stale
settlements) on SQLite or PostgreSQL. A population's records are split into **blocks** by arrival (the
import in which a record first arrived, :mod:`dpsynth.data.blocks`); its ε and δ budget is every block's
lifetime budget, and an attempt reserves on every block it reads. A population whose data has no blocks is
one block, 0 (today's per-population budget; an older ledger's reservations all charge block 0). How attempts
compose, when a reservation is refused, and why concurrent attempts cannot overspend: docs/privacy.md,
"The ledger's composition and transactions" and "Privacy blocks".

>>> import tempfile, os
>>> ledger = Ledger(f"sqlite:///{tempfile.mkdtemp()}/ledger.db")
>>> _ = ledger.set_budget("mnist", epsilon=10.0, delta=1e-5, reason="initial budget")
>>> rid = ledger.reserve("mnist", epsilon=4.0, delta=1e-6, dataset_sha256="ab" * 32,
...                      pipeline_run_id="run-1", accountant="rdp", records=10_000)
>>> ledger.commit(rid, epsilon_spent=3.5)
>>> ledger.balance("mnist")["remaining"]
6.5
"""

from __future__ import annotations

import getpass
import hashlib
import hmac
import math
import operator
import re
import secrets
import socket
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Sequence

from sqlalchemy import (
    CheckConstraint, Column, DateTime, Float, ForeignKey, Integer, MetaData, String, Table, Text,
    case, create_engine, event, func, insert, inspect, literal, or_, select, text, update,
)
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError

from dpsynth import commands
from dpsynth.errors import PrivacyError
from dpsynth.privacy.checks import as_real, check_delta_range, check_epsilon

DEFAULT_URL = "sqlite:///outputs/ledger.db"
STATUSES = ("reserved", "committed", "released")
SINGLE_BLOCK = (0,)  # the blocks read by an attempt on data without blocks: the whole population, one block
STALE = "stale, settled at its whole reservation: "  # the note of a reservation settled for a dead attempt
INSUFFICIENT_PRIVILEGE = "42501"  # PostgreSQL's SQLSTATE for "permission denied"
TOLERANCE = 1e-9  # floating-point slack: on ε spent vs reserved (absolute), on budgets (relative)

metadata = MetaData()

populations_table = Table(
    "populations", metadata,
    Column("population_id", String(200), primary_key=True),
    Column("epsilon_budget", Float, nullable=False),
    Column("delta", Float, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    # the data it was first charged for: HMAC-SHA256(the ledger's key, the dataset's content sha256), never the raw hash
    Column("data_id", String(64), nullable=True),
    # an operator's reason for charging it for data already charged to another population (None: refused)
    Column("shared_data_reason", Text, nullable=True),
    # the numbering of privacy blocks it was first charged on (dpsynth.data.blocks.series: its import folder's; None:
    # not yet charged on blocks): blocks of another numbering, restarting at 0 elsewhere, are refused
    Column("block_series", String(64), nullable=True),
    CheckConstraint("epsilon_budget > 0", name="ck_populations_epsilon"),
    CheckConstraint("delta > 0 AND delta < 1", name="ck_populations_delta"),
)

reservations_table = Table(
    "reservations", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("population_id", String(200), ForeignKey("populations.population_id"), nullable=False, index=True),
    Column("dataset_sha256", String(64), nullable=False),
    Column("pipeline_run_id", String(200), nullable=False),
    Column("stage", String(100), nullable=False),
    Column("epsilon_reserved", Float, nullable=False),
    Column("delta", Float, nullable=False),
    Column("epsilon_spent", Float, nullable=True),
    Column("status", String(16), nullable=False),
    Column("accountant", String(100), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("closed_at", DateTime(timezone=True), nullable=True),
    Column("note", Text, nullable=True),
    # the attempt (one process running the private stage) and its checkpoint lineage
    Column("attempt_id", String(64), nullable=True),
    Column("resumes_id", Integer, nullable=True),  # the reservation whose checkpoint this attempt resumed
    Column("steps", Integer, nullable=True),  # private steps its last checkpoint holds (heartbeat)
    Column("heartbeat_at", DateTime(timezone=True), nullable=True),
    # the sound ε the attempt may reach when its trainer has no guard holding it to its reservation (an
    # as_published run): what it is charged at least, however it ends (see Ledger.raise_bound)
    Column("epsilon_bound", Float, nullable=True),
    Column("data_id", String(64), nullable=True),  # the data charged (see populations.data_id)
    # sha256 of the secret only the process that opened it holds: closing it below its whole ε (a release, a
    # commit under its reservation) needs that secret; settling it at its whole ε does not
    Column("token_sha256", String(64), nullable=True),
    CheckConstraint("status IN ('reserved', 'committed', 'released')", name="ck_reservations_status"),
    CheckConstraint("epsilon_reserved > 0", name="ck_reservations_epsilon"),
    sqlite_autoincrement=True,  # ids are never reused, even after a rolled-back insert
)

budget_history_table = Table(
    "budget_history", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("population_id", String(200), ForeignKey("populations.population_id"), nullable=False, index=True),
    Column("changed_at", DateTime(timezone=True), nullable=False),
    Column("changed_by", String(200), nullable=False),
    Column("old_epsilon", Float, nullable=True),  # null: the population was created
    Column("old_delta", Float, nullable=True),
    Column("new_epsilon", Float, nullable=False),
    Column("new_delta", Float, nullable=False),
    Column("reason", Text, nullable=False),
    sqlite_autoincrement=True,
)
# the blocks each reservation reads (a reservation counts, in ε and δ, on every one of them)
reservation_blocks_table = Table(
    "reservation_blocks", metadata,
    Column("reservation_id", Integer, ForeignKey("reservations.id"), primary_key=True),
    Column("block", Integer, primary_key=True),
    CheckConstraint("block >= 0", name="ck_reservation_blocks_block"),
)
# the ledger's own secret key of data ids (one row; read by no method that returns rows)
data_key_table = Table(
    "data_key", metadata,
    Column("id", Integer, primary_key=True),
    Column("key", String(64), nullable=False),
)
# columns added since the first ledger schema: an older database gets them (all nullable) on open
_ADDED_COLUMNS = {"reservations": ("attempt_id", "resumes_id", "steps", "heartbeat_at", "epsilon_bound", "data_id",
                                    "token_sha256"),
                  "populations": ("data_id", "shared_data_reason", "block_series")}


class Ledger:
    """A lifetime (ε, δ) budget per population, in the database at a SQLAlchemy ``url``.

    Tables are created if missing. Arguments past the population id / reservation id are
    keyword-only. Every failure a user can cause is a :class:`~dpsynth.errors.PrivacyError`.
    """

    def __init__(self, url: str = DEFAULT_URL) -> None:
        parsed = make_url(url)
        self._sqlite = parsed.get_backend_name() == "sqlite"
        connect_args = {}
        if self._sqlite:
            if parsed.database and parsed.database != ":memory:":
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            connect_args = {"timeout": 60.0}  # wait this long for another writer's lock
        self.engine = create_engine(url, connect_args=connect_args)
        if self._sqlite:
            _take_sqlite_transactions(self.engine)
        self._tokens: dict[int, str] = {}  # the secret of each reservation this object opened
        with self._transaction(write=False) as conn:
            missing = (not all(inspect(conn).has_table(name) for name in metadata.tables)
                       or bool(_missing_columns(conn)) or _unblocked(conn))
        if missing:  # take the write lock only when there is something to create
            with self._transaction() as conn:
                metadata.create_all(conn)
                for table, column in _missing_columns(conn):
                    col = metadata.tables[table].c[column]
                    conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {column} "
                                      f"{col.type.compile(dialect=conn.dialect)}"))
                _migrate_to_blocks(conn)

    def set_budget(self, population_id: str, *, epsilon: float, delta: float, reason: str,
                   changed_by: str | None = None, records: int | None = None,
                   allow_shared_data: str | None = None) -> dict[str, Any]:
        """Create the population or change its lifetime budget; returns its :meth:`balance`.

        ``reason`` (required) and ``changed_by`` (default: user@host) go into the population's
        budget history with the old and new budget. Refuses a budget below what is already charged
        (committed + reserved, in ε and in δ), and, given the dataset's ``records`` n, a δ ≥ 1/n.
        ``allow_shared_data``: the operator's reason for letting this population be charged for data
        already charged to another (refused otherwise, see :meth:`open_attempt`), kept with it and in its history.
        """
        pid = _check_id(population_id, "population_id")
        eps = check_epsilon(epsilon, "epsilon")
        dlt = check_delta_range(delta, "delta")
        why = _check_text(reason, "reason")
        who = _check_text(changed_by or f"{getpass.getuser()}@{socket.gethostname()}", "changed_by")
        if records is not None:
            _check_lifetime_delta(pid, dlt, records)
        shared = None if allow_shared_data is None else _check_text(allow_shared_data, "allow_shared_data")
        if shared is not None:
            why = f"{why} (allows data charged to another population: {shared})"
        now = _now()
        with self._transaction() as conn:
            row = self._lock_population(conn, pid)
            if row is None:
                conn.execute(insert(populations_table).values(
                    population_id=pid, epsilon_budget=eps, delta=dlt, created_at=now, updated_at=now,
                    shared_data_reason=shared))
            else:
                bal = _balance(conn, row)
                charged = bal["committed"] + bal["reserved"]
                if not _fits(charged, eps):
                    raise PrivacyError(
                        f"epsilon: population {pid!r} has already been charged ε={charged:g} "
                        f"(committed {bal['committed']:g} + reserved {bal['reserved']:g}); "
                        f"the budget cannot go below that, got {eps:g}")
                if not _fits(bal["delta_used"], dlt):
                    raise PrivacyError(
                        f"delta: population {pid!r} has already been charged δ={bal['delta_used']:g}; "
                        f"the budget cannot go below that, got {dlt:g}")
                conn.execute(update(populations_table).where(populations_table.c.population_id == pid)
                             .values(epsilon_budget=eps, delta=dlt, updated_at=now,
                                     **({} if shared is None else {"shared_data_reason": shared})))
            conn.execute(insert(budget_history_table).values(
                population_id=pid, changed_at=now, changed_by=who, reason=why, new_epsilon=eps, new_delta=dlt,
                old_epsilon=None if row is None else row.epsilon_budget, old_delta=None if row is None else row.delta))
            return _balance(conn, self._lock_population(conn, pid))

    def budget_history(self, population_id: str | None = None) -> list[dict[str, Any]]:
        """Every budget change (of one population, or all), oldest first."""
        table = budget_history_table
        query = select(table).order_by(table.c.id)
        if population_id is not None:
            query = query.where(table.c.population_id == _check_id(population_id, "population_id"))
        with self._transaction(write=False) as conn:
            return [_row_dict(row) for row in conn.execute(query)]

    def reserve(self, population_id: str, *, epsilon: float, delta: float, dataset_sha256: str,
                pipeline_run_id: str, accountant: str, records: int, stage: str = "train",
                blocks: Sequence[int] | None = None, block_series: str | None = None) -> int:
        """Reserve (ε, δ) on every one of ``blocks`` (None: the single block 0) before touching the data; returns
        the reservation id.

        Atomic: under the lock, refuses (PrivacyError naming the block, nothing written) unless on every block read
        committed + reserved + ``epsilon`` ≤ the ε budget and the δ's summed ≤ the δ budget, and the
        lifetime δ < 1/``records``. Demands are served first-come: the population's row lock orders them.
        Private stages use :meth:`open_attempt`, which also settles stale attempts.
        """
        return self.open_attempt(population_id, epsilon=epsilon, delta=delta, dataset_sha256=dataset_sha256,
                                 pipeline_run_id=pipeline_run_id, accountant=accountant, records=records,
                                 stage=stage, attempt_id=None, resumes_id=None, stale_after_s=None,
                                 settle_stale=False, blocks=blocks, block_series=block_series)[0]

    def check_affordable(self, population_id: str, *, epsilon: float, delta: float, records: int,
                         blocks: Sequence[int] | None = None, block_series: str | None = None) -> dict[str, Any]:
        """Refuse (PrivacyError) what :meth:`reserve` would refuse, writing nothing; the balance otherwise."""
        pid = _check_id(population_id, "population_id")
        eps, dlt = check_epsilon(epsilon, "epsilon"), check_delta_range(delta, "delta")
        read = check_blocks(blocks)
        with self._transaction(write=False) as conn:
            row = conn.execute(select(populations_table).where(populations_table.c.population_id == pid)).first()
            bal = self._affordable(conn, row, pid, eps, dlt, records, run_id=None, blocks=read)
            _tie_series(conn, row, block_series, blocks=blocks, write=False)
            return bal

    def open_attempt(self, population_id: str, *, epsilon: float, delta: float, dataset_sha256: str,
                     pipeline_run_id: str, accountant: str, records: int, stage: str, attempt_id: str | None,
                     resumes_id: int | None, stale_after_s: float | None,
                     resumed_steps: int | None = None, settle_stale: bool = True,
                     content_sha256: str | None = None, blocks: Sequence[int] | None = None,
                     block_series: str | None = None) -> tuple[int, list[dict[str, Any]]]:
        """Open the reservation of one attempt at a private stage: ``(reservation id, settled)``.

        In the same transaction, first settles (committed at its whole reservation, reason recorded)
        every open reservation of this population that is stale: the one whose checkpoint this
        attempt resumes (``resumes_id``: adopted — it must be of this population and stage), those of
        the same ``stage`` and ``pipeline_run_id`` (an earlier attempt of this stage in this pipeline
        run: only one runs at a time), and, given ``stale_after_s``, those whose last heartbeat is
        older. ``settled`` lists them. Then reserves as :meth:`reserve` does, on every one of ``blocks``.
        Only this object may then close the reservation below its whole ε (:meth:`commit`, :meth:`release`).

        ``content_sha256``: the sha256 of the records charged (the dataset's content). The ledger keeps it only
        as a keyed data id (HMAC with its own key), ties the population to the first it is charged for, and
        refuses (PrivacyError naming ``ledger.population_id``) data already charged to another population —
        a new id for the same records would start a fresh budget — unless an operator allowed it
        (:meth:`set_budget` ``allow_shared_data``).

        ``block_series``: the id of the numbering of ``blocks`` (:func:`dpsynth.data.blocks.series`, its import
        folder's). The population is tied to the first it is charged on; blocks of another numbering (a new import
        folder, restarting at block 0: its records would be charged again under fresh block budgets), or a run on
        data without blocks once it has some (charged to block 0 alone for records of every block), are refused,
        naming ``data.uri``.
        """
        pid = _check_id(population_id, "population_id")
        eps = check_epsilon(epsilon, "epsilon")
        dlt = check_delta_range(delta, "delta")
        sha = _check_sha256(dataset_sha256)
        run_id = _check_id(pipeline_run_id, "pipeline_run_id")
        acct = _check_id(accountant, "accountant")
        stage = _check_id(stage, "stage")
        attempt = None if attempt_id is None else _check_id(attempt_id, "attempt_id")
        resumes = None if resumes_id is None else _check_reservation_id(resumes_id)
        read = check_blocks(blocks)
        token = secrets.token_hex(32)
        now = _now()
        with self._transaction() as conn:
            row = self._lock_population(conn, pid)
            if resumes is not None:
                adopted = conn.execute(select(reservations_table).where(reservations_table.c.id == resumes)).first()
                if adopted is None or adopted.population_id != pid or adopted.stage != stage:
                    raise PrivacyError(
                        f"resumes_id: the checkpoint was written under reservation {resumes}, which is "
                        + ("not in this ledger" if adopted is None else
                           f"of population {adopted.population_id!r}, stage {adopted.stage!r}")
                        + f", not of population {pid!r}, stage {stage!r}: refusing to resume it (start afresh)")
            settled = []
            if row is not None and settle_stale:
                _check_rows(conn, row)
                settled = self._settle_stale(conn, pid, stage=stage, run_id=run_id, resumes=resumes,
                                             attempt=attempt, stale_after_s=stale_after_s, now=now)
            self._affordable(conn, row, pid, eps, dlt, records, run_id=run_id, blocks=read)
            data_id = None if content_sha256 is None else self._tie_data(conn, row, _data_id(conn, content_sha256))
            _tie_series(conn, row, block_series, blocks=blocks)
            result = conn.execute(insert(reservations_table).values(
                population_id=pid, dataset_sha256=sha, pipeline_run_id=run_id, stage=stage,
                epsilon_reserved=eps, delta=dlt, status="reserved", accountant=acct, created_at=now,
                attempt_id=attempt, resumes_id=resumes, steps=resumed_steps, heartbeat_at=now, data_id=data_id,
                token_sha256=_token_sha256(token)))
            rid = int(result.inserted_primary_key[0])
            conn.execute(insert(reservation_blocks_table), [{"reservation_id": rid, "block": b} for b in read])
        self._tokens[rid] = token
        return rid, settled

    def check_data(self, population_id: str, *, content_sha256: str) -> None:
        """Refuse (PrivacyError, nothing written) what :meth:`open_attempt` would refuse for this data."""
        pid = _check_id(population_id, "population_id")
        with self._transaction() as conn:  # a write transaction: the ledger's key may be created
            row = self._lock_population(conn, pid)
            if row is not None:
                self._tie_data(conn, row, _data_id(conn, content_sha256), write=False)

    @staticmethod
    def _tie_data(conn: Connection, row, data_id: str, *, write: bool = True) -> str:
        """Refuse ``data_id`` if another population was charged for it (unless ``row``'s operator allowed it);
        record it as ``row``'s first data when it has none."""
        pid, table = row.population_id, reservations_table
        if not row.shared_data_reason:
            others = conn.execute(
                select(table.c.population_id).where(table.c.data_id == data_id, table.c.population_id != pid)
                .union(select(populations_table.c.population_id).where(
                    populations_table.c.data_id == data_id, populations_table.c.population_id != pid))).scalars().all()
            if others:
                first = sorted(set(others))[0]
                raise PrivacyError(
                    f"ledger.population_id: these records were already charged to population {first!r}; charging "
                    f"them to {pid!r} would start a fresh lifetime budget for the same data. Use "
                    f"ledger.population_id={first}, or, if an operator has decided that {pid!r} may be charged for "
                    f"them anyway, record why with `{_set_budget_command(pid)} --allow-shared-data REASON`")
        if write and row.data_id is None:
            conn.execute(update(populations_table).where(populations_table.c.population_id == pid)
                         .values(data_id=data_id))
        return data_id

    def heartbeat(self, reservation_id: int, *, steps: int) -> None:
        """The attempt holding this reservation is alive, and its last checkpoint holds ``steps`` private steps."""
        with self._transaction() as conn:
            row = self._lock_open_reservation(conn, reservation_id)
            conn.execute(update(reservations_table).where(reservations_table.c.id == row.id)
                         .values(heartbeat_at=_now(), steps=operator.index(steps)))

    def raise_bound(self, reservation_id: int, *, epsilon: float, why: str) -> None:
        """The attempt holding this reservation may spend up to the sound ``epsilon`` (> its reservation): its
        trainer has no guard holding it to the reservation (``as_published``). Recorded before its first private
        step, flagged OVERDRAW: the reservation then counts, and is settled when stale, at that ε."""
        bound = as_real(epsilon, "epsilon")
        if not 0 <= bound < math.inf:
            raise PrivacyError(f"epsilon: must be a finite number >= 0, got {bound:g}")
        with self._transaction() as conn:
            row = self._lock_open_reservation(conn, reservation_id)
            if bound <= _whole(row) + TOLERANCE:
                return  # a bound only ever rises
            note = (f"OVERDRAW: may spend the sound ε={bound:.6g} > reserved ε={row.epsilon_reserved:.6g} "
                    f"({_check_text(why, 'why')})")
            conn.execute(update(reservations_table).where(reservations_table.c.id == row.id)
                         .values(epsilon_bound=bound, note=note))

    def settle(self, reservation_id: int, *, reason: str) -> dict[str, Any]:
        """Close a stale open reservation at its whole reservation, ``reason`` recorded (``dpsynth ledger settle``)."""
        why = _check_text(reason, "reason")
        with self._transaction() as conn:
            row = self._lock_open_reservation(conn, reservation_id)
            self._close(conn, row.id, status="committed", epsilon_spent=_whole(row), note=_stale_note(row, why))
        return self.reservation(reservation_id)

    def _settle_stale(self, conn: Connection, pid: str, *, stage: str, run_id: str, resumes: int | None,
                      attempt: str | None, stale_after_s: float | None, now: datetime) -> list[dict[str, Any]]:
        table = reservations_table
        stale = [(table.c.stage == stage) & (table.c.pipeline_run_id == run_id)]
        if resumes is not None:
            stale.append(table.c.id == resumes)
        if stale_after_s is not None:
            cutoff = datetime.fromtimestamp(now.timestamp() - float(stale_after_s), timezone.utc)
            stale.append(func.coalesce(table.c.heartbeat_at, table.c.created_at) < cutoff)
        rows = conn.execute(select(table).where(table.c.population_id == pid, table.c.status == "reserved",
                                                or_(*stale)).with_for_update()).all()
        by = f"attempt {attempt}" if attempt else f"run {run_id!r}"
        settled = []
        for r in rows:
            if r.id == resumes:
                why = (f"adopted by {by}, which resumes its checkpoint ({r.steps or 0} private steps); after "
                       "that checkpoint it may have run up to its reservation")
            elif r.stage == stage and r.pipeline_run_id == run_id:
                why = f"superseded by {by} of stage {stage!r} in the same pipeline run: it ended without closing"
            else:
                why = f"expired: no heartbeat for more than {stale_after_s:g} s"
            self._close(conn, r.id, status="committed", epsilon_spent=_whole(r), note=_stale_note(r, why))
            settled.append({**_with_blocks(conn, [r])[0], "status": "committed", "note": why})
        return settled

    @staticmethod
    def _affordable(conn: Connection, row, pid: str, eps: float, dlt: float, records: int,
                    *, run_id: str | None, blocks: tuple[int, ...] = SINGLE_BLOCK) -> dict[str, Any]:
        if row is None:
            raise PrivacyError(
                f"population_id: the ledger has no budget for population {pid!r}, and it gives none by "
                f"default; an operator sets one with `{_set_budget_command(pid)}`")
        bal = _balance(conn, row)
        _check_lifetime_delta(pid, bal["delta"], records)
        what = f" for run {run_id!r}" if run_id else ""
        stuck = (f". A reservation whose attempt is gone (killed, its pod deleted) stays open: find it with `{commands.dpsynth('ledger', 'history', pid)}` and close it with `{commands.dpsynth('ledger', 'settle', 'ID', '--reason TEXT')}`" if bal["reserved"] else "")
        charges = {b["block"]: b for b in bal["blocks"]}
        for block in blocks:
            b = charges.get(block, _unread_block(block, bal))
            where = f"population {pid!r}" if blocks == SINGLE_BLOCK and len(charges) <= 1 else \
                f"block {block} of population {pid!r}"
            if not _fits(b["committed"] + b["reserved"] + eps, bal["budget"]):
                raise PrivacyError(
                    f"epsilon: {where} cannot afford ε={eps:g}{what}: "
                    f"lifetime budget ε={bal['budget']:g}, committed {b['committed']:g}, "
                    f"reserved by attempts in progress {b['reserved']:g}, remaining {b['remaining']:g}"
                    + ("; demands on a block are served first-come (the attempts in progress came first)"
                       if b["reserved"] > 0 else "")
                    + f"; an operator may raise it with `{_set_budget_command(pid)}`"
                    + ("" if where.startswith("population") else
                       ", or leave the block out of the run's window (docs/privacy.md, \"Privacy blocks\")")
                    + (stuck if b["reserved"] > 0 else ""))
            if not _fits(b["delta_used"] + dlt, bal["delta"]):
                raise PrivacyError(
                    f"delta: {where} cannot afford δ={dlt:g}{what}: "
                    f"lifetime budget δ={bal['delta']:g}, already charged (committed + reserved) "
                    f"{b['delta_used']:g}; under basic composition the δ's of all attempts add up"
                    + (stuck if b["reserved"] > 0 else ""))
        return bal

    def commit(self, reservation_id: int, *, epsilon_spent: float, note: str | None = None) -> None:
        """Record the ε an attempt spent; the unspent part of its reservation goes back to the budget.

        Spending more than was reserved is recorded as it is, flagged OVERDRAW in the note, never
        capped. An attempt whose reservation was settled as stale while it still ran (its heartbeat
        had stopped, say) keeps the larger of the two charges. :meth:`release` is for attempts that spent nothing.
        """
        spent = as_real(epsilon_spent, "epsilon_spent")
        if not 0 <= spent < math.inf:
            raise PrivacyError(f"epsilon_spent: must be a finite number >= 0, got {spent:g}")
        rid = _check_reservation_id(reservation_id)
        with self._transaction() as conn:
            table = reservations_table
            row = conn.execute(select(table).where(table.c.id == rid).with_for_update()).first()
            if row is not None and row.status == "committed" and (row.note or "").startswith(STALE):
                conn.execute(update(table).where(table.c.id == rid).values(
                    epsilon_spent=max(spent, row.epsilon_spent),
                    note=f"{row.note}; the attempt then committed ε={spent:.6g}" + (f" ({note})" if note else "")))
                return
            row = self._lock_open_reservation(conn, rid)
            if spent < _whole(row) - TOLERANCE:
                self._check_holder(conn, row, f"commit it at ε={spent:.6g}, below its whole ε={_whole(row):.6g}")
            if spent > row.epsilon_reserved + TOLERANCE:
                over = f"OVERDRAW: spent ε={spent:.6g} > reserved ε={row.epsilon_reserved:.6g}"
                note = f"{over}; {note}" if note else over
            self._close(conn, row.id, status="committed", epsilon_spent=spent, note=note)

    def release(self, reservation_id: int, *, note: str) -> None:
        """Give a failed run's whole reservation back; ``note`` says why."""
        with self._transaction() as conn:
            row = self._lock_open_reservation(conn, reservation_id)
            self._check_holder(conn, row, "release it")
            self._close(conn, row.id, status="released", epsilon_spent=None, note=str(note))

    def balance(self, population_id: str) -> dict[str, Any]:
        """``budget``, ``committed``, ``reserved``, ``remaining`` (ε), ``delta`` and ``delta_used``."""
        pid = _check_id(population_id, "population_id")
        with self._transaction(write=False) as conn:
            row = conn.execute(select(populations_table).where(populations_table.c.population_id == pid)).first()
            if row is None:
                raise PrivacyError(
                    f"population_id: no budget for population {pid!r}; "
                    f"set one with `{_set_budget_command(pid)}`")
            return _balance(conn, row)

    def populations(self) -> list[dict[str, Any]]:
        """Every population with its budget and balance, by id."""
        with self._transaction(write=False) as conn:
            rows = conn.execute(select(populations_table).order_by(populations_table.c.population_id)).all()
            return [{**{k: v for k, v in _row_dict(row).items() if k != "block_series"}, **_balance(conn, row)}
                    for row in rows]

    def reservation(self, reservation_id: int) -> dict[str, Any]:
        """One reservation, as :meth:`history` lists it."""
        rid = _check_reservation_id(reservation_id)
        with self._transaction(write=False) as conn:
            row = conn.execute(select(reservations_table).where(reservations_table.c.id == rid)).first()
            if row is None:
                raise PrivacyError(f"reservation_id: no reservation {rid}")
            return _with_blocks(conn, [row])[0]

    def reservations(self, *, pipeline_run_id: str, status: str | None = None) -> list[dict[str, Any]]:
        """The reservations of one pipeline run (optionally only those with ``status``), oldest first."""
        table = reservations_table
        query = select(table).where(table.c.pipeline_run_id == _check_id(pipeline_run_id, "pipeline_run_id"))
        if status is not None:
            if status not in STATUSES:
                raise PrivacyError(f"status: must be one of {', '.join(STATUSES)}, got {status!r}")
            query = query.where(table.c.status == status)
        with self._transaction(write=False) as conn:
            return _with_blocks(conn, conn.execute(query.order_by(table.c.id)).all())

    def history(self, population_id: str | None = None) -> list[dict[str, Any]]:
        """Every reservation (of one population, or all), oldest first, each with the ``blocks`` it reads."""
        query = select(reservations_table).order_by(reservations_table.c.id)
        if population_id is not None:
            query = query.where(reservations_table.c.population_id == _check_id(population_id, "population_id"))
        with self._transaction(write=False) as conn:
            return _with_blocks(conn, conn.execute(query).all())

    # -- internals ---------------------------------------------------------------------------

    @contextmanager
    def _transaction(self, *, write: bool = True) -> Iterator[Connection]:
        """One transaction; on SQLite a write one starts with BEGIN IMMEDIATE (the write lock). A statement the
        URL's database role may not run (PostgreSQL roles per zone: :mod:`dpsynth.ledger.roles`) is refused
        as a PrivacyError naming who may."""
        try:
            with self.engine.connect() as conn:
                conn.execution_options(dpsynth_write=write)
                with conn.begin():
                    yield conn
        except DBAPIError as exc:
            if getattr(exc.orig, "pgcode", None) != INSUFFICIENT_PRIVILEGE:
                raise
            user = self.engine.url.username or "?"
            raise PrivacyError(
                f"ledger.url: the ledger's database role {user!r} may not do this "
                f"({str(exc.orig).strip().splitlines()[0]}): each zone has its own role (docs/cluster.md, "
                "\"Ledger roles\"): stage pods reserve and commit, the auditors' page reads, and only the "
                "platform's role (the ledger-admin Secret) sets budgets") from None

    def _check_holder(self, conn: Connection, row, what: str) -> None:
        """Refuse to ``what`` an open reservation (give ε back) unless this object opened it; on PostgreSQL, also
        tell the ``reservations_closed_once`` trigger the secret (:mod:`dpsynth.ledger.roles`), which checks it
        for every role."""
        token = self._tokens.get(row.id)
        if token is None or row.token_sha256 is None or not hmac.compare_digest(_token_sha256(token),
                                                                                row.token_sha256):
            raise PrivacyError(
                f"reservation_id: reservation {row.id} (population {row.population_id!r}, run "
                f"{row.pipeline_run_id!r}) is held by another attempt: only the attempt that opened it may {what}; "
                f"if that attempt is dead, settle it at its whole ε with `{_settle_command(row.id)}`")
        if not self._sqlite:
            conn.execute(text("SELECT set_config('dpsynth.attempt_token', :token, true)"), {"token": token})

    @staticmethod
    def _lock_population(conn: Connection, pid: str):
        table = populations_table
        return conn.execute(select(table).where(table.c.population_id == pid).with_for_update()).first()

    @staticmethod
    def _lock_open_reservation(conn: Connection, reservation_id: int):
        rid = _check_reservation_id(reservation_id)
        table = reservations_table
        row = conn.execute(select(table).where(table.c.id == rid).with_for_update()).first()
        if row is None:
            raise PrivacyError(f"reservation_id: no reservation {rid}")
        if row.status != "reserved":
            raise PrivacyError(
                f"reservation_id: reservation {rid} (population {row.population_id!r}, run "
                f"{row.pipeline_run_id!r}) is already {row.status}; a reservation is closed only once")
        return row

    @staticmethod
    def _close(conn: Connection, rid: int, *, status: str, epsilon_spent: float | None, note: str | None) -> None:
        table = reservations_table
        done = conn.execute(update(table).where(table.c.id == rid, table.c.status == "reserved")
                            .values(status=status, epsilon_spent=epsilon_spent, closed_at=_now(), note=note))
        if done.rowcount != 1:  # cannot happen under the row lock; refuse rather than double-close
            raise PrivacyError(f"reservation_id: reservation {rid} was closed concurrently")


def _tie_series(conn: Connection, row, series: str | None, *, blocks: Sequence[int] | None, write: bool = True) -> None:
    """Refuse blocks numbered by another series than the one ``row``'s population was first charged on (or data
    without blocks once it has them); record ``series`` as its first when it has none (:meth:`Ledger.open_attempt`)."""
    pid, tied = row.population_id, row.block_series
    if series is not None and not isinstance(series, str) or series == "":
        raise PrivacyError(f"block_series: must be a non-empty text or None, got {series!r}")
    if tied is not None and series != tied:
        moved = ("its data.uri keeps no privacy blocks, so the run would charge block 0 alone for records of every "
                 "block" if series is None or blocks is None else
                 "its blocks are numbered by another import folder (they restart at block 0 there: its records "
                 "would be charged again under fresh block budgets)")
        raise PrivacyError(
            f"data.uri: population {pid!r} is charged on the privacy blocks of one import folder; {moved}. Train on "
            "a version of the folder its blocks started in (keep importing there with `dpsynth data import "
            "--versioned`; a folder moved whole, blocks.json with it, keeps its numbering), or charge the new "
            "folder to a new population (docs/privacy.md, \"Privacy blocks\")")
    if write and tied is None and series is not None:
        conn.execute(update(populations_table).where(populations_table.c.population_id == pid)
                     .values(block_series=series))


def _data_id(conn: Connection, content_sha256: str) -> str:
    """HMAC-SHA256(the ledger's key, the content sha256): comparable within this ledger, and no test of a
    candidate dataset for whoever reads the ledger's rows."""
    sha = _check_sha256(content_sha256, "content_sha256")
    return hmac.new(bytes.fromhex(_data_key(conn)), sha.encode(), hashlib.sha256).hexdigest()


def _data_key(conn: Connection) -> str:
    """The ledger's key of data ids, made on first use (by the database's owner where roles are granted:
    :func:`dpsynth.ledger.roles.grant_roles` makes it, so that the stages' role only reads it)."""
    key = conn.execute(select(data_key_table.c.key).where(data_key_table.c.id == 1)).scalar()
    if key is None:
        key = secrets.token_hex(32)
        conn.execute(insert(data_key_table).values(id=1, key=key))
    return key


def _take_sqlite_transactions(engine) -> None:
    """Let SQLAlchemy, not the sqlite3 module, issue BEGIN, so that writers can ask for IMMEDIATE."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record):
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn):
        write = conn.get_execution_options().get("dpsynth_write", True)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _balance(conn: Connection, population) -> dict[str, Any]:
    """The population's balance, after checking every one of its rows (a hand-edited ledger is refused):
    ``blocks`` lists each charged block's; ``committed``, ``reserved`` and ``remaining`` are the most charged
    block's (no record has less ε left than ``remaining``), ``delta_used`` the largest of any block."""
    _check_rows(conn, population)
    blocks = _block_charges(conn, population)
    worst = max(blocks, key=lambda b: (b["committed"] + b["reserved"], -b["block"]),
                default=_unread_block(0, {"budget": population.epsilon_budget}))
    return {
        "population_id": population.population_id,
        "budget": population.epsilon_budget,
        "committed": worst["committed"],
        "reserved": worst["reserved"],
        "remaining": population.epsilon_budget - worst["committed"] - worst["reserved"],
        "delta": population.delta,
        "delta_used": max((b["delta_used"] for b in blocks), default=0.0),
        "blocks": blocks,
    }


def _block_charges(conn: Connection, population) -> list[dict[str, Any]]:
    """Each block that any reservation of ``population`` reads: ε committed, reserved and remaining, δ used."""
    table, links = reservations_table, reservation_blocks_table
    block = func.coalesce(links.c.block, 0)  # a reservation with no block rows (none are written so) reads block 0
    sums: dict[int, dict[str, float]] = {}
    for b, status, eps, dlt in conn.execute(
            select(block, table.c.status, func.sum(_charged(table)), func.sum(table.c.delta))
            .select_from(table.outerjoin(links, links.c.reservation_id == table.c.id))
            .where(table.c.population_id == population.population_id, table.c.status != "released")
            .group_by(block, table.c.status)):
        sums.setdefault(int(b), {})[status] = (eps or 0.0, dlt or 0.0)
    out = []
    for b in sorted(sums):
        (committed, d_committed), (reserved, d_reserved) = (sums[b].get(s, (0.0, 0.0)) for s in ("committed", "reserved"))
        out.append({"block": b, "committed": committed, "reserved": reserved,
                    "remaining": population.epsilon_budget - committed - reserved, "delta_used": d_committed + d_reserved})
    return out


def _unread_block(block: int, bal: dict[str, Any]) -> dict[str, Any]:
    return {"block": block, "committed": 0.0, "reserved": 0.0, "remaining": bal["budget"], "delta_used": 0.0}


def check_blocks(blocks: Sequence[int] | None) -> tuple[int, ...]:
    """The blocks an attempt reads, sorted, each once (None: the single block 0); PrivacyError naming ``blocks``."""
    if blocks is None:
        return SINGLE_BLOCK
    try:
        read = tuple(sorted({operator.index(b) for b in blocks if not isinstance(b, bool)}))
        bad = len(read) != len(set(blocks)) or any(b < 0 for b in read)
    except TypeError:
        bad = True
    if bad or not read:
        raise PrivacyError(f"blocks: the blocks a run reads must be a non-empty list of integers >= 0, got {blocks!r}")
    return read


def _unblocked(conn: Connection) -> bool:
    """Whether an older ledger has reservations that read no recorded block (they are migrated to block 0)."""
    if not inspect(conn).has_table("reservation_blocks") or not inspect(conn).has_table("reservations"):
        return inspect(conn).has_table("reservations")
    table, links = reservations_table, reservation_blocks_table
    return conn.execute(select(table.c.id).where(~select(links.c.reservation_id).where(
        links.c.reservation_id == table.c.id).exists()).limit(1)).first() is not None


def _migrate_to_blocks(conn: Connection) -> None:
    """An older ledger's reservations (a per-population budget) each read block 0: the population as one block."""
    table, links = reservations_table, reservation_blocks_table
    conn.execute(insert(links).from_select(["reservation_id", "block"], select(table.c.id, literal(0)).where(
        ~select(links.c.reservation_id).where(links.c.reservation_id == table.c.id).exists())))


def _with_blocks(conn: Connection, rows) -> list[dict[str, Any]]:
    """``rows`` of reservations as dicts, each with the sorted ``blocks`` it reads (the secret's hash left out)."""
    links = reservation_blocks_table
    read: dict[int, list[int]] = {}
    ids = [row.id for row in rows]
    for start in range(0, len(ids), 500):
        for rid, block in conn.execute(select(links.c.reservation_id, links.c.block)
                                       .where(links.c.reservation_id.in_(ids[start:start + 500]))):
            read.setdefault(rid, []).append(block)
    out = []
    for row in rows:
        d = _row_dict(row)
        d.pop("token_sha256", None)
        d["blocks"] = sorted(read.get(row.id, SINGLE_BLOCK))
        out.append(d)
    return out


def _token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _charged(table):
    """What a reservation counts for: a committed one its spent ε, an open one its whole (:func:`_whole`)."""
    bound = func.coalesce(table.c.epsilon_bound, 0.0)
    return case((table.c.status == "committed", table.c.epsilon_spent),
                (bound > table.c.epsilon_reserved, bound), else_=table.c.epsilon_reserved)


def _whole(row) -> float:
    """An open reservation's whole amount: its ε, or the larger sound ε its attempt may reach (``epsilon_bound``)."""
    return max(row.epsilon_reserved, row.epsilon_bound or 0.0)


def _stale_note(row, why: str) -> str:
    """The note of a reservation settled as stale (its raised bound's OVERDRAW note kept)."""
    return f"{STALE}{why}" + (f"; {row.note}" if _whole(row) > row.epsilon_reserved else "")


def _check_rows(conn: Connection, population) -> None:
    """Refuse a population whose rows no code path of this module writes (a hand-edited ledger)."""
    pid = population.population_id

    def bad(x, *, zero_ok: bool = False) -> bool:
        return x is None or not math.isfinite(x) or x < 0 or (x == 0 and not zero_ok)

    if bad(population.epsilon_budget) or bad(population.delta) or not population.delta < 1:
        raise PrivacyError(f"ledger: population {pid!r} has an invalid budget (ε={population.epsilon_budget!r}, "
                           f"δ={population.delta!r}); refusing to use it until an operator repairs the row")
    table = reservations_table
    for r in conn.execute(select(table).where(table.c.population_id == pid)):
        problem = None
        if r.status not in STATUSES:
            problem = f"unknown status {r.status!r}"
        elif bad(r.epsilon_reserved) or bad(r.delta) or not r.delta < 1:
            problem = f"invalid reservation ε={r.epsilon_reserved!r}, δ={r.delta!r}"
        elif r.status == "committed" and bad(r.epsilon_spent, zero_ok=True):
            problem = f"invalid spent ε={r.epsilon_spent!r}"
        elif r.status != "committed" and r.epsilon_spent is not None:
            problem = f"a {r.status} reservation with spent ε={r.epsilon_spent!r}"
        elif (r.status == "reserved") != (r.closed_at is None):
            problem = f"status {r.status!r} with closed_at={r.closed_at!r}"
        if problem:
            raise PrivacyError(f"ledger: reservation {r.id} of population {pid!r} is corrupt ({problem}); "
                               "refusing to use the ledger until an operator repairs the row")
    charged = max((b["committed"] + b["reserved"] for b in _block_charges(conn, population)), default=0.0)
    overdrawn = conn.execute(select(func.count()).select_from(table).where(
        table.c.population_id == pid, table.c.note.like("%OVERDRAW%"))).scalar()
    if not _fits(charged, population.epsilon_budget) and not overdrawn:
        raise PrivacyError(f"ledger: population {pid!r} is charged ε={charged:g}, above its budget "
                           f"ε={population.epsilon_budget:g}, with no overdraw recorded: the budget was lowered "
                           "outside `dpsynth ledger set-budget`; refusing to use it until an operator repairs it")


def _missing_columns(conn: Connection) -> list[tuple[str, str]]:
    insp = inspect(conn)
    found = []
    for table, columns in _ADDED_COLUMNS.items():
        if insp.has_table(table):
            have = {c["name"] for c in insp.get_columns(table)}
            found += [(table, c) for c in columns if c not in have]
    return found


def _check_lifetime_delta(pid: str, delta: float, records: int) -> None:
    n = operator.index(records)
    if n < 1 or not delta < 1 / n:
        raise PrivacyError(f"delta: the lifetime δ={delta:g} of population {pid!r} must be < 1/n = "
                           f"{1 / max(n, 1):.6g} for its n = {n} records, or one record may leak outright; "
                           f"lower it with `{_set_budget_command(pid)}`")


def _settle_command(rid: int) -> str:
    return commands.dpsynth("ledger", "settle", str(rid), "--reason TEXT")


def _set_budget_command(pid: str) -> str:
    return commands.dpsynth("ledger", "set-budget", pid, "--epsilon E --delta D --reason TEXT")


def _check_text(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise PrivacyError(f"{field}: required, a non-empty text, got {value!r}")
    return value.strip()


def _fits(total: float, limit: float) -> bool:
    return total <= limit * (1 + TOLERANCE)


def _row_dict(row) -> dict[str, Any]:
    return {key: _iso(value) if isinstance(value, datetime) else value for key, value in row._mapping.items()}


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _iso(value: datetime) -> str:
    if value.tzinfo is None:  # SQLite keeps no zone; every timestamp here is written in UTC
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).isoformat()


def _check_id(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 200:
        raise PrivacyError(f"{field}: must be a non-empty string of at most 200 characters, got {value!r}")
    return value.strip()


def _check_sha256(value: Any, field: str = "dataset_sha256") -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raise PrivacyError(f"{field}: must be 64 hexadecimal digits, got {value!r}")
    return value.lower()


def _check_reservation_id(value: Any) -> int:
    try:
        rid = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        rid = None
    if rid is None or rid < 1:
        raise PrivacyError(f"reservation_id: must be a positive integer, got {value!r}")
    return rid
