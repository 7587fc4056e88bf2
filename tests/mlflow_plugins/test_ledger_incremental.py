"""The Privacy ledger page reads incrementally: a finished pipeline run's MLflow runs are read once; new runs and
runs still going are read on each request; a released run links to its release card."""

from __future__ import annotations

import pytest

from dpsynth import tracking
from dpsynth.ledger.store import Ledger


@pytest.fixture
def store(tmp_path):
    from mlflow import MlflowClient

    ledger_url, uri = f"sqlite:///{tmp_path / 'ledger.db'}", f"sqlite:///{tmp_path / 'mlflow.db'}"
    ledger = Ledger(ledger_url)
    ledger.set_budget("pop", epsilon=50.0, delta=1e-4, reason="incremental page test")
    client = MlflowClient(uri)
    exp = client.create_experiment("ledger-incremental")
    return ledger, client, exp, ledger_url, uri


def pipeline_run(ledger, client, exp, pid, *, finished=True, card=False):
    """A pipeline run as the ledger and MLflow record it: a parent run and one committed train attempt."""
    run = client.create_run(exp, tags={tracking.TAG_STAGE: "pipeline", tracking.TAG_PIPELINE_RUN_ID: pid,
                                       "dpsynth.run_dir": f"/runs/{pid}", tracking.TAG_AUDIT: "passed"})
    rid = ledger.reserve("pop", epsilon=5.0, delta=1e-6, dataset_sha256="ab" * 32, pipeline_run_id=pid,
                         accountant="rdp", records=1000)
    ledger.commit(rid, epsilon_spent=4.0)
    if card:
        client.set_tag(run.info.run_id, "dpsynth.release_card", f"runs:/{run.info.run_id}/card/card.html")
    if finished:
        client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def runs_of(data) -> dict:
    (pop,) = data["populations"]
    return {r["pipeline_run_id"]: r for r in pop["runs"]}


def test_finished_runs_are_read_once_new_and_running_ones_each_time(store, monkeypatch):
    from mlflow import MlflowClient

    from dpsynth_mlflow.ledger_view import LedgerView, render

    ledger, client, exp, ledger_url, uri = store
    pipeline_run(ledger, client, exp, "p1")
    first = pipeline_run(ledger, client, exp, "p2", card=True)
    queries = []
    search = MlflowClient.search_runs
    monkeypatch.setattr(MlflowClient, "search_runs", lambda self, exps, query="", *a, **k:
                        queries.append(query) or search(self, exps, query, *a, **k))
    view = LedgerView(ledger_url=ledger_url, tracking_uri=uri)
    data = view.gather()
    assert view.details_read == 2 and set(runs_of(data)) == {"p1", "p2"}
    assert view.gather() == data and view.details_read == 2  # nothing new: nothing read again
    pipeline_queries = [q for q in queries if "'pipeline'" in q]
    assert pipeline_queries[0].endswith("start_time >= 0") and not pipeline_queries[-1].endswith(">= 0")

    running = pipeline_run(ledger, client, exp, "p3", finished=False)
    assert set(runs_of(view.gather())) == {"p1", "p2", "p3"} and view.details_read == 3
    view.gather()
    assert view.details_read == 4  # still running: read again
    client.set_tag(running, "dpsynth.release_card", f"runs:/{running}/card/card.html")
    client.set_terminated(running, "FINISHED")
    data = view.gather()
    assert view.details_read == 5 and runs_of(data)["p3"]["mlflow"]["status"] == "FINISHED"
    view.gather()
    assert view.details_read == 5
    # the ledger side is read on every request: a later charge shows at once
    rid = ledger.reserve("pop", epsilon=2.0, delta=1e-6, dataset_sha256="ab" * 32, pipeline_run_id="p1",
                         accountant="rdp", records=1000)
    assert runs_of(view.gather())["p1"]["epsilon_charged"] == pytest.approx(4.0 + 2.0)
    ledger.commit(rid, epsilon_spent=1.0)
    data = view.gather()
    assert runs_of(data)["p1"]["epsilon_charged"] == pytest.approx(5.0) and view.details_read == 5
    # released runs link to their card
    card = runs_of(data)["p2"]["mlflow"]["card"]
    assert card == {"href": f"/#/experiments/{exp}/runs/{first}/artifactPath/card/card.html",
                    "release_zone": "/runs/p2/release/card/card.html"}
    assert runs_of(data)["p1"]["mlflow"]["card"] is None
    page = render(data)
    assert f'href="/#/experiments/{exp}/runs/{first}/artifactPath/card/card.html">card</a>' in page
