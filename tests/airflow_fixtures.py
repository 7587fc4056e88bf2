"""The Airflow venv for the tests, which run in the stage venv: Airflow and the stage stack live in two venvs, so the
tests call the Airflow one as a subprocess, with AIRFLOW_HOME in a temporary directory (SQLite, no examples).

A plugin of the test session (tests/conftest.py's ``pytest_plugins``), not imported by test modules: a fixture imported
into a module is that module's own, and each module then made its own Airflow home, its own fork server (an Airflow
import, 4.7 CPU-s) and its own `airflow db migrate` (#53: 7 homes and 7 servers in the quick tier; now one home and
one server per test process, and the pod-security test's own). Fixtures: ``airflow_env`` (the Airflow venv's
environment, an Airflow home without a metadata database), ``migrated_db`` (a database just migrated by `airflow db
migrate`), ``airflow_db`` (a module's own home with a copy of it). Helpers: ``in_airflow`` (a snippet in a child of
the fork server), ``LOAD`` (the DAG folder's DagBag, without import errors).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
AIRFLOW_BIN = REPO / ".venv" / "airflow" / "bin"
DAGS = REPO / "pipelines" / "airflow" / "dags"

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: dummy, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: dummy, user: {token: dummy}}]
contexts: [{name: dummy, context: {cluster: dummy, user: dummy}}]
current-context: dummy
"""


@pytest.fixture(scope="session")
def airflow_env(tmp_path_factory) -> dict:
    """The Airflow venv's environment: an Airflow home without a metadata database (``airflow_db`` makes one), shared
    by the test process's modules, so that their snippets share one fork server (``in_airflow``)."""
    home = tmp_path_factory.mktemp("airflow_home")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "DPSYNTH_"))}
    env.update(AIRFLOW_HOME=str(home), AIRFLOW__CORE__DAGS_FOLDER=str(DAGS), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
               DPSYNTH_STAGE_BIN=str(Path(sys.executable).with_name("dpsynth")), PYTHONUNBUFFERED="1")
    return env


# The Airflow venv's fork servers of this test process (tests/airflow_server.py), one per environment
# that Airflow reads when imported: the rest of a snippet's environment (the DAGs' DPSYNTH_* settings, Airflow
# Variables and Connections, the fake CLI's log) is read while the DAGs are parsed or their tasks run, which each
# snippet does afresh in its child (Airflow's environment secrets backend reads os.environ at each lookup).
# A server is chosen regardless of PYTEST_CURRENT_TEST's value (Airflow's logging set-up reads only whether it is
# set): an environment copied from os.environ during a test names that test, and each test of test_pod_security and
# test_cluster_runbook started a server of its own (4 CPU-s each).
_SERVERS: dict[str, subprocess.Popen] = {}
_PARSE_TIME_ENV = ("DPSYNTH_", "AIRFLOW_VAR_", "AIRFLOW_CONN_", "FAKE_")


def _server(env: dict) -> subprocess.Popen:
    key = json.dumps(sorted((k, v if k != "PYTEST_CURRENT_TEST" else "set") for k, v in env.items()
                            if not k.startswith(_PARSE_TIME_ENV)))
    server = _SERVERS.get(key)
    if server is None or server.poll() is not None:
        server = _SERVERS[key] = subprocess.Popen(
            [str(AIRFLOW_BIN / "python"), str(Path(__file__).with_name("airflow_server.py"))], cwd=REPO, text=True,
            env={k: v for k, v in env.items() if not k.startswith(_PARSE_TIME_ENV)}, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        atexit.register(_stop, server)
    return server


def _stop(server: subprocess.Popen) -> None:
    """End a fork server: its input closed, it returns once its last child has ended."""
    server.stdin.close()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def in_airflow(code: str, env: dict) -> dict:
    """Run CODE with the Airflow venv's python and ENV (in a child of a fork server that has imported Airflow);
    it prints one JSON document as its last line."""
    server = _server(env)
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        server.stdin.write(json.dumps({"code": textwrap.dedent(code), "env": env, "stdout": str(out),
                                       "stderr": str(err)}) + "\n")
        server.stdin.flush()
        ready, _, _ = select.select([server.stdout], [], [], 120)
        if not ready:
            server.kill()
        assert ready, "the snippet ran past 120 s"
        reply = server.stdout.readline()
        assert reply, "the Airflow fork server ended"
        assert json.loads(reply)["rc"] == 0, err.read_text()[-5000:]
        return json.loads(out.read_text().strip().splitlines()[-1])


LOAD = """
    import json
    from airflow.dag_processing.dagbag import DagBag
    bag = DagBag()
    assert not bag.import_errors, bag.import_errors
"""


@pytest.fixture(scope="session")
def migrated_db(airflow_env, tmp_path_factory) -> Path:
    """A metadata database just migrated by `airflow db migrate` (once a test process: each user takes a copy)."""
    home = tmp_path_factory.mktemp("airflow_migrated")
    env = {**airflow_env, "AIRFLOW_HOME": str(home),
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}"}
    subprocess.run([str(AIRFLOW_BIN / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    return home / "airflow.db"


@pytest.fixture(scope="module")
def airflow_db(airflow_env, migrated_db, tmp_path_factory) -> dict:
    """``airflow_env`` with an Airflow home of the module's own and its metadata database migrated."""
    home = tmp_path_factory.mktemp("airflow_db")
    shutil.copyfile(migrated_db, home / "airflow.db")
    return {**airflow_env, "AIRFLOW_HOME": str(home), "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}"}
