"""The lifetime privacy-budget ledger: every pipeline run is charged to its dataset's budget.

A *population* is a dataset identified across its versions by a declared id; it has one
lifetime budget (ε, δ). A pipeline run **reserves** its (ε, δ) before it touches the data
(failing fast if that would exceed the budget), **commits** the ε it actually spent
afterwards (freeing the unspent part of the reservation) or **releases** the reservation
when it fails before spending anything. Every run is charged: a retry or a re-run of the
same pipeline id makes a new reservation, and each committed one counts.

Runs compose by the *basic composition theorem*: mechanisms that are (ε_i, δ_i)-DP on the
same data are together (Σ ε_i, Σ δ_i)-DP. It is a conservative upper bound (advanced and
RDP composition across runs would be tighter), so the ledger refuses a reservation unless
committed ε + outstanding reserved ε + requested ε ≤ the budget's ε, and likewise the
δ of all charged runs, summed, ≤ the budget's δ.

The ledger lives in a real database so that concurrent runs cannot overspend: SQLite by
default, PostgreSQL on the cluster, through the same SQLAlchemy code. Every change is one
transaction that first takes a lock — ``BEGIN IMMEDIATE`` (the database write lock) on
SQLite, ``SELECT … FOR UPDATE`` on the population row elsewhere — and only then reads the
balance; a process that dies mid-transaction leaves nothing behind.

>>> import tempfile, os
>>> ledger = Ledger(f"sqlite:///{tempfile.mkdtemp()}/ledger.db")
>>> _ = ledger.set_budget("mnist", epsilon=10.0, delta=1e-5)
>>> rid = ledger.reserve("mnist", epsilon=4.0, delta=1e-6, dataset_sha256="ab" * 32,
...                      pipeline_run_id="run-1", accountant="rdp")
>>> ledger.commit(rid, epsilon_spent=3.5)
>>> ledger.balance("mnist")["remaining"]
6.5
"""

from __future__ import annotations

import math
import operator
import re
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from sqlalchemy import (
    CheckConstraint, Column, DateTime, Float, ForeignKey, Integer, MetaData, String, Table, Text,
    case, create_engine, event, func, insert, inspect, select, update,
)
from sqlalchemy.engine import Connection, make_url

from dpsynth import commands
from dpsynth.errors import PrivacyError
from dpsynth.privacy.validation import as_real, check_delta_range, check_epsilon

DEFAULT_URL = "sqlite:///outputs/ledger.db"
STATUSES = ("reserved", "committed", "released")
TOLERANCE = 1e-9  # floating-point slack: on ε spent vs reserved (absolute), on budgets (relative)

metadata = MetaData()

populations_table = Table(
    "populations", metadata,
    Column("population_id", String(200), primary_key=True),
    Column("epsilon_budget", Float, nullable=False),
    Column("delta", Float, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
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
    CheckConstraint("status IN ('reserved', 'committed', 'released')", name="ck_reservations_status"),
    CheckConstraint("epsilon_reserved > 0", name="ck_reservations_epsilon"),
    sqlite_autoincrement=True,  # ids are never reused, even after a rolled-back insert
)


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
        with self._transaction(write=False) as conn:
            missing = not all(inspect(conn).has_table(name) for name in metadata.tables)
        if missing:  # take the write lock only when there is something to create
            with self._transaction() as conn:
                metadata.create_all(conn)

    def set_budget(self, population_id: str, *, epsilon: float, delta: float) -> dict[str, Any]:
        """Create the population or change its lifetime budget; returns its :meth:`balance`.

        Refuses a budget below what is already charged (committed + reserved, in ε and in δ).
        """
        pid = _check_id(population_id, "population_id")
        eps = check_epsilon(epsilon, "epsilon")
        dlt = check_delta_range(delta, "delta")
        now = _now()
        with self._transaction() as conn:
            row = self._lock_population(conn, pid)
            if row is None:
                conn.execute(insert(populations_table).values(
                    population_id=pid, epsilon_budget=eps, delta=dlt, created_at=now, updated_at=now))
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
                             .values(epsilon_budget=eps, delta=dlt, updated_at=now))
            return _balance(conn, self._lock_population(conn, pid))

    def ensure_budget(self, population_id: str, *, epsilon: float, delta: float) -> bool:
        """Create the population with this lifetime budget unless it exists (whose budget stays as
        it is); returns whether it was created. One transaction: concurrent callers create it once."""
        pid = _check_id(population_id, "population_id")
        eps = check_epsilon(epsilon, "epsilon")
        dlt = check_delta_range(delta, "delta")
        with self._transaction() as conn:
            if self._lock_population(conn, pid) is not None:
                return False
            now = _now()
            conn.execute(insert(populations_table).values(
                population_id=pid, epsilon_budget=eps, delta=dlt, created_at=now, updated_at=now))
            return True

    def reserve(self, population_id: str, *, epsilon: float, delta: float, dataset_sha256: str,
                pipeline_run_id: str, accountant: str, stage: str = "train") -> int:
        """Reserve (ε, δ) for one run before it touches the data; returns the reservation id.

        Atomic: under the lock, refuses (PrivacyError, nothing written) unless
        committed + reserved + ``epsilon`` ≤ the ε budget and the δ's summed ≤ the δ budget.
        """
        pid = _check_id(population_id, "population_id")
        eps = check_epsilon(epsilon, "epsilon")
        dlt = check_delta_range(delta, "delta")
        sha = _check_sha256(dataset_sha256)
        run_id = _check_id(pipeline_run_id, "pipeline_run_id")
        acct = _check_id(accountant, "accountant")
        stage = _check_id(stage, "stage")
        with self._transaction() as conn:
            row = self._lock_population(conn, pid)
            if row is None:
                raise PrivacyError(
                    f"population_id: no budget for population {pid!r}; "
                    f"set one first with `{commands.dpsynth('ledger', 'set-budget', pid, '--epsilon E --delta D')}`")
            bal = _balance(conn, row)
            if not _fits(bal["committed"] + bal["reserved"] + eps, bal["budget"]):
                raise PrivacyError(
                    f"epsilon: population {pid!r} cannot afford ε={eps:g} for run {run_id!r}: "
                    f"lifetime budget ε={bal['budget']:g}, committed {bal['committed']:g}, "
                    f"reserved by runs in progress {bal['reserved']:g}, remaining {bal['remaining']:g}")
            if not _fits(bal["delta_used"] + dlt, bal["delta"]):
                raise PrivacyError(
                    f"delta: population {pid!r} cannot afford δ={dlt:g} for run {run_id!r}: "
                    f"lifetime budget δ={bal['delta']:g}, already charged (committed + reserved) "
                    f"{bal['delta_used']:g}; under basic composition the δ's of all runs add up")
            result = conn.execute(insert(reservations_table).values(
                population_id=pid, dataset_sha256=sha, pipeline_run_id=run_id, stage=stage,
                epsilon_reserved=eps, delta=dlt, status="reserved", accountant=acct, created_at=_now()))
            return int(result.inserted_primary_key[0])

    def commit(self, reservation_id: int, *, epsilon_spent: float, note: str | None = None) -> None:
        """Record the ε a run actually spent (≤ its reservation); the rest goes back to the budget.

        A run that failed after touching the data commits what it spent (its partial products
        exist); :meth:`release` is for runs that spent nothing.
        """
        spent = as_real(epsilon_spent, "epsilon_spent")
        if not 0 <= spent < math.inf:
            raise PrivacyError(f"epsilon_spent: must be a finite number >= 0, got {spent:g}")
        with self._transaction() as conn:
            row = self._lock_open_reservation(conn, reservation_id)
            if spent > row.epsilon_reserved + TOLERANCE:
                raise PrivacyError(
                    f"epsilon_spent: reservation {row.id} (population {row.population_id!r}, run "
                    f"{row.pipeline_run_id!r}) reserved ε={row.epsilon_reserved:g} but reports "
                    f"ε={spent:g} spent; a run must stop at its reservation (left open)")
            self._close(conn, row.id, status="committed", epsilon_spent=min(spent, row.epsilon_reserved),
                        note=note)

    def release(self, reservation_id: int, *, note: str) -> None:
        """Give a failed run's whole reservation back; ``note`` says why."""
        with self._transaction() as conn:
            row = self._lock_open_reservation(conn, reservation_id)
            self._close(conn, row.id, status="released", epsilon_spent=None, note=str(note))

    def balance(self, population_id: str) -> dict[str, Any]:
        """``budget``, ``committed``, ``reserved``, ``remaining`` (ε), ``delta`` and ``delta_used``."""
        pid = _check_id(population_id, "population_id")
        with self._transaction(write=False) as conn:
            row = conn.execute(select(populations_table).where(populations_table.c.population_id == pid)).first()
            if row is None:
                raise PrivacyError(
                    f"population_id: no budget for population {pid!r}; "
                    f"set one with `{commands.dpsynth('ledger', 'set-budget', pid, '--epsilon E --delta D')}`")
            return _balance(conn, row)

    def populations(self) -> list[dict[str, Any]]:
        """Every population with its budget and balance, by id."""
        with self._transaction(write=False) as conn:
            rows = conn.execute(select(populations_table).order_by(populations_table.c.population_id)).all()
            return [{**_row_dict(row), **_balance(conn, row)} for row in rows]

    def reservation(self, reservation_id: int) -> dict[str, Any]:
        """One reservation, as :meth:`history` lists it."""
        rid = _check_reservation_id(reservation_id)
        with self._transaction(write=False) as conn:
            row = conn.execute(select(reservations_table).where(reservations_table.c.id == rid)).first()
        if row is None:
            raise PrivacyError(f"reservation_id: no reservation {rid}")
        return _row_dict(row)

    def reservations(self, *, pipeline_run_id: str, status: str | None = None) -> list[dict[str, Any]]:
        """The reservations of one pipeline run (optionally only those with ``status``), oldest first."""
        table = reservations_table
        query = select(table).where(table.c.pipeline_run_id == _check_id(pipeline_run_id, "pipeline_run_id"))
        if status is not None:
            if status not in STATUSES:
                raise PrivacyError(f"status: must be one of {', '.join(STATUSES)}, got {status!r}")
            query = query.where(table.c.status == status)
        with self._transaction(write=False) as conn:
            return [_row_dict(row) for row in conn.execute(query.order_by(table.c.id))]

    def history(self, population_id: str | None = None) -> list[dict[str, Any]]:
        """Every reservation (of one population, or all), oldest first."""
        query = select(reservations_table).order_by(reservations_table.c.id)
        if population_id is not None:
            query = query.where(reservations_table.c.population_id == _check_id(population_id, "population_id"))
        with self._transaction(write=False) as conn:
            return [_row_dict(row) for row in conn.execute(query)]

    # -- internals ---------------------------------------------------------------------------

    @contextmanager
    def _transaction(self, *, write: bool = True) -> Iterator[Connection]:
        """One transaction; on SQLite a write one starts with BEGIN IMMEDIATE (the write lock)."""
        with self.engine.connect() as conn:
            conn.execution_options(dpsynth_write=write)
            with conn.begin():
                yield conn

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
    table = reservations_table
    charged = case((table.c.status == "committed", table.c.epsilon_spent), else_=table.c.epsilon_reserved)
    sums = {status: (eps or 0.0, dlt or 0.0) for status, eps, dlt in conn.execute(
        select(table.c.status, func.sum(charged), func.sum(table.c.delta))
        .where(table.c.population_id == population.population_id, table.c.status != "released")
        .group_by(table.c.status))}
    committed, delta_committed = sums.get("committed", (0.0, 0.0))
    reserved, delta_reserved = sums.get("reserved", (0.0, 0.0))
    return {
        "population_id": population.population_id,
        "budget": population.epsilon_budget,
        "committed": committed,
        "reserved": reserved,
        "remaining": population.epsilon_budget - committed - reserved,
        "delta": population.delta,
        "delta_used": delta_committed + delta_reserved,
    }


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


def _check_sha256(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raise PrivacyError(f"dataset_sha256: must be 64 hexadecimal digits, got {value!r}")
    return value.lower()


def _check_reservation_id(value: Any) -> int:
    try:
        rid = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        rid = None
    if rid is None or rid < 1:
        raise PrivacyError(f"reservation_id: must be a positive integer, got {value!r}")
    return rid
