"""Which databases `make up` (scripts/platform.sh) gives MLflow, the ledger and Airflow's metadata: PostgreSQL where a
server binary exists, else SQLite, saying why; a bad PLATFORM_DB is refused; Airflow migrates and opens (sync and
async) a real PostgreSQL metadata database. (Services are not started here: test_ui.py does.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests import pg_fixtures

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "platform.sh"
AIRFLOW_BIN = REPO / ".venv" / "airflow" / "bin"


def config(tmp_path, **env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DPSYNTH_", "MLFLOW_", "PG_", "PLATFORM_"))}
    return subprocess.run([str(SCRIPT), "config"], env={**base, "PLATFORM_DIR": str(tmp_path), **env},
                          capture_output=True, text=True, timeout=60)


def test_without_postgresql_it_falls_back_to_sqlite_and_says_so(tmp_path):
    out = config(tmp_path, PG_BIN=str(tmp_path / "no-such-dir"))
    assert out.returncode == 0, out.stderr
    assert "no PostgreSQL: PG_BIN=" in out.stdout
    assert f"MLflow backend store: sqlite:///{tmp_path}/mlflow.db" in out.stdout
    assert f"ledger: sqlite:///{tmp_path}/ledger.db" in out.stdout
    assert f"Airflow metadata: sqlite:///{tmp_path}/airflow/airflow.db" in out.stdout


def test_with_postgresql_mlflow_and_the_ledger_use_it(tmp_path):
    if why := pg_fixtures.unavailable():
        pytest.skip(f"no PostgreSQL server here: {why}")
    out = config(tmp_path, PG_PORT="55999")
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines())
    assert lines["database"].startswith(f"PostgreSQL in {tmp_path}/postgres (port 55999")
    assert lines["MLflow backend store"] == f"postgresql+psycopg2://dpsynth@/mlflow?host={tmp_path}/postgres&port=55999"
    assert lines["ledger"] == f"postgresql+psycopg2://dpsynth@/ledger?host={tmp_path}/postgres&port=55999"
    assert lines["Airflow metadata"] == f"postgresql+psycopg2://dpsynth@/airflow?host={tmp_path}/postgres&port=55999"
    explicit = config(tmp_path, DPSYNTH_LEDGER_URL="sqlite:////elsewhere/ledger.db")
    assert "ledger: sqlite:////elsewhere/ledger.db" in explicit.stdout  # an operator's choice wins


def test_a_bad_platform_db_is_refused(tmp_path):
    out = config(tmp_path, PLATFORM_DB="mysql")
    assert out.returncode == 2 and "PLATFORM_DB: must be postgres or sqlite" in out.stderr


CHECK = """
import asyncio
from sqlalchemy import text
from airflow import settings
settings.configure_orm()
with settings.engine.connect() as c:
    tables = c.execute(text("SELECT count(*) FROM information_schema.tables WHERE table_name IN ('dag', 'dag_run')")).scalar()
async def dags():
    async with settings.async_engine.connect() as c:  # Airflow 3 derives postgresql+asyncpg from the URL
        n = (await c.execute(text("SELECT count(*) FROM dag"))).scalar()
    await settings.async_engine.dispose()
    return n
print("RESULT", settings.SQL_ALCHEMY_CONN_ASYNC.split(":", 1)[0], tables, asyncio.run(dags()))
"""


@pytest.mark.skipif(not (AIRFLOW_BIN / "airflow").exists(), reason=".venv/airflow is missing: make airflow-venv")
def test_airflow_migrates_and_opens_its_metadata_database_on_postgresql(pg_server, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(AIRFLOW_HOME=str(tmp_path), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=pg_server.database("airflow"))
    migrated = subprocess.run([str(AIRFLOW_BIN / "airflow"), "db", "migrate"], env=env, capture_output=True, text=True,
                              timeout=300)
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    checked = subprocess.run([str(AIRFLOW_BIN / "python"), "-c", CHECK], env=env, capture_output=True, text=True,
                             timeout=120)
    assert checked.returncode == 0, checked.stderr[-3000:]
    [result] = [line.split()[1:] for line in checked.stdout.splitlines() if line.startswith("RESULT ")]
    assert result == ["postgresql+asyncpg", "2", "0"]
