"""Per-zone database roles on a real PostgreSQL ledger (#34 item 5): the stage pods' role reserves and commits but
cannot set a budget; the auditors' role reads and writes nothing. Skipped only where no PostgreSQL server can be
started (tests/pg_fixtures.py)."""

from __future__ import annotations

import itertools
import json
import os

import pytest
from sqlalchemy.engine import make_url

from dpsynth.errors import PrivacyError
from dpsynth.ledger.roles import grant_roles
from dpsynth.ledger.store import Ledger

SHA = "ab" * 32
_names = itertools.count()


def as_role(url: str, role: str, password: str) -> str:
    return make_url(url).set(username=role, password=password).render_as_string(hide_password=False)


@pytest.fixture
def zones(pg_server):
    """(admin URL, stage URL, auditor URL) of a fresh ledger database whose roles were granted."""
    admin = pg_server.database("roles")
    n = next(_names)
    stage, auditor = f"stage_{n}", f"auditor_{n}"
    grant_roles(admin, stage_role=stage, stage_password="stage-pw:1", auditor_role=auditor,
                auditor_password="auditor-pw/2")
    Ledger(admin).set_budget("mnist", epsilon=10.0, delta=1e-5, reason="initial budget")
    return admin, as_role(admin, stage, "stage-pw:1"), as_role(admin, auditor, "auditor-pw/2")


def test_the_stage_role_reserves_and_commits_but_cannot_set_a_budget(zones):
    admin, stage_url, _ = zones
    stage = Ledger(stage_url)
    rid, _ = stage.open_attempt("mnist", epsilon=4.0, delta=1e-6, dataset_sha256=SHA, pipeline_run_id="run-1",
                                accountant="rdp", records=10_000, stage="train", attempt_id="a1", resumes_id=None,
                                stale_after_s=3600.0, content_sha256=SHA)
    stage.heartbeat(rid, steps=10)
    stage.commit(rid, epsilon_spent=3.5)
    rid2 = stage.reserve("mnist", epsilon=1.0, delta=1e-7, dataset_sha256=SHA, pipeline_run_id="run-2",
                         accountant="rdp", records=10_000)
    stage.release(rid2, note="failed before training")
    assert stage.balance("mnist")["remaining"] == pytest.approx(6.5)
    for change in (dict(epsilon=100.0), dict(epsilon=10.0, delta=1e-4)):
        with pytest.raises(PrivacyError, match=r"ledger\.url: the ledger's database role 'stage_\d+' may not do "
                                               r"this \(permission denied.*sets budgets"):
            stage.set_budget("mnist", delta=change.pop("delta", 1e-5), reason="more", **change)
    with pytest.raises(PrivacyError, match="permission denied"):  # nor create a population
        stage.set_budget("fresh", epsilon=100.0, delta=1e-5, reason="a fresh budget")
    assert Ledger(admin).balance("mnist")["budget"] == 10.0 and [p["population_id"] for p in
                                                                 Ledger(admin).populations()] == ["mnist"]
    assert len(Ledger(admin).budget_history("mnist")) == 1


def test_the_stage_role_ties_a_population_to_its_blocks_and_no_role_unties_it(zones):
    """#54: the stage role records the numbering of blocks a population is first charged on (a column grant), and the
    trigger keeps it: no role may clear or change it, which would let a new import folder restart at block 0."""
    admin, stage_url, _ = zones
    stage = Ledger(stage_url)
    rid = stage.reserve("mnist", epsilon=1.0, delta=1e-7, dataset_sha256=SHA, pipeline_run_id="run-1",
                        accountant="rdp", records=10_000, blocks=[0, 1], block_series="series-a")
    stage.commit(rid, epsilon_spent=1.0)
    with pytest.raises(PrivacyError, match="data.uri: population 'mnist' .* numbered by another import folder"):
        stage.reserve("mnist", epsilon=1.0, delta=1e-7, dataset_sha256=SHA, pipeline_run_id="run-2",
                      accountant="rdp", records=10_000, blocks=[0], block_series="series-b")
    for url in (stage_url, admin):
        engine = Ledger(url).engine
        for value in ("NULL", "'series-b'"):
            with pytest.raises(Exception, match="permission denied"), engine.begin() as conn:
                conn.exec_driver_sql(f"UPDATE populations SET block_series = {value} WHERE population_id = 'mnist'")


def test_the_stage_role_cannot_rewrite_what_a_reservation_charges(zones):
    _, stage_url, _ = zones
    stage = Ledger(stage_url)
    rid = stage.reserve("mnist", epsilon=4.0, delta=1e-6, dataset_sha256=SHA, pipeline_run_id="run-1",
                        accountant="rdp", records=10_000)
    with stage.engine.begin() as conn, pytest.raises(Exception, match="permission denied"):
        conn.exec_driver_sql(f"UPDATE reservations SET epsilon_reserved = 0.001 WHERE id = {rid}")
    with stage.engine.begin() as conn, pytest.raises(Exception, match="permission denied"):
        conn.exec_driver_sql("DELETE FROM reservations")


def test_no_role_reopens_a_closed_reservation_or_lowers_what_it_charged(zones):
    """Column grants cannot say which rows: the trigger keeps a closed reservation closed, for every role."""
    admin, stage_url, _ = zones
    stage = Ledger(stage_url)
    committed = stage.reserve("mnist", epsilon=4.0, delta=1e-6, dataset_sha256=SHA, pipeline_run_id="run-1",
                              accountant="rdp", records=10_000)
    stage.commit(committed, epsilon_spent=3.5)
    released = stage.reserve("mnist", epsilon=1.0, delta=1e-7, dataset_sha256=SHA, pipeline_run_id="run-2",
                             accountant="rdp", records=10_000)
    stage.release(released, note="failed before training")
    for url in (stage_url, admin):
        for sql in (f"UPDATE reservations SET epsilon_spent = 0.001 WHERE id = {committed}",
                    f"UPDATE reservations SET status = 'reserved', closed_at = NULL, epsilon_spent = NULL "
                    f"WHERE id = {committed}",
                    f"UPDATE reservations SET status = 'released', epsilon_spent = NULL WHERE id = {committed}",
                    f"UPDATE reservations SET status = 'committed', epsilon_spent = 0 WHERE id = {released}"):
            with Ledger(url).engine.begin() as conn, pytest.raises(Exception, match="closed once"):
                conn.exec_driver_sql(sql)
    with stage.engine.begin() as conn:  # what the ledger itself does to a closed row: raise the spent ε, add a note
        conn.exec_driver_sql(f"UPDATE reservations SET epsilon_spent = 3.9, note = 'more' WHERE id = {committed}")
    assert Ledger(admin).balance("mnist")["committed"] == pytest.approx(3.9)


def test_the_stage_role_cannot_give_back_another_attempts_open_reservation(zones):
    """#52 finding 6: the trigger guards open reservations too. Another process sharing the stage role may settle a
    dead attempt's reservation at its whole ε, never release it, commit it below that, or lower its bound."""
    admin, stage_url, _ = zones
    holder = Ledger(stage_url)
    rid, _ = holder.open_attempt("mnist", epsilon=2.0, delta=1e-6, dataset_sha256=SHA, pipeline_run_id="run-1",
                                 accountant="rdp", records=10_000, stage="train", attempt_id="a1", resumes_id=None,
                                 stale_after_s=None)
    holder.raise_bound(rid, epsilon=5.0, why="as_published: no guard")
    other = Ledger(stage_url)
    for sql in (f"UPDATE reservations SET status = 'released', closed_at = now() WHERE id = {rid}",
                f"UPDATE reservations SET status = 'committed', closed_at = now(), epsilon_spent = 0 WHERE id = {rid}",
                f"UPDATE reservations SET status = 'committed', closed_at = now(), epsilon_spent = 2 WHERE id = {rid}",
                f"UPDATE reservations SET epsilon_bound = 0.5 WHERE id = {rid}",
                f"UPDATE reservations SET epsilon_bound = NULL WHERE id = {rid}"):
        for url in (stage_url, admin):
            with Ledger(url).engine.begin() as conn, pytest.raises(Exception, match="permission denied"):
                conn.exec_driver_sql(sql)
    with other.engine.begin() as conn, pytest.raises(Exception, match="held by another attempt"):  # a guessed secret
        conn.exec_driver_sql("SELECT set_config('dpsynth.attempt_token', 'guess', true)")
        conn.exec_driver_sql(f"UPDATE reservations SET status = 'released', closed_at = now() WHERE id = {rid}")
    for close in (lambda: other.release(rid, note="not mine"), lambda: other.commit(rid, epsilon_spent=0.0)):
        with pytest.raises(PrivacyError, match=f"reservation {rid} .*is held by another attempt"):
            close()
    other.raise_bound(rid, epsilon=1.0, why="lower")  # a lower bound is ignored: a bound only rises
    assert Ledger(admin).reservation(rid)["epsilon_bound"] == 5.0
    holder.heartbeat(rid, steps=3)
    holder.commit(rid, epsilon_spent=1.5)  # the attempt that opened it closes it below its whole
    assert Ledger(admin).reservation(rid)["epsilon_spent"] == 1.5
    dead = holder.reserve("mnist", epsilon=1.0, delta=1e-7, dataset_sha256=SHA, pipeline_run_id="run-2",
                          accountant="rdp", records=10_000)
    assert other.settle(dead, reason="its pod is gone")["epsilon_spent"] == 1.0  # anyone settles at the whole


def test_the_auditor_role_reads_and_cannot_write(zones):
    admin, stage_url, auditor_url = zones
    Ledger(stage_url).reserve("mnist", epsilon=2.0, delta=1e-6, dataset_sha256=SHA, pipeline_run_id="run-1",
                              accountant="rdp", records=10_000)
    auditor = Ledger(auditor_url)
    assert auditor.balance("mnist")["reserved"] == 2.0
    assert [p["population_id"] for p in auditor.populations()] == ["mnist"]
    assert len(auditor.history("mnist")) == 1 and len(auditor.budget_history()) == 1
    with pytest.raises(PrivacyError, match="permission denied"):
        auditor.set_budget("mnist", epsilon=100.0, delta=1e-5, reason="more")
    with pytest.raises(PrivacyError, match="permission denied"):
        auditor.reserve("mnist", epsilon=1.0, delta=1e-7, dataset_sha256=SHA, pipeline_run_id="run-2",
                        accountant="rdp", records=10_000)
    [row] = Ledger(admin).history("mnist")
    with pytest.raises(PrivacyError, match="permission denied"):
        auditor.commit(row["id"], epsilon_spent=2.0)  # at its whole ε: the database refuses the auditor
    with auditor.engine.begin() as conn, pytest.raises(Exception, match="permission denied"):
        conn.exec_driver_sql("SELECT key FROM data_key")  # the ledger's key of data ids stays the platform's


def test_grant_roles_from_the_cli_is_idempotent_and_needs_postgresql(pg_server, tmp_path, monkeypatch,
                                                                     capsys):
    """`dpsynth ledger grant-roles` (its main, in this process: the command reads its passwords from the
    environment, set here as a pod's would be)."""
    from dpsynth.cli import main

    admin = pg_server.database("roles")
    n = next(_names)
    env = {"DPSYNTH_LEDGER_STAGE_PASSWORD": "stage-pw:1", "DPSYNTH_LEDGER_AUDITOR_PASSWORD": "auditor-pw/2"}
    cmd = ["ledger", "grant-roles", "--stage-role", f"stage_{n}", "--auditor-role", f"auditor_{n}", "--json"]

    def run(*argv, environ):
        for name in [k for k in os.environ if k.startswith("DPSYNTH_LEDGER")]:
            monkeypatch.delenv(name)
        for name, value in environ.items():
            monkeypatch.setenv(name, value)
        capsys.readouterr()
        code = main([*cmd, *argv])
        return code, *capsys.readouterr()

    for _ in range(2):  # a re-run (every helm upgrade) succeeds and leaves the same grants
        code, out, err = run("--db", admin, environ=env)
        assert code == 0, err
        assert "PASSWORD '…'" in json.loads(out)["statements"][0] and "stage-pw" not in out
    Ledger(admin).set_budget("mnist", epsilon=10.0, delta=1e-5, reason="initial budget")
    Ledger(as_role(admin, f"stage_{n}", "stage-pw:1")).reserve(
        "mnist", epsilon=1.0, delta=1e-7, dataset_sha256=SHA, pipeline_run_id="r", accountant="rdp", records=10_000)
    code, _, err = run("--db", f"sqlite:///{tmp_path}/ledger.db", environ=env)
    assert code == 2 and "ledger.url: per-zone database roles need PostgreSQL" in err
    code, _, err = run("--db", admin, environ={})
    assert code == 2 and "DPSYNTH_LEDGER_STAGE_PASSWORD" in err
