"""The chart's MLflow server, run here for real with the chart's rendered command, arguments and environment,
answers the clients the chart gives it (issue #34, item 1), and only with a login (issue #55, item 8: MLflow's basic
auth, on by default, in front of MLflow and the Privacy ledger page alike; its INI file written as the pod's
initContainer writes it).

MLflow 3's server accepts only localhost and private IPs as the Host header unless told otherwise
(``--allowed-hosts`` / ``MLFLOW_SERVER_ALLOWED_HOSTS``, ``mlflow/server/security_utils.py``); ``/health`` is
exempt, so readiness passed while every API call from a stage pod (``Host: <release>-mlflow.<ns>.svc:5000``)
got 403 "Invalid Host header". Only the stores differ from the cluster: the PostgreSQL backend store becomes a
SQLite file and the S3 artifact destination a local folder (neither is read by the host check), and the server runs
one worker process instead of MLflow's default four.
"""

from __future__ import annotations

import base64
import configparser
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.deploy.test_chart import CHART, REPO, find, render, tools

SEARCH = "/api/2.0/mlflow/experiments/search?max_results=1"
ADMIN = ("admin", "mlflow-admin-pw3")  # the chart's mlflow.auth.adminUsername, the auth Secret's password


def free_port() -> int:
    for port in range(5611, 5620):  # this branch's ports; any free one otherwise
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of container args and env values."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def server_command(docs: list[dict], tmp: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """The MLflow container's command line and environment as the chart renders them, with local stores; the
    initContainers run first (MLflow's auth INI, its database swapped for SQLite too)."""
    spec = find(docs, "Deployment", "-mlflow")["spec"]["template"]["spec"]
    [container] = spec["containers"]
    secrets = {"POSTGRES_PASSWORD": "pw", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
               "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN[1], "MLFLOW_FLASK_SERVER_SECRET_KEY": "csrf-key",
               "LEDGER_AUDITOR_PASSWORD": "auditor-pw"}  # the secretKeyRefs
    mounts = {v["name"]: tmp / v["name"] for v in spec.get("volumes") or [] if "emptyDir" in v}

    def environment(c: dict) -> dict[str, str]:
        env = {}
        for e in c.get("env") or []:
            env[e["name"]] = expand(e["value"], env) if "value" in e else secrets[e["valueFrom"]["secretKeyRef"]["key"]]
        for m in c.get("volumeMounts") or []:  # the pod's paths, under tmp
            for k, v in env.items():
                env[k] = v.replace(m["mountPath"], str(mounts[m["name"]]))
        return env

    for init in spec.get("initContainers") or []:
        for m in mounts.values():
            m.mkdir(exist_ok=True)
        assert init["command"][0] == "python"
        subprocess.run([sys.executable, *init["command"][1:]], env={**os.environ, **environment(init)}, check=True)
    env = environment(container)
    if "MLFLOW_AUTH_CONFIG_PATH" in env:  # the auth database: the rendered PostgreSQL URL becomes a SQLite file
        ini = configparser.ConfigParser()
        ini.read(env["MLFLOW_AUTH_CONFIG_PATH"])
        assert ini["mlflow"]["database_uri"].startswith("postgresql+psycopg2://dpsynth:pw@")
        ini["mlflow"]["database_uri"] = f"sqlite:///{tmp / 'auth.db'}"
        with open(env["MLFLOW_AUTH_CONFIG_PATH"], "w") as f:
            ini.write(f)
    env["DPSYNTH_LEDGER_URL"] = f"sqlite:///{tmp / 'ledger.db'}"
    args = []
    for arg in container["args"]:
        arg = expand(arg, env)
        if arg.startswith("--backend-store-uri="):
            arg = f"--backend-store-uri=sqlite:///{tmp / 'mlflow.db'}"
        elif arg.startswith(("--artifacts-destination=", "--default-artifact-root=")):
            arg = arg.split("=", 1)[0] + "=" + str(tmp / "artifacts")
        elif arg.startswith("--port="):
            arg = f"--port={port}"
        elif arg.startswith("--host="):
            arg = "--host=127.0.0.1"
        args.append(arg)
    assert container["command"][0] == "mlflow"
    command = [str(Path(sys.executable).parent / "mlflow"), *container["command"][1:], *args]
    return command, env


def get(port: int, path: str, host: str | None, login: tuple[str, str] | None = ADMIN, data: dict | None = None) -> int:
    """The status of a GET (a POST of ``data`` as JSON) with that Host header and basic-auth ``login``."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     data=None if data is None else json.dumps(data).encode())
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if host is not None:
        request.add_unredirected_header("Host", host)
    if login is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(login).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture(scope="module")
def chart_mlflow(tmp_path_factory):
    """`mlflow server` with the chart's rendered arguments (an ingress host set); its port."""
    if not (Path(sys.executable).parent / "mlflow").exists():
        pytest.skip("no mlflow in this venv (run with .venv/stage/bin/python)")
    tmp = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    docs = render("--set", "mlflow.ingressHost=mlflow.example.org")
    command, env = server_command(docs, tmp, port)
    # one worker process: the chart leaves MLflow's default (4), each a copy of the same app with the same host
    # allow-list and login; four of them cost four imports of MLflow and its auth app (most of this module's CPU)
    assert not [a for a in command if a.startswith(("--workers", "-w"))]
    command = [*command, "--workers=1"]
    paths = [str(REPO / "components"), str(REPO / "mlflow_plugins"), *filter(None, [os.environ.get("PYTHONPATH")])]
    full_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(paths)}
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen(command, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail("mlflow server exited:\n" + (tmp / "server.log").read_text()[-3000:])
            try:
                if get(port, "/health", None) == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        else:
            pytest.fail("mlflow server did not answer /health:\n" + (tmp / "server.log").read_text()[-3000:])
        yield port, docs
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        log.close()


@tools
@pytest.mark.parametrize("host", [
    "dpsynth-mlflow.dpsynth.svc:5000",            # the chart's MLFLOW_TRACKING_URI (stage pods, Airflow, KFP)
    "dpsynth-mlflow.dpsynth.svc.cluster.local:5000",
    "dpsynth-mlflow.dpsynth:5000", "dpsynth-mlflow:5000", "dpsynth-mlflow",
    "mlflow.example.org",                        # mlflow.ingressHost
    "localhost:5000",                            # kubectl port-forward
])
def test_the_chart_s_clients_reach_the_api(chart_mlflow, host):
    port, _ = chart_mlflow
    assert get(port, SEARCH, host) == 200


@tools
def test_the_ledger_page_is_on_by_default_and_served_to_the_service_host(chart_mlflow):
    port, docs = chart_mlflow
    [container] = find(docs, "Deployment", "-mlflow")["spec"]["template"]["spec"]["containers"]
    assert "--app-name=dpsynth-ledger" in container["args"]
    assert get(port, "/dpsynth/ledger.json", "dpsynth-mlflow.dpsynth.svc:5000") == 200


@tools
def test_mlflow_and_the_ledger_page_ask_for_a_login(chart_mlflow):
    """Item 8: on by default, MLflow's basic auth refuses a request without a login or with a wrong one (401), on the
    API and the ledger page alike; the admin gets both; a user of its own gets the API (READ, the default
    permission) but not the ledger page (every population's budget: MLflow fails closed on a route it has no rule
    for, so only admins)."""
    port, docs = chart_mlflow
    host = "dpsynth-mlflow.dpsynth.svc:5000"
    for path in (SEARCH, "/dpsynth/ledger", "/dpsynth/ledger.json"):
        assert get(port, path, host, login=None) == 401, path
        assert get(port, path, host, login=(ADMIN[0], "wrong")) == 401, path
        assert get(port, path, host) == 200, path
    assert get(port, "/api/2.0/mlflow/users/create", host, data={"username": "alice", "password": "alice-pw-123456"}) == 200
    assert get(port, SEARCH, host, login=("alice", "alice-pw-123456")) == 200
    assert get(port, "/dpsynth/ledger.json", host, login=("alice", "alice-pw-123456")) == 403
    assert get(port, "/health", host, login=None) == 200  # the probes' route stays open


@tools
def test_other_hosts_are_still_refused(chart_mlflow):
    """The allow-list is a list, not "*": DNS rebinding protection stays on."""
    port, _ = chart_mlflow
    assert get(port, SEARCH, "evil.example.com") == 403
    assert get(port, "/health", "evil.example.com") == 200  # exempt, as readiness probes are: why 403 went unseen


@tools
def test_helm_test_script_calls_the_api_with_the_service_host(chart_mlflow, tmp_path):
    """`helm test`'s script, pointed at the service URL (resolved here to the local server), checks the API, not
    only /health; the ledger part is left to test_chart.py (a real PostgreSQL), here it fails, as it must."""
    port, docs = chart_mlflow
    from tests.deploy.test_chart import helm_test_pod
    [container] = helm_test_pod(docs)["spec"]["containers"]
    url = {e["name"]: e.get("value") for e in container["env"]}["MLFLOW_URL"]
    assert url == "http://dpsynth-mlflow.dpsynth.svc:5000"
    runner = tmp_path / "run.py"
    runner.write_text(
        "import socket, sys\n"
        "orig = socket.getaddrinfo\n"
        "def resolve(host, port, *a, **k):\n"
        f"    return orig('127.0.0.1', {port}, *a, **k) if host.endswith('.svc') else orig(host, port, *a, **k)\n"
        "socket.getaddrinfo = resolve\n"
        "sys.argv = [sys.argv[1]]\n"
        "exec(compile(open(sys.argv[0]).read(), sys.argv[0], 'exec'))\n")
    login = {e["name"]: e.get("value") for e in container["env"]}["MLFLOW_TRACKING_USERNAME"]
    assert login == ADMIN[0]
    env = {"PATH": "/usr/bin:/bin", "MLFLOW_URL": url, "MLFLOW_TRACKING_USERNAME": login,
           "MLFLOW_TRACKING_PASSWORD": ADMIN[1], "PGHOST": "127.0.0.1", "PGPORT": "1", "PGUSER": "u",
           "PGPASSWORD": "p", "PGDATABASE": "ledger"}
    out = subprocess.run([sys.executable, str(runner), str(CHART / "files" / "test_connections.py")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert "MLflow /health: OK" in out.stdout, out.stdout + out.stderr
    assert "MLflow API (Host: dpsynth-mlflow.dpsynth.svc:5000): 200" in out.stdout, out.stdout + out.stderr
