"""#55 item 3: the upstream Airflow chart's install, as values-airflow.yaml and the dpsynth chart give it.

- The metadata database URL the dpsynth chart renders into the Secret values-airflow.yaml names
  (``data.metadataSecretName``) works with the Airflow image's own driver: ``airflow db check`` of .venv/airflow
  (requirements/airflow.lock, what images/airflow.Dockerfile installs) against a real PostgreSQL. The URL the runbook
  gave before (``postgresql://``) fails there with "No module named 'psycopg'".
- The login: the simple auth manager with values-airflow.yaml's settings keeps the passwords of the users' Secret
  (copied to a writable file, as the init container does) and issues a token for the right password only.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml
from sqlalchemy.engine import make_url

from tests.deploy.test_chart import CHART, CREDENTIALS, find, render, tools
from tests.airflow_fixtures import AIRFLOW_BIN

pytestmark = pytest.mark.skipif(not (AIRFLOW_BIN / "airflow").exists(), reason=".venv/airflow is missing")
VALUES = yaml.safe_load((CHART / "values-airflow.yaml").read_text())


def db_check(env: dict, url: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(AIRFLOW_BIN / "airflow"), "db", "check"], capture_output=True, text=True, timeout=180,
                          env={**env, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url})


@tools
def test_the_metadata_secret_works_with_the_airflow_images_driver(pg_server, airflow_env):
    docs = render(*CREDENTIALS)
    secret = find(docs, "Secret", "-airflow-metadata")
    assert secret["metadata"]["name"] == VALUES["data"]["metadataSecretName"]  # the Secret the upstream chart reads
    rendered = make_url(secret["stringData"]["connection"])
    assert (rendered.drivername, rendered.username, rendered.password, rendered.database) == (
        "postgresql+psycopg2", "dpsynth", "p@ss/word", "airflow")
    assert rendered.host == "dpsynth-postgresql.dpsynth.svc" and rendered.port == 5432
    # the same URL against a real server (its host, port and password)
    real = make_url(pg_server.database("airflow"))
    url = rendered.set(host=real.host, port=real.port, username=real.username, password=real.password,
                       database=real.database)
    ok = db_check(airflow_env, url.render_as_string(hide_password=False))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    old = db_check(airflow_env, url.set(drivername="postgresql").render_as_string(hide_password=False))
    assert old.returncode != 0 and "No module named 'psycopg'" in old.stdout + old.stderr
    # the runbook's command for credentials.create=false names the same driver
    assert "postgresql+psycopg2://" in (CHART / "values-airflow.yaml").read_text().split("metadataSecretName")[0]


def test_the_simple_auth_manager_logs_in_with_the_secrets_passwords(airflow_env, tmp_path):
    core = VALUES["config"]["core"]
    passwords = tmp_path / "auth" / "passwords.json"
    passwords.parent.mkdir()
    given = {"admin": "an-admin-secret", "operator": "an-op-secret", "auditor": "a-viewer-secret"}
    passwords.write_text(json.dumps(given))  # what the init container copies from the Secret dpsynth-airflow-users
    env = {**airflow_env, **{f"AIRFLOW__CORE__{k.upper()}": str(v) for k, v in core.items()},
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
           "AIRFLOW__API_AUTH__JWT_SECRET": "test-jwt-secret"}
    code = """
import json
from fastapi import HTTPException
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
from airflow.api_fastapi.auth.managers.simple.datamodels.login import LoginBody
from airflow.api_fastapi.auth.managers.simple.services.login import SimpleAuthManagerLogin
from airflow.api_fastapi.app import init_auth_manager
manager = init_auth_manager()  # the class [core] auth_manager names, as the api-server starts it
def login(user, password):
    try:
        return bool(SimpleAuthManagerLogin.create_token(LoginBody(username=user, password=password)))
    except HTTPException as exc:
        return exc.status_code
print(json.dumps({"class": type(manager).__name__, "users": [[u.username, u.role] for u in SimpleAuthManager.get_users()],
                  "ok": login("admin", "an-admin-secret"), "wrong": login("admin", "admin"),
                  "viewer": login("auditor", "a-viewer-secret")}))
"""
    proc = subprocess.run([str(AIRFLOW_BIN / "python"), "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["class"] == "SimpleAuthManager"
    assert out["users"] == [["admin", "admin"], ["operator", "op"], ["auditor", "viewer"]]
    assert out["ok"] is True and out["viewer"] is True and out["wrong"] == 401
    assert json.loads(passwords.read_text()) == given  # kept, not regenerated
    assert os.access(passwords, os.W_OK)
