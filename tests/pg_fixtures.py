"""A real PostgreSQL server for the tests, started by scripts/postgres.sh (the script `make up` uses).

A plugin of the test session (tests/conftest.py's ``pytest_plugins``): a test names the fixture, never imports it.
``pg_server`` (one per test process): a server on a private Unix socket and on 127.0.0.1 with password
authentication; ``pg_server.database(name)`` creates a database and returns its SQLAlchemy URL. ``postgres``:
libpq's environment (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) for a fresh database on it. Both skip,
with the reason, only where there is no PostgreSQL server binary (or, as root, no ``postgres`` user to run it
as) or no psycopg2.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy.engine import URL

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "postgres.sh"
USER, PASSWORD = "dpsynth", "s3cret:pw"


def unavailable() -> str | None:
    """Why no PostgreSQL server can be started here, or None."""
    if importlib.util.find_spec("psycopg2") is None:
        return "psycopg2 is not installed (requirements/stage.lock has psycopg2-binary: make venv)"
    found = subprocess.run([str(SCRIPT), "bin"], capture_output=True, text=True)
    if found.returncode:
        return found.stderr.strip() or "no PostgreSQL server binaries"
    if subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip() == "0" and \
            subprocess.run(["id", "postgres"], capture_output=True).returncode:
        return "running as root and there is no 'postgres' user to run PostgreSQL as"
    return None


@dataclass
class PgServer:
    root: Path
    port: int

    def __post_init__(self):
        self._names = itertools.count()

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of ``database`` over TCP with the password (as a cluster connects)."""
        return URL.create("postgresql+psycopg2", username=USER, password=PASSWORD, host="127.0.0.1",
                          port=self.port, database=database).render_as_string(hide_password=False)

    def database(self, prefix: str = "test") -> str:
        """A new, empty database; its URL."""
        name = f"{prefix}_{next(self._names)}"
        subprocess.run([str(SCRIPT), "start", str(self.root), str(self.port), name], check=True,
                       capture_output=True, timeout=120)
        return self.url(name)

    @property
    def env(self) -> dict[str, str]:
        return {"PGHOST": "127.0.0.1", "PGPORT": str(self.port), "PGUSER": USER, "PGPASSWORD": PASSWORD}


@pytest.fixture(scope="session")
def pg_server():
    why = unavailable()
    if why:
        pytest.skip(f"no PostgreSQL server here: {why}")
    root = Path(tempfile.mkdtemp(prefix="dpsynth-pg-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        started = subprocess.run([str(SCRIPT), "start", str(root), str(port)], capture_output=True, text=True,
                                 timeout=180, env={**os.environ, "PG_PASSWORD": PASSWORD, "PG_USER": USER})
        assert started.returncode == 0, started.stderr
        yield PgServer(root, port)
    finally:
        subprocess.run([str(SCRIPT), "stop", str(root)], capture_output=True, timeout=120)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres(pg_server):
    """libpq's environment for a fresh database on the session's server."""
    url = pg_server.database("env")
    return {**pg_server.env, "PGDATABASE": url.rsplit("/", 1)[1]}

