"""The ledger ties a population to the records it was first charged for: a new population id for the same data
does not reset the budget unless an operator says so (issue #33)."""

import hashlib

import pytest

from dpsynth.errors import PrivacyError
from dpsynth.ledger.store import Ledger
from tests.stages.helpers import dpsynth, settings

SHA = hashlib.sha256(b"the records").hexdigest()


# Slow tier (#53: two whole pipeline runs). In the quick tier: the ledger's refusal itself, on SQLite and PostgreSQL
# (test_the_ledger_keeps_no_raw_content_hash below: records charged to one population refused to another), and
# `dpsynth pipeline run` refused by the ledger before any stage runs (tests/stages/test_pipeline.py::
# test_a_fresh_restart_is_charged_again_and_the_ledger_refuses_a_run_beyond_the_budget, the same path).
@pytest.mark.slow
def test_a_new_population_id_for_charged_data_is_refused_before_anything_runs(tmp_path, source, capsys,
                                                                            ledger_with_budget):
    ledger = ledger_with_budget
    assert dpsynth("pipeline", "run", "--run-dir", tmp_path / "a", *settings(source)) == 0
    ledger.set_budget("renamed", epsilon=1000.0, delta=1e-3, reason="a fresh id")
    capsys.readouterr()
    again = settings(source, "ledger.population_id=renamed")
    assert dpsynth("pipeline", "run", "--run-dir", tmp_path / "b", *again) == 2
    err = capsys.readouterr().err
    assert "ledger.population_id:" in err and "'mnist600'" in err and "--allow-shared-data" in err
    assert not (tmp_path / "b").exists() and ledger.history("renamed") == []
    # the standalone train command is refused too, before its first private step
    assert dpsynth("train", *again, "--set", f"output.dir={tmp_path / 'c'}") == 2
    assert "ledger.population_id:" in capsys.readouterr().err and ledger.history("renamed") == []
    # an operator who says so, with a reason: allowed, and recorded
    assert dpsynth("ledger", "set-budget", "renamed", "--epsilon", "1000", "--delta", "1e-3", "--reason", "split",
                   "--allow-shared-data", "a different privacy unit, decided by the DPO") == 0
    assert dpsynth("pipeline", "run", "--run-dir", tmp_path / "b", *again) == 0
    assert [r["status"] for r in ledger.history("renamed")] == ["committed"]
    assert "a different privacy unit" in ledger.budget_history("renamed")[-1]["reason"]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return request.getfixturevalue("pg_server").database("ledger_data")


def test_the_ledger_keeps_no_raw_content_hash(tmp_path, url):
    ledger = Ledger(url)
    for pid in ("a", "b"):
        ledger.set_budget(pid, epsilon=10, delta=1e-6, reason="t")
    kw = dict(epsilon=1.0, delta=1e-7, dataset_sha256="ab" * 32, accountant="rdp", records=100, stage="train",
              attempt_id=None, resumes_id=None, stale_after_s=None)
    ledger.open_attempt("a", pipeline_run_id="r1", content_sha256=SHA, **kw)
    ledger.open_attempt("a", pipeline_run_id="r2", content_sha256=hashlib.sha256(b"v2").hexdigest(), **kw)
    with pytest.raises(PrivacyError, match="ledger.population_id: these records were already charged to population 'a'"):
        ledger.open_attempt("b", pipeline_run_id="r3", content_sha256=hashlib.sha256(b"v2").hexdigest(), **kw)
    ledger.open_attempt("b", pipeline_run_id="r3", content_sha256=hashlib.sha256(b"other").hexdigest(), **kw)
    if url.startswith("sqlite"):
        assert SHA not in (tmp_path / "ledger.db").read_bytes().decode("latin-1")
    assert SHA not in repr([ledger.populations(), ledger.history(), ledger.budget_history()])
    (a,) = [p for p in ledger.populations() if p["population_id"] == "a"]
    assert a["data_id"] and a["data_id"] != SHA
