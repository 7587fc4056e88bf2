"""The local platform end to end, through its UIs: `scripts/platform.sh up` (MLflow + Airflow's four
services), trigger `dpsynth_train` from the Airflow trigger form in headless Chromium with ε = 8 and a tiny
training setting, wait for the DAG run to succeed (REST), then check in MLflow that the parent run has one
child per stage with its ε (train: 0 < ε ≤ 8), and in the platform's ledger that the form's population was
charged for the train attempt. Screenshots go to test-artifacts/. Needs Debian `chromium`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests import pg_fixtures
from tests.platform.cdp import Browser

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
STAGES = ["partition", "pretrain", "train", "audit", "sample", "evaluate"]
EPSILON = 9  # not the default 10; at δ = 1e-4 the default recipe's warm-up releases spend ε ≈ 8.7 of it
TINY = ["train.d_width=4", "train.g_width=4", "train.latent_dim=15", "warmup.steps=20", "train.batch_size=32", "sample.num_samples=200",
        "output.log_every=0", "output.sample_every=0", "output.checkpoint_every=0",
        "evaluate.epochs=1", "evaluate.feature_steps=5", "evaluate.mia_generated=200"]  # evaluate at its smallest
# the platform's settings (DPSYNTH_STAGE_CONFIG): a trigger may not give them (#55 item 5)
PLATFORM = {"tracking": {"experiment": "platform-ui"}, "partition": {"key": "dpsynth-partition-v1"},
            "data": {"num_classes": 10}}
POPULATION = "mnist600"
FORM = {"dataset_uri": None, "population_id": POPULATION, "epsilon": EPSILON, "delta": 1e-4, "steps": 10,
        "num_shards": 1, "n_d": "2", "pipeline_run_id": None, "overrides": "\n".join(TINY)}

# The slow tier (#35 item 5: the platform's five services and a browser, ~5 minutes of one worker): `make test-slow`,
# which CI runs after `make test`. The quick tier keeps the DAGs' own code (tests/pipelines/test_airflow.py,
# test_entry_points.py) and the six stages end to end (tests/stages/test_pipeline.py).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.platform,
    pytest.mark.skipif(not (REPO / ".venv" / "airflow" / "bin" / "airflow").exists(), reason=".venv/airflow is missing: make airflow-venv"),
    pytest.mark.skipif(not shutil.which("chromium"), reason="no chromium; to run them: apt-get install -y chromium (as root)"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A request's hang guard: Airflow's API server once answered nothing for 30 s while the other test worker of
# `make test-slow` and other jobs loaded the 2 cores (#53, 2026-11-29); a user's browser waits longer than that.
REQUEST_TIMEOUT = 120


def get(url: str, token: str | None = None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT) as r:
        return json.load(r)


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    home = tmp_path_factory.mktemp("platform")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "DPSYNTH_", "MLFLOW_"))}
    env.update(PLATFORM_DIR=str(home), MLFLOW_PORT=str(free_port()), AIRFLOW_PORT=str(free_port()),
               PG_PORT=str(free_port()))
    env["DPSYNTH_DATASET_URI"] = str(home / "data" / "mnist.parquet")  # what dpsynth_import_data writes
    env["DPSYNTH_STAGE_CONFIG"] = json.dumps(PLATFORM)
    script = str(REPO / "scripts" / "platform.sh")
    if pg_fixtures.unavailable() is None:  # MLflow's store and the ledger on PostgreSQL, as `make up` runs them
        # outside pytest's tmp dir, which the postgres user cannot reach when the tests run as root
        env["PG_DIR"] = tempfile.mkdtemp(prefix="dpsynth-platform-pg-")
        ledger = subprocess.run([str(pg_fixtures.SCRIPT), "url", env["PG_DIR"], env["PG_PORT"], "ledger"],
                                capture_output=True, text=True, check=True).stdout.strip()
    else:
        ledger = f"sqlite:///{home / 'ledger.db'}"
    try:
        subprocess.run([script, "up"], env=env, check=True, timeout=300)
        yield {"home": home, "ledger": ledger, "mlflow": f"http://127.0.0.1:{env['MLFLOW_PORT']}",
               "airflow": f"http://127.0.0.1:{env['AIRFLOW_PORT']}"}
    finally:
        subprocess.run([script, "down"], env=env, timeout=120)
        if "PG_DIR" in env:
            shutil.rmtree(env["PG_DIR"], ignore_errors=True)


@pytest.fixture
def browser():
    b = Browser()
    yield b
    b.close()


def fill_form(b: Browser, values: dict) -> None:
    """Type into the trigger form's fields as a user would: focus, select all, insert the text, move on."""
    for name, value in values.items():
        assert b.js(f"""(() => {{ const el = document.querySelector('[role=dialog] [name=element_{name}]');
                        if (!el) return false; el.scrollIntoView(); el.focus(); el.select(); return true; }})()"""), name
        b.send("Input.insertText", text=str(value))
        b.js("document.activeElement.blur()")


def wait(probe, timeout: float, every: float = 2):
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        assert time.monotonic() < deadline, f"timed out after {timeout}s"
        time.sleep(every)
    return value


def click(b: Browser, selector: str, text: str) -> None:
    """Click the enabled element matching SELECTOR whose text is TEXT (waiting for it)."""
    find = f"[...document.querySelectorAll({json.dumps(selector)})].find(x => x.textContent.trim() === {json.dumps(text)})"
    b.wait_for(f"{find} && !{find}.disabled", timeout=120)  # the Airflow UI renders slowly on a loaded 2-core machine
    b.js(f"{find}.click()")


def test_trigger_from_the_ui_and_see_epsilon_per_stage_in_mlflow(platform, browser, tmp_path):
    from mlflow import MlflowClient

    from dpsynth import tracking
    from dpsynth.data import import_source, write_parquet
    from dpsynth.ledger.store import Ledger

    source = tmp_path / "mnist600.parquet"
    write_parquet(import_source(REPO / "data" / "mnist").subset(np.arange(600)), source)
    run_id = f"ui-{int(time.time())}"
    airflow = platform["airflow"]
    # `up` gave the bundled MNIST's population its demo budget; this run's population gets one as an operator would
    ledger = Ledger(platform["ledger"])
    assert {p["population_id"]: p["budget"] for p in ledger.populations()} == {"mnist": 90}
    subprocess.run([str(REPO / ".venv" / "stage" / "bin" / "dpsynth"), "ledger", "set-budget", POPULATION,
                    "--db", platform["ledger"], "--epsilon", "50", "--delta", "1e-3", "--records", "600",
                    "--reason", "platform UI test"], check=True, timeout=120)

    browser.goto(f"{airflow}/dags/dpsynth_train")
    click(browser, "button", "Trigger")
    browser.wait_for("!!document.querySelector('[role=dialog] [name=element_epsilon]')")
    fill_form(browser, {**FORM, "dataset_uri": str(source), "pipeline_run_id": run_id})
    browser.screenshot(ARTIFACTS / "airflow-trigger-form.png")
    click(browser, "[role=dialog] button", "Trigger")

    token = get(f"{airflow}/auth/token")["access_token"]
    runs = lambda: get(f"{airflow}/api/v2/dags/dpsynth_train/dagRuns", token)["dag_runs"]  # noqa: E731
    wait(lambda: runs(), 30)
    (run,) = runs()
    assert run["conf"]["epsilon"] == EPSILON and run["conf"]["overrides"] == TINY, run["conf"]  # the form's values
    assert run["conf"]["steps"] == 10 and run["conf"]["pipeline_run_id"] == run_id, run["conf"]
    (run,) = wait(lambda: [r for r in runs() if r["state"] in ("success", "failed")], 480)  # a loaded 2-core CI box
    browser.goto(f"{airflow}/dags/dpsynth_train/runs/{run['dag_run_id']}")
    browser.wait_for("document.body.innerText.includes('finish')")
    time.sleep(1)
    browser.screenshot(ARTIFACTS / "airflow-dag-run.png")
    assert run["state"] == "success", f"DAG run {run['state']}; logs under {platform['home']}"

    client = MlflowClient(platform["mlflow"])
    exp = client.get_experiment_by_name("platform-ui")
    found = client.search_runs([exp.experiment_id], f"tags.`{tracking.TAG_PIPELINE_RUN_ID}` = '{run_id}'")
    (parent,) = [r for r in found if r.data.tags[tracking.TAG_STAGE] == "pipeline"]
    eps = {r.data.tags[tracking.TAG_STAGE]: float(r.data.tags[tracking.TAG_EPSILON_SPENT])
           for r in found if r is not parent}
    assert sorted(eps) == sorted(STAGES), eps
    assert 0 < eps["train"] <= EPSILON, eps
    assert parent.info.status == "FINISHED" and 0 < float(parent.data.tags[tracking.TAG_EPSILON_SPENT]) <= EPSILON
    (charged,) = ledger.reservations(pipeline_run_id=run_id)
    assert charged["population_id"] == POPULATION and charged["status"] == "committed"
    assert charged["epsilon_spent"] == pytest.approx(eps["train"], rel=1e-6)
    assert parent.data.tags[tracking.TAG_LEDGER_RESERVATION] == str(charged["id"])
    # the audited generator, released into the Model Registry under @released
    released = client.get_model_version_by_alias(tracking.registered_model_name(POPULATION, "dpgan"),
                                                 tracking.RELEASED_ALIAS)
    assert released.tags[tracking.TAG_PIPELINE_RUN_ID] == run_id and released.tags[tracking.TAG_AUDIT] == "passed"

    browser.goto(f"{platform['mlflow']}/#/experiments/{exp.experiment_id}/runs/{parent.info.run_id}")
    browser.wait_for(f"document.body.innerText.includes({json.dumps(parent.info.run_name or parent.info.run_id)})", 60)
    time.sleep(2)
    browser.screenshot(ARTIFACTS / "mlflow-parent-run.png")


def test_a_new_dataset_version_triggers_the_retrain_dag(platform):
    """The scheduler, not a test harness, fires ``dpsynth_retrain_on_new_data``: run the import DAG
    (REST, as a user or an upstream system would), and the Asset event it emits creates an
    asset-triggered run of the retrain DAG. That run would train at full size, so it is stopped."""
    airflow = platform["airflow"]
    token = get(f"{airflow}/auth/token")["access_token"]

    def call(method: str, path: str, body: dict):
        req = urllib.request.Request(f"{airflow}/api/v2/{path}", data=json.dumps(body).encode(), method=method,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT) as r:
            return json.load(r)

    def parsed(dag_id: str) -> bool:
        try:
            return bool(get(f"{airflow}/api/v2/dags/{dag_id}", token))
        except urllib.error.HTTPError as e:
            if e.code != 404:  # not yet parsed by the dag-processor when this test runs first
                raise
            return False

    for dag_id in ("dpsynth_import_data", "dpsynth_retrain_on_new_data"):
        wait(lambda: parsed(dag_id), 120)  # noqa: B023
        call("PATCH", f"dags/{dag_id}", {"is_paused": False})
    retrain_runs = lambda: get(f"{airflow}/api/v2/dags/dpsynth_retrain_on_new_data/dagRuns", token)["dag_runs"]  # noqa: E731
    assert retrain_runs() == []
    call("POST", "dags/dpsynth_import_data/dagRuns", {"logical_date": None, "conf": {"source": str(REPO / "data" / "mnist")}})
    imports = lambda: get(f"{airflow}/api/v2/dags/dpsynth_import_data/dagRuns", token)["dag_runs"]  # noqa: E731
    (done,) = wait(lambda: [r for r in imports() if r["state"] in ("success", "failed")], 180)
    assert done["state"] == "success", f"import DAG run {done['state']}; logs under {platform['home']}"
    assert (platform["home"] / "data" / "mnist.parquet").exists()

    (run,) = wait(retrain_runs, 120)
    assert run["run_type"] == "asset_triggered", run
    # Stop it as a user would (Mark as failed). Once, in CI on a loaded machine, the API server answered this with a 500
    # (its log went with that machine; not reproduced here, where the run is just being started by the scheduler): a
    # user would click again, so try again a few times on a 5xx, then check that the run did stop.
    path = f"dags/dpsynth_retrain_on_new_data/dagRuns/{run['dag_run_id']}"
    for attempt in range(5):
        try:
            call("PATCH", path, {"state": "failed"})
            break
        except urllib.error.HTTPError as e:
            body = e.read().decode(errors="replace")[:500]
            assert e.code >= 500 and attempt < 4, f"PATCH {path}: {e.code} {body}; logs under {platform['home']}/logs"
            time.sleep(3)
    assert get(f"{airflow}/api/v2/{path}", token)["state"] == "failed"
