"""A PostgreSQL role per zone on the ledger's database (``dpsynth ledger grant-roles``).

Run as the database's owner (the platform's role: the one that sets budgets), :func:`grant_roles` creates the
ledger's tables and its data key, then gives

- the **stage** role (the stage pods' ``DPSYNTH_LEDGER_URL``) what an attempt needs and no more: reading the
  budgets, reservations and data key; inserting reservations and the blocks each reads (never updating or deleting
  those), and updating only a reservation's closing columns (status,
  spent ε, note, heartbeat, steps, bound); updating a population's ``data_id`` and ``block_series`` (tying it to its
  first data and to its first numbering of privacy blocks; the grant also lets it lock the population's row,
  ``SELECT … FOR UPDATE``). No write on a budget
  (``populations.epsilon_budget``/``delta``) or on the budget history: ``set-budget`` is refused;
- the **auditor** role (the Privacy ledger page in MLflow) ``SELECT`` on populations, reservations, the blocks
  they read and budget history: no write at all, and not the data key (the page reads keyed data ids only).

Column grants cannot say *which* rows: a trigger (``reservations_closed_once``, for every role) keeps a closed
reservation closed — its status and closing time fixed, a committed one's spent ε only ever raised (a stale
reservation settled in full, then committed by its attempt, keeps the larger), a released one's never set — so no
role can lower what an earlier attempt was charged or reopen it. On an *open* reservation it lets ``epsilon_bound``
only rise, and lets a release, or a commit below the reservation's whole ε, through only in a transaction that shows
the secret of the attempt that opened it (``dpsynth.attempt_token``, whose sha256 the row keeps): another attempt
sharing the stage role can settle a dead attempt's reservation at its whole ε, never give any of it back. A second
trigger (``populations_block_series_once``) keeps a population's ``block_series`` once set: no role can untie it
from the numbering of blocks it was charged on (which would let a new import folder restart at block 0).

Re-running it resets both roles' grants on the ledger to these (and sets their passwords: a rotation). A newer
dpsynth's added columns are created by the owner here too (the stage role may not ``ALTER``): the chart runs it
at every install and upgrade (templates/ledger-roles.yaml).
"""

from __future__ import annotations

import re

from sqlalchemy import text
from sqlalchemy.engine import make_url

from dpsynth.errors import PrivacyError
from dpsynth.ledger.store import Ledger, _data_key

# (table, privileges) of each role; a privilege with columns is granted on those columns only
STAGE = (("populations", "SELECT"), ("reservations", "SELECT"), ("data_key", "SELECT"),
         ("reservations", "INSERT"), ("reservation_blocks", "SELECT"), ("reservation_blocks", "INSERT"),
         ("reservations", "UPDATE (status, epsilon_spent, closed_at, note, steps, heartbeat_at, epsilon_bound)"),
         ("populations", "UPDATE (data_id, block_series)"))
AUDITOR = (("populations", "SELECT"), ("reservations", "SELECT"), ("reservation_blocks", "SELECT"),
           ("budget_history", "SELECT"))
SEQUENCES = {"stage": ("reservations_id_seq",), "auditor": ()}  # ids of the rows a role inserts
TABLES = ("populations", "reservations", "reservation_blocks", "budget_history", "data_key")
CLOSED_ONCE = """
CREATE OR REPLACE FUNCTION dpsynth_reservation_closed_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.status = 'reserved' AND OLD.epsilon_bound IS NOT NULL
     AND (NEW.epsilon_bound IS NULL OR NEW.epsilon_bound < OLD.epsilon_bound) THEN
    RAISE EXCEPTION 'permission denied: reservation % is open: its epsilon_bound may only rise', OLD.id
          USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF OLD.status = 'reserved' AND (NEW.status = 'released' OR (NEW.status = 'committed' AND (NEW.epsilon_spent IS NULL
       OR NEW.epsilon_spent < GREATEST(OLD.epsilon_reserved, COALESCE(OLD.epsilon_bound, 0)) - 1e-9)))
     AND (OLD.token_sha256 IS NULL OR OLD.token_sha256 IS DISTINCT FROM encode(sha256(convert_to(
          COALESCE(current_setting('dpsynth.attempt_token', true), ''), 'UTF8')), 'hex')) THEN
    RAISE EXCEPTION 'permission denied: reservation % is held by another attempt: only the attempt that opened it '
                    'may release it or commit it below its whole epsilon (settle it at its whole instead)', OLD.id
          USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF OLD.status <> 'reserved' AND (
       NEW.status IS DISTINCT FROM OLD.status OR NEW.closed_at IS DISTINCT FROM OLD.closed_at
       OR (OLD.status = 'released' AND NEW.epsilon_spent IS NOT NULL)
       OR (OLD.status = 'committed' AND NOT (NEW.epsilon_spent >= OLD.epsilon_spent))) THEN
    RAISE EXCEPTION 'permission denied: reservation % is % (closed once: its status and closing time stay, '
                    'a committed one''s spent epsilon may only rise)', OLD.id, OLD.status
          USING ERRCODE = 'insufficient_privilege';
  END IF;
  RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS reservations_closed_once ON reservations;
CREATE TRIGGER reservations_closed_once BEFORE UPDATE ON reservations
  FOR EACH ROW EXECUTE FUNCTION dpsynth_reservation_closed_once();
CREATE OR REPLACE FUNCTION dpsynth_block_series_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.block_series IS NOT NULL AND NEW.block_series IS DISTINCT FROM OLD.block_series THEN
    RAISE EXCEPTION 'permission denied: population % is charged on the privacy blocks numbered %: its block_series '
                    'stays', OLD.population_id, OLD.block_series USING ERRCODE = 'insufficient_privilege';
  END IF;
  RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS populations_block_series_once ON populations;
CREATE TRIGGER populations_block_series_once BEFORE UPDATE ON populations
  FOR EACH ROW EXECUTE FUNCTION dpsynth_block_series_once();
"""


def grant_roles(url: str, *, stage_role: str, stage_password: str, auditor_role: str,
                auditor_password: str) -> list[str]:
    """Create (or update) the stage and auditor roles on the ledger at ``url`` (PostgreSQL, as its owner) with
    the grants of this module's docstring; returns the statements run, passwords left out."""
    if make_url(url).get_backend_name() != "postgresql":
        raise PrivacyError("ledger.url: per-zone database roles need PostgreSQL (a SQLite ledger is one file: "
                           "whoever can open it can write it)")
    roles = {"stage": _check_role(stage_role, "stage_role"), "auditor": _check_role(auditor_role, "auditor_role")}
    if roles["stage"] == roles["auditor"]:
        raise PrivacyError(f"auditor_role: must differ from stage_role, both are {roles['stage']!r}")
    passwords = {"stage": _check_password(stage_password, "stage_password"),
                 "auditor": _check_password(auditor_password, "auditor_password")}
    ledger = Ledger(url)  # creates the tables and adds new columns, as their owner
    done = []
    with ledger._transaction() as conn:
        _data_key(conn)  # made by the owner: the stage role only reads it

        def run(sql: str, **params) -> None:
            conn.execute(text(sql), params)
            done.append(sql)

        owner = conn.execute(text("SELECT current_user")).scalar()
        if owner in roles.values():
            raise PrivacyError(f"ledger.url: run this as the ledger database's owner, not as {owner!r}")
        for zone, role in roles.items():
            exists = conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).scalar()
            run(f'{"ALTER" if exists else "CREATE"} ROLE "{role}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE '
                "NOINHERIT PASSWORD :pw", pw=passwords[zone])
            done[-1] = done[-1].replace(":pw", "'…'")
            for table in TABLES:
                run(f'REVOKE ALL ON TABLE {table} FROM "{role}"')
            run(f'GRANT USAGE ON SCHEMA public TO "{role}"')
            for table, privilege in (STAGE if zone == "stage" else AUDITOR):
                run(f'GRANT {privilege} ON TABLE {table} TO "{role}"')
            for sequence in SEQUENCES[zone]:
                run(f'GRANT USAGE ON SEQUENCE {sequence} TO "{role}"')
        run("REVOKE CREATE ON SCHEMA public FROM PUBLIC")  # PostgreSQL < 15 lets every role create tables there
        with conn.connection.cursor() as cursor:  # as it is: no parameters (its body holds % and ;)
            cursor.execute(CLOSED_ONCE)
        done.append(CLOSED_ONCE.strip())
    return done


def _check_role(value: str, field: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", value):
        raise PrivacyError(f"{field}: a PostgreSQL role name (lower-case letters, digits, _), got {value!r}")
    return value


def _check_password(value: str, field: str) -> str:
    if not isinstance(value, str) or len(value) < 8:
        raise PrivacyError(f"{field}: required, at least 8 characters (`dpsynth ledger grant-roles` reads it from "
                           f"$DPSYNTH_LEDGER_{field.split('_')[0].upper()}_PASSWORD)")
    return value
