"""Which databases `make up` (scripts/platform.sh) gives MLflow and the ledger: PostgreSQL where a server binary
exists, else SQLite, saying why; a bad PLATFORM_DB is refused. (Services are not started here: test_ui.py does.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests import pg_fixtures

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "platform.sh"


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


def test_with_postgresql_mlflow_and_the_ledger_use_it(tmp_path):
    if why := pg_fixtures.unavailable():
        pytest.skip(f"no PostgreSQL server here: {why}")
    out = config(tmp_path, PG_PORT="55999")
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines())
    assert lines["database"].startswith(f"PostgreSQL in {tmp_path}/postgres (port 55999")
    assert lines["MLflow backend store"] == f"postgresql+psycopg2://dpsynth@/mlflow?host={tmp_path}/postgres&port=55999"
    assert lines["ledger"] == f"postgresql+psycopg2://dpsynth@/ledger?host={tmp_path}/postgres&port=55999"
    explicit = config(tmp_path, DPSYNTH_LEDGER_URL="sqlite:////elsewhere/ledger.db")
    assert "ledger: sqlite:////elsewhere/ledger.db" in explicit.stdout  # an operator's choice wins


def test_a_bad_platform_db_is_refused(tmp_path):
    out = config(tmp_path, PLATFORM_DB="mysql")
    assert out.returncode == 2 and "PLATFORM_DB: must be postgres or sqlite" in out.stderr
