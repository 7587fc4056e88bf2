"""The chart's ledger roles (#34 item 5), rendered and then run: the ledger-roles Job's own command, against a real
PostgreSQL, gives the rendered stage Secret's URL a role that reserves and commits but cannot set a budget, and MLflow's
ledger page URL one that only reads; only the ledger-admin Secret's URL (the owner) sets budgets."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from sqlalchemy.engine import make_url

from dpsynth.errors import PrivacyError
from dpsynth.ledger.store import Ledger
from tests.deploy.test_chart import CHART, CREDENTIALS, HELM, REQUIRED, find, render, tools
from tests.deploy.test_mlflow_hosts import expand
from tests.pg_fixtures import PASSWORD

SHA = "cd" * 32


def refs(container: dict) -> dict[str, tuple[str, str]]:
    return {e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for e in container.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}


@tools
def test_each_zone_gets_its_own_ledger_url():
    docs = render(*CREDENTIALS)
    admin = find(docs, "Secret", "-ledger-admin")
    assert admin["metadata"].get("namespace") is None  # the release namespace, not the stages'
    assert make_url(admin["stringData"]["DPSYNTH_LEDGER_URL"]).username == "dpsynth"  # the owner: sets budgets
    stage = find(docs, "Secret", "dpsynth-stage")["stringData"]["DPSYNTH_LEDGER_URL"]
    assert make_url(stage).username == "dpsynth_stage"
    [mlflow] = find(docs, "Deployment", "-mlflow")["spec"]["template"]["spec"]["containers"]
    page = {e["name"]: e.get("value") for e in mlflow["env"]}["DPSYNTH_LEDGER_URL"]
    assert page.startswith("postgresql+psycopg2://dpsynth_auditor:$(LEDGER_AUDITOR_PASSWORD)@")
    job = find(docs, "Job", "-ledger-roles")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    [c] = job["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["dpsynth", "ledger", "grant-roles"]
    assert c["args"] == ["--stage-role", "dpsynth_stage", "--auditor-role", "dpsynth_auditor"]
    assert refs(c) == {"DPSYNTH_LEDGER_URL": ("dpsynth-ledger-admin", "DPSYNTH_LEDGER_URL"),
                       "DPSYNTH_LEDGER_STAGE_PASSWORD": ("dpsynth-credentials", "LEDGER_STAGE_PASSWORD"),
                       "DPSYNTH_LEDGER_AUDITOR_PASSWORD": ("dpsynth-credentials", "LEDGER_AUDITOR_PASSWORD")}
    # nothing but the Job reads the platform role's URL
    users = [d["metadata"]["name"] for d in docs if "ledger-admin" in str(d) and d["kind"] != "Secret"]
    assert users == ["dpsynth-ledger-roles"], users
    other = render(*CREDENTIALS, "--set", "ledger.roles.stage=pods", "--set", "ledger.adminSecret=platform-ledger")
    assert make_url(find(other, "Secret", "dpsynth-stage")["stringData"]["DPSYNTH_LEDGER_URL"]).username == "pods"
    assert find(other, "Secret", "platform-ledger")["kind"] == "Secret"


@tools
def test_a_missing_role_password_fails_the_install():
    without = [a for i, a in enumerate(CREDENTIALS) if "ledgerStagePassword" not in (CREDENTIALS + [""])[i + 1]
               and "ledgerStagePassword" not in a]
    proc = subprocess.run([str(HELM), "template", "dpsynth", str(CHART), *REQUIRED, *without],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "credentials.ledgerStagePassword" in proc.stderr


@tools
def test_the_rendered_job_and_urls_on_a_real_postgresql(pg_server):
    docs = render(*CREDENTIALS)
    creds = find(docs, "Secret", "-credentials")["stringData"]
    server = make_url(pg_server.database("chart"))

    def here(url: str, **change):  # the rendered URL, pointed at this machine's server
        return make_url(url).set(host=server.host, port=server.port, database=server.database,
                                 **change).render_as_string(hide_password=False)

    admin_url = here(find(docs, "Secret", "-ledger-admin")["stringData"]["DPSYNTH_LEDGER_URL"], password=PASSWORD)
    [job] = find(docs, "Job", "-ledger-roles")["spec"]["template"]["spec"]["containers"]
    env = {"DPSYNTH_LEDGER_URL": admin_url, **{name: creds[key] for name, (secret, key) in refs(job).items()
                                                 if secret == "dpsynth-credentials"}}
    base = {k: v for k, v in os.environ.items() if not k.startswith("DPSYNTH_LEDGER")}
    for _ in range(2):  # install, then upgrade
        done = subprocess.run([sys.executable, "-m", "dpsynth.cli", *job["command"][1:], *job["args"]],
                              env={**base, **env}, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    Ledger(admin_url).set_budget("mnist", epsilon=10.0, delta=1e-5, reason="initial budget")

    stage = Ledger(here(find(docs, "Secret", "dpsynth-stage")["stringData"]["DPSYNTH_LEDGER_URL"]))
    rid = stage.reserve("mnist", epsilon=3.0, delta=1e-6, dataset_sha256=SHA, pipeline_run_id="run-1",
                        accountant="rdp", records=10_000)
    stage.commit(rid, epsilon_spent=2.5)
    with pytest.raises(PrivacyError, match="'dpsynth_stage' may not do this"):
        stage.set_budget("mnist", epsilon=1000.0, delta=1e-5, reason="escape the budget")
    set_budget = subprocess.run(  # the CLI an operator would run, with the stage pods' URL: exit 2, why
        [sys.executable, "-m", "dpsynth.cli", "ledger", "set-budget", "mnist", "--epsilon", "1000", "--delta", "1e-5",
         "--reason", "more", "--db", stage.engine.url.render_as_string(hide_password=False)],
        env=base, capture_output=True, text=True, timeout=120)
    assert set_budget.returncode == 2 and "permission denied" in set_budget.stderr, set_budget.stderr

    [mlflow] = find(docs, "Deployment", "-mlflow")["spec"]["template"]["spec"]["containers"]
    page = {e["name"]: e.get("value") for e in mlflow["env"]}["DPSYNTH_LEDGER_URL"]
    auditor = Ledger(here(expand(page, {"LEDGER_AUDITOR_PASSWORD": creds["LEDGER_AUDITOR_PASSWORD"]})))
    assert auditor.balance("mnist")["remaining"] == pytest.approx(7.5)
    with pytest.raises(PrivacyError, match="'dpsynth_auditor' may not do this"):
        auditor.reserve("mnist", epsilon=1.0, delta=1e-7, dataset_sha256=SHA, pipeline_run_id="run-2",
                        accountant="rdp", records=10_000)
    assert Ledger(admin_url).set_budget("mnist", epsilon=12.0, delta=1e-5, reason="raised")["budget"] == 12.0
