"""A retrain on a window of privacy blocks, end to end, on each orchestrator (#54, Done-when): `dpsynth pipeline run`,
the KFP local runner (kfp.local's SubprocessRunner) and `airflow dags test dpsynth_retrain_on_new_data`.

The population has three blocks from three versioned imports of MNIST records (200 new records each) and the
platform sets ``ledger.window=2``: each run must reserve and commit on exactly blocks 1 and 2 (read back from the
ledger), its release card and the ledger page must show the ε charged to each of them, `dpsynth release verify` must
recompute that per-block charge from the released trace, and the held-out split must be the one a run on every
block holds out (membership decided by record id alone, for life). Each is a whole pipeline: the slow tier."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dpsynth import storage
from dpsynth.data import import_source, read_parquet, versions, write_parquet
from dpsynth.ledger.store import Ledger
from tests.airflow_fixtures import AIRFLOW_BIN, REPO
from tests.stages.helpers import MNIST, dpsynth, manifest

POP, PER_IMPORT, WINDOW = "clinic", 200, 2
EPS, DELTA, BLOCK_BUDGET = 10.0, 1e-4, 30.0
# the smallest run of each orchestrator's tests (tests/pipelines/test_airflow.py, test_kfp.py): dpgan, tiny models
TINY = ["train.d_width=4", "train.g_width=4", "train.latent_dim=12", "warmup.steps=20", "train.batch_size=32",
        "sample.num_samples=200", "output.log_every=0", "output.sample_every=0", "output.checkpoint_every=0",
        "evaluate.epochs=1", "evaluate.feature_steps=5", "evaluate.mia_generated=200", "audit.empirical=off"]
PUBLIC = ["partition.key=dpsynth-partition-v1", "data.num_classes=10", "data.heldout_fraction=0.1"]


@pytest.fixture
def population(tmp_path) -> dict:
    """Three versioned imports (200, 400, 600 MNIST records: blocks 0, 1, 2 of 200 each), a ledger with a budget
    per block; returns the newest version's URI, the import destination, the ledger's URL and each import's source."""
    mnist = import_source(str(MNIST)).subset(np.arange(3 * PER_IMPORT))
    dst = tmp_path / "data" / "clinic.parquet"
    sources = []
    for week in range(3):
        src = tmp_path / f"week{week}.parquet"
        write_parquet(mnist.subset(np.arange(PER_IMPORT * (week + 1))), str(src))
        sources.append(src)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    Ledger(url).set_budget(POP, epsilon=BLOCK_BUDGET, delta=1e-3, reason="each block's lifetime budget")
    return {"dst": dst, "url": url, "sources": sources, "ids": mnist.record_ids}


def import_versions(population: dict, weeks) -> str:
    for week in weeks:
        assert dpsynth("data", "import", population["sources"][week], population["dst"], "--versioned", "--json") == 0
    dst = str(population["dst"])
    return versions.uri(dst, versions.latest(dst))


def check_window_run(run: Path, population: dict, uri: str, tracking_uri: str, tmp_path: Path) -> None:
    """What every orchestrator's run on the window must show (the module's docstring)."""
    from dpsynth_mlflow.ledger_view import gather, render

    ledger = Ledger(population["url"])
    [charged] = ledger.history(POP)  # one train attempt, committed, on the last two blocks only
    assert charged["stage"] == "train" and charged["status"] == "committed", charged
    assert charged["blocks"] == [1, 2] and 0 < charged["epsilon_spent"] <= EPS
    spent = charged["epsilon_spent"]
    assert [(b["block"], b["committed"]) for b in ledger.balance(POP)["blocks"]] == [(1, spent), (2, spent)]
    part = manifest(run, "sensitive", "partition")
    assert part["details"]["blocks"] == [1, 2]
    trained = {rid for o in part["outputs"] if o["role"] == "shard" for rid in read_parquet(o["uri"]).record_ids}
    held = {rid for o in part["outputs"] if o["role"] == "heldout" for rid in read_parquet(o["uri"]).record_ids}
    assert held and not trained & held and trained | held == set(population["ids"][PER_IMPORT:])
    # the held-out split is the one a run on every block holds out, restricted to the window: stable for life
    wide = tmp_path / "wide"
    sets = [f"data.uri={uri}", f"ledger.url={population['url']}", f"ledger.population_id={POP}", *PUBLIC]
    assert dpsynth("partition", "--run-dir", wide, *(a for s in sets for a in ("--set", s))) == 0
    wide_part = manifest(wide, "sensitive", "partition")
    assert wide_part["details"]["blocks"] == [0, 1, 2]
    wide_held = {rid for o in wide_part["outputs"] if o["role"] == "heldout"
                 for rid in read_parquet(o["uri"]).record_ids}
    assert wide_held & set(population["ids"][PER_IMPORT:]) == held
    # the release card: per block read, what this run charged it and what is left
    release = run / "release"
    card = json.loads(storage.read_bytes(str(release / "card" / "card.json")))
    assert card["ledger"]["blocks"] == [{"block": b, "this_run": pytest.approx(spent), "committed_before": 0.0,
                                         "remaining": pytest.approx(BLOCK_BUDGET - spent)} for b in (1, 2)]
    assert "block 1" in (release / "card" / "card.html").read_text()
    # the ledger page: each block's charge and the reservation that charged it
    page = render(gather(ledger_url=population["url"], tracking_uri=tracking_uri))
    assert "on blocks 1, 2" in page and "<tr data-block='1'>" in page and "<tr data-block='0'>" not in page
    # the auditor's check recomputes the per-block charge from the released trace
    assert dpsynth("release", "verify", release) == 0


@pytest.mark.slow
def test_dpsynth_pipeline_run_on_a_window(tmp_path, population, monkeypatch):
    monkeypatch.delenv("DPSYNTH_LEDGER_URL", raising=False)
    uri = import_versions(population, range(3))
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = tmp_path / "run"
    sets = [f"data.uri={uri}", *TINY, *PUBLIC, "train.method=dpgan", "train.steps=10", "train.n_d=2",
            "partition.num_shards=1", f"privacy.epsilon={EPS}", f"privacy.delta={DELTA}", f"ledger.population_id={POP}",
            f"ledger.url={population['url']}", f"ledger.window={WINDOW}", "tracking.enabled=true",
            f"tracking.uri={tracking_uri}", "tracking.experiment=blocks"]
    assert dpsynth("pipeline", "run", "--run-dir", run, "--pipeline-run-id", "local-window",
                   *(a for s in sets for a in ("--set", s))) == 0
    check_window_run(run, population, uri, tracking_uri, tmp_path)


@pytest.mark.slow
def test_kfp_local_runner_on_a_window(tmp_path, population, monkeypatch):
    from tests.pipelines.test_kfp import load_run_local

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("DPSYNTH_LEDGER_URL", raising=False)
    uri = import_versions(population, range(3))
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = tmp_path / "run"
    extra = [*TINY, *PUBLIC, f"ledger.url={population['url']}", f"ledger.window={WINDOW}",
             f"tracking.uri={tracking_uri}", "tracking.experiment=blocks"]
    load_run_local().run(dataset=uri, run_dir=str(run), extra=extra, pipeline_root=str(tmp_path / "kfp"),
                         population_id=POP, method="dpgan", epsilon=EPS, delta=DELTA, steps=10, num_shards=1, n_d="2",
                         seed=0)
    check_window_run(run, population, uri, tracking_uri, tmp_path)


@pytest.mark.slow
def test_airflow_retrain_dag_on_a_window(airflow_db, tmp_path, population):
    """The third import through the import DAG (`airflow dags test dpsynth_import_data`); its asset event's versioned
    URI is what the retrain DAG runs on (`airflow dags test dpsynth_retrain_on_new_data`: `dags test` triggers no
    asset schedule, so the test hands the event's URI on, as the DAG's plan does from triggering_asset_events)."""
    import_versions(population, range(2))
    dst = str(population["dst"])
    env = {**airflow_db, "DPSYNTH_DATASET_URI": dst}
    airflow = str(AIRFLOW_BIN / "airflow")
    proc = subprocess.run([airflow, "dags", "test", "dpsynth_import_data", "-c",
                           json.dumps({"source": str(population["sources"][2])})], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    db = sqlite3.connect(Path(airflow_db["AIRFLOW_HOME"]) / "airflow.db")
    [(extra,)] = db.execute("SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                            "WHERE e.source_dag_id = 'dpsynth_import_data' AND a.name = ?", (dst,)).fetchall()
    uri = json.loads(extra)["dataset_uri"]
    assert uri == versions.uri(dst, versions.latest(dst))
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # the ledger is the platform's, beside it: ledger.db
    platform = {"tracking": {"experiment": "blocks"}, "partition": {"key": "dpsynth-partition-v1"},
                "data": {"num_classes": 10, "heldout_fraction": 0.1}, "ledger": {"window": WINDOW}}
    conf = {"dataset_uri": uri, "method": "dpgan", "epsilon": EPS, "delta": DELTA, "steps": 10, "num_shards": 1,
            "n_d": "2", "seed": 0, "run_root": str(tmp_path / "runs"), "config": None,
            "pipeline_run_id": "af-window", "population_id": POP,
            "overrides": TINY}
    env = {**env, "DPSYNTH_TRACKING_URI": tracking_uri, "DPSYNTH_STAGE_CONFIG": json.dumps(platform)}
    proc = subprocess.run([airflow, "dags", "test", "dpsynth_retrain_on_new_data", "-c", json.dumps(conf)], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "state=success" in log, log[-6000:]
    check_window_run(tmp_path / "runs" / "af-window", population, uri, tracking_uri, tmp_path)
