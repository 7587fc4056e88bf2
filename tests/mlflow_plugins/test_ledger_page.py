"""The "Privacy ledger" page of dpsynth_mlflow, served by a real `mlflow server --app-name dpsynth-ledger`
over the ledger and MLflow runs of real (tiny) pipeline runs, read in headless Chromium.

Every expected value comes from the ledger, the MLflow runs or the stage manifests directly, not from
the page's own code. The screenshot goes to test-artifacts/mlflow-privacy-ledger.png.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from dpsynth import tracking
from dpsynth.ledger.store import Ledger
from tests.stages.helpers import dpsynth, manifest, settings

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
MLFLOW = Path(sys.executable).with_name("mlflow")
INSTALLED = any(e.name == "dpsynth-ledger" for e in entry_points(group="mlflow.app"))

pytestmark = [
    pytest.mark.skipif(not INSTALLED, reason="dpsynth-mlflow is not installed: pip install --no-deps -e mlflow_plugins"),
    pytest.mark.skipif(not shutil.which("chromium"), reason="no chromium: apt-get install -y chromium"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, source, capsys_module):
    """Population mnist600 (budget ε=100, set beforehand as an operator does) and what was charged to it:
    pipeline run p-page, audited and released, whose train stage took two attempts (the first left its
    reservation open, as a killed task does; the retry settled it in full); p-early, refused by partition
    before any training (charged nothing); and a standalone `dpsynth train` attempt released before its
    first private step."""
    capsys = capsys_module
    home = tmp_path_factory.mktemp("ledger-page")
    uri = f"sqlite:///{home / 'mlflow.db'}"
    ledger_url = f"sqlite:///{home / 'ledger.db'}"  # beside mlflow.db: where the stages look for it
    ledger = Ledger(ledger_url)
    ledger.set_budget("mnist600", epsilon=100.0, delta=1e-3, records=600, reason="ledger page test")
    tracked = ("tracking.enabled=true", f"tracking.uri={uri}", "tracking.experiment=ledger-page")
    run_dir = home / "runs" / "p-page"
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("DPSYNTH_LEDGER_URL", raising=False)
        # the orchestrators' path (start, each stage, finish), up to the release: evaluate adds nothing here
        assert dpsynth("pipeline", "start", "--run-dir", run_dir, "--pipeline-run-id", "p-page",
                       *settings(source, *tracked)) == 0
        parent = json.loads(capsys.readouterr().out)["parent_run_id"]
        ids = ["--run-dir", run_dir, "--parent-run-id", parent, "--pipeline-run-id", "p-page"]
        for stage in ("partition", "pretrain", "train", "audit", "sample"):
            if stage == "train":  # a first train attempt that died holding its reservation (no checkpoint)
                killed = ledger.reserve("mnist600", epsilon=10.0, delta=1e-4, pipeline_run_id="p-page",
                                        dataset_sha256=manifest(run_dir, "sensitive", "partition")["dataset_sha256"],
                                        accountant="rdp", records=600)
            assert dpsynth(stage, *ids, *settings(source, *tracked)) == 0, stage
        dpsynth("pipeline", "finish", *ids, *settings(source, *tracked))
        assert dpsynth("pipeline", "run", "--run-dir", home / "runs" / "p-early", "--pipeline-run-id", "p-early",
                       *settings(source, *tracked, "partition.num_shards=50000")) == 2
    released = ledger.reserve("mnist600", epsilon=10.0, delta=1e-4, pipeline_run_id="train:/elsewhere/out",
                              dataset_sha256="ab" * 32, accountant="rdp", records=600)
    ledger.release(released, note="the trainer could not be built: no private step ran")
    return {"home": home, "tracking_uri": uri, "ledger_url": ledger_url, "run_dir": run_dir, "killed": killed,
            "released": released}


@pytest.fixture(scope="module")
def server(runs):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "_MLFLOW_"))}
    env.update(DPSYNTH_LEDGER_URL=runs["ledger_url"], MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    log = open(runs["home"] / "mlflow-server.log", "w")
    proc = subprocess.Popen([str(MLFLOW), "server", "--app-name", "dpsynth-ledger", "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1", "--backend-store-uri", runs["tracking_uri"],
                             "--artifacts-destination", str(runs["home"] / "mlartifacts")],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                assert proc.poll() is None, (runs["home"] / "mlflow-server.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "mlflow server not healthy after 90 s"
                time.sleep(0.1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its uvicorn worker: the group this test started
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@pytest.fixture
def browser():
    from tests.platform.cdp import Browser

    b = Browser()
    yield b
    b.close()


def expected(runs):
    """What the page must show, read from the ledger, MLflow and the manifests themselves."""
    from mlflow import MlflowClient

    ledger = Ledger(runs["ledger_url"])
    balance = ledger.balance("mnist600")
    history = {}
    for r in ledger.history("mnist600"):
        history.setdefault(r["pipeline_run_id"], []).append(r)
    client = MlflowClient(runs["tracking_uri"])
    exp = client.get_experiment_by_name("ledger-page")
    found = client.search_runs([exp.experiment_id], f"tags.`{tracking.TAG_PIPELINE_RUN_ID}` = 'p-page'")
    (parent,) = [r for r in found if r.data.tags[tracking.TAG_STAGE] == "pipeline"]
    early = client.search_runs([exp.experiment_id], f"tags.`{tracking.TAG_PIPELINE_RUN_ID}` = 'p-early'")
    eps = {r.data.tags[tracking.TAG_STAGE]: float(r.data.tags[tracking.TAG_EPSILON_SPENT]) for r in found
           if r.data.tags[tracking.TAG_STAGE] != "pipeline"}
    from dpsynth.stages.protocol import VERSION_KEY, keyed_version

    key = (Path(runs["run_dir"]) / "sensitive" / VERSION_KEY).read_bytes()
    keyed = lambda sha: keyed_version(key, sha)  # noqa: E731
    part = manifest(runs["run_dir"], "sensitive", "partition")
    train = manifest(runs["run_dir"], "sensitive", "train")
    sample = manifest(runs["run_dir"], "release", "sample")
    return {
        "balance": balance, "history": history, "eps": eps, "parent_tags": parent.data.tags,
        "early_parents": [r for r in early if r.data.tags[tracking.TAG_STAGE] == "pipeline"],
        "dataset": part["dataset_sha256"],
        # sensitive-zone files by keyed version id (issue #33): never their raw sha256 outside the zone
        "shards": [keyed(o["sha256"]) for o in part["outputs"] if o["role"] == "shard"],
        "train_run": train["mlflow_run_id"],
        "generator": keyed(next(o["sha256"] for o in train["outputs"] if o["role"] == "generator")),
        "synthetic": next(o["sha256"] for o in sample["outputs"] if o["role"] == "synthetic"),
        "released": client.get_model_version_by_alias("dpsynth-mnist600-dpgan", "released"),
    }


def test_the_json_view(runs, server):
    want = expected(runs)
    data = json.load(urllib.request.urlopen(f"{server}/dpsynth/ledger.json", timeout=30))
    (pop,) = data["populations"]
    assert pop["population_id"] == "mnist600" and pop["budget"] == want["balance"]["budget"] == 100
    assert pop["committed"] == pytest.approx(want["balance"]["committed"]) and pop["reserved"] == 0
    runs_by_id = {r["pipeline_run_id"]: r for r in pop["runs"]}
    # one row per pipeline run (not per reservation); p-early trained nothing, so the ledger has no charge for it
    assert sorted(runs_by_id) == ["p-page", "train:/elsewhere/out"] and len(want["early_parents"]) == 1
    killed, retried = want["history"]["p-page"]
    page_run = runs_by_id["p-page"]
    assert page_run["reservation_ids"] == [runs["killed"], retried["id"]] == [killed["id"], retried["id"]]
    assert page_run["status"] == "committed" and [a["status"] for a in page_run["attempts"]] == ["committed"] * 2
    # the killed attempt is charged its whole reservation, the retry what it spent; the run their sum
    assert page_run["attempts"][0]["epsilon_charged"] == killed["epsilon_spent"] == killed["epsilon_reserved"] == 10
    assert page_run["attempts"][1]["epsilon_charged"] == pytest.approx(retried["epsilon_spent"]) and 0 < retried["epsilon_spent"] <= 10
    assert page_run["epsilon_charged"] == pytest.approx(killed["epsilon_spent"] + retried["epsilon_spent"])
    assert page_run["delta"] == pytest.approx(killed["delta"] + retried["delta"])
    # the parent run's tag lists the run's reservations (comma-separated), as the page reads it
    assert want["parent_tags"][tracking.TAG_LEDGER_RESERVATION] == f"{killed['id']},{retried['id']}"
    assert page_run["mlflow"]["ledger_reservation_ids"] == [killed["id"], retried["id"]]
    assert "dpsynth.ledger_status" not in want["parent_tags"]
    standalone = runs_by_id["train:/elsewhere/out"]
    assert standalone["status"] == "released" and standalone["epsilon_charged"] == 0 and standalone["delta"] == 0
    assert standalone["reservation_ids"] == [runs["released"]] and standalone["mlflow"] is None
    assert page_run["mlflow"]["audit"] == "passed"
    assert page_run["mlflow"]["stages"]["train"]["epsilon"] == pytest.approx(want["eps"]["train"])
    kinds = [x["kind"] for x in page_run["lineage"]]
    assert kinds == ["dataset", "shards", "train run", "generator", "synthetic data", "registered model"]
    # the audited generator's Model Registry version, as the registry itself reports it
    (version,) = page_run["mlflow"]["registered"]
    assert page_run["lineage"][5]["versions"] == [version]
    assert (version["name"], version["version"]) == (want["released"].name, str(want["released"].version))
    assert version["aliases"] == ["released"] and version["audit"] == "passed"
    assert version["epsilon"] == want["released"].tags[tracking.TAG_EPSILON_SPENT]
    assert want["released"].run_id == page_run["mlflow"]["stages"]["sample"]["run_id"]
    assert page_run["lineage"][0]["sha256"] == want["dataset"]
    assert [s["sha256"] for s in page_run["lineage"][1]["items"]] == want["shards"]
    assert page_run["lineage"][2]["run_id"] == want["train_run"]
    assert page_run["lineage"][3]["sha256"] == want["generator"] and page_run["lineage"][4]["sha256"] == want["synthetic"]


def test_the_page_in_a_browser(runs, server, browser):
    want = expected(runs)
    browser.goto(f"{server}/dpsynth/ledger")
    browser.wait_for("document.body.innerText.includes('Privacy ledger')")
    q = "document.querySelector"

    def text(selector):
        return browser.js(f"({q}({json.dumps(selector)}) || {{innerText: null}}).innerText")

    pop = "[data-population='mnist600']"
    assert text(f"{pop} [data-field=budget]") == "100"
    assert text(f"{pop} [data-field=spent]") == f"{want['balance']['committed']:.4g}"
    assert text(f"{pop} [data-field=remaining]") == f"{want['balance']['remaining']:.4g}"
    row = f"{pop} tr[data-run='p-page']"
    killed, retried = want["history"]["p-page"]
    assert text(f"{row} [data-field=ledger-status]") == "2 attempt(s) committed"
    assert browser.js(f"[...document.querySelectorAll(\"{row} [data-reservation]\")].map(e => +e.dataset.reservation)") == [
        killed["id"], retried["id"]]
    assert text(f"{row} [data-field=charged]") == f"{killed['epsilon_spent'] + retried['epsilon_spent']:.4g}"
    assert text(f"{row} [data-stage=train]") == f"{want['eps']['train']:.4g}"
    assert text(f"{row} [data-stage=partition]") == "0"
    assert text(f"{row} [data-field=audit]") == "passed"
    assert browser.js(f"{q}(\"{pop} tr[data-run='p-early']\") === null")
    assert text(f"{pop} tr[data-run='train:/elsewhere/out'] [data-field=ledger-status]") == "1 attempt(s) released"
    chain = f"[data-lineage='p-page']"
    shas = browser.js(f"[...document.querySelectorAll(\"{chain} [data-sha256]\")].map(e => e.dataset.sha256)")
    assert shas == [want["dataset"], *want["shards"], want["generator"], want["synthetic"]]
    assert want["train_run"][:12] in text(f"{chain} [data-kind='train run']")
    assert "audit passed" in text(f"{chain} [data-kind=generator]")
    released = f"#/models/dpsynth-mnist600-dpgan/versions/{want['released'].version}"
    assert browser.js(f"{q}(\"{row} [data-field=registered] a\").getAttribute('href')") == f"/{released}"
    assert browser.js(f"{q}(\"{chain} [data-kind='registered model'] a\").getAttribute('href')") == f"/{released}"
    assert "@released" in text(f"{row} [data-field=registered]")
    browser.screenshot(ARTIFACTS / "mlflow-privacy-ledger.png")
    # the page links each run to MLflow's own run page, on the same server
    href = browser.js(f"{q}(\"{row} a\").getAttribute('href')")
    parent = json.load(urllib.request.urlopen(f"{server}/dpsynth/ledger.json"))["populations"][0]
    assert href.endswith(next(r for r in parent["runs"] if r["pipeline_run_id"] == "p-page")["mlflow"]["parent_run_id"])
