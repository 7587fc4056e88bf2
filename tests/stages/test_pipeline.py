"""dpsynth pipeline run: six stages in order, one MLflow parent run with a child per stage; also on S3.

One tracked DPGAN pipeline run (and its rerun) serves the module's checks of that path (:func:`tracked_run`): its
parent and child runs here, and on the same run the logged keys, the gate and the registered release
(tests/stages/test_logged_keys.py's checks, DPGAN's case) and the code's lineage in an image
(tests/stages/test_lineage.py's checks): one `pipeline run` with MLflow on per method in the quick tier."""

import contextlib
import io
import json

import pytest

from dpsynth import storage, tracking
from dpsynth.data import read_parquet
from dpsynth.ledger.store import Ledger
from tests.stages.helpers import dpsynth, manifest, release_files, settings

STAGES = ["partition", "pretrain", "train", "audit", "sample", "evaluate"]
SAMPLE_RELEASE = [f"sample/{n}" for n in ("audit.json", "audit.md", "generator.pt", "manifest.json", "samples.png",
                                           "synthetic.parquet")]


def release_zone_holds_only_releasables(run) -> bool:
    """The release zone holds the sample stage's files and what the evaluate manifest lists: nothing sensitive."""
    files = release_files(run)
    evaluated = [o["uri"].rsplit("/", 2)[-2] + "/" + o["uri"].rsplit("/", 1)[-1]
                 for o in manifest(run, "release", "evaluate")["outputs"]]
    assert all(o["zone"] == "release" for o in manifest(run, "release", "evaluate")["outputs"])
    card = json.loads(storage.read_bytes(storage.join(str(run), "release", "card", "card.json")))  # the release card
    carded = [f["path"] for f in card["files"] if f["path"].startswith("card/")] + ["card/card.json", "card/SHA256SUMS"]
    assert {"card/card.html", "card/trace.json"} <= set(carded)
    return sorted(files) == sorted(SAMPLE_RELEASE + ["evaluate/manifest.json"] + evaluated + carded)


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def ledger_beside(mlflow_uri) -> Ledger:
    """The stage tests' ledger ($DPSYNTH_LEDGER_URL, set by conftest.ledger_with_budget)."""
    import os

    return Ledger(os.environ["DPSYNTH_LEDGER_URL"])


def pipeline(run_dir, source, mlflow_uri, run_id, *overrides):
    tracked = ("tracking.enabled=true", f"tracking.uri={mlflow_uri}", "tracking.experiment=stages-test")
    return dpsynth("pipeline", "run", "--run-dir", run_dir, "--pipeline-run-id", run_id,
                   *settings(source, *tracked, *overrides))


def runs_of(mlflow_uri, pipeline_run_id):
    """(parent, {stage: child}) of one pipeline run."""
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("stages-test")
    runs = client.search_runs([exp.experiment_id], f"tags.`{tracking.TAG_PIPELINE_RUN_ID}` = '{pipeline_run_id}'")
    (parent,) = [r for r in runs if r.data.tags[tracking.TAG_STAGE] == "pipeline"]
    children = {r.data.tags[tracking.TAG_STAGE]: r for r in runs if r is not parent}
    assert len(children) == len(runs) - 1
    return client, parent, children


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory, source):
    """``dpsynth pipeline run`` (p1) with MLflow on, in an image (DPSYNTH_GIT_SHA and DPSYNTH_IMAGE set, as the stage
    image sets them), with logging every 2 steps and the small evaluation of the logged-keys checks; then the same
    pipeline again (p2), which reuses every stage. Its own MLflow store and ledger; each run's stdout kept."""
    from tests import mlflow_template
    from tests.stages import test_lineage, test_logged_keys

    mlflow_template.install()  # the first store is migrated once and kept: this module's others copy its schema
    base = tmp_path_factory.mktemp("tracked-run")
    uri, run, ledger_url = f"sqlite:///{base / 'mlflow.db'}", base / "run", f"sqlite:///{base / 'ledger.db'}"
    ledger = Ledger(ledger_url)
    ledger.set_budget("mnist600", epsilon=1000.0, delta=1e-3, reason="tests/stages/test_pipeline.py")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPSYNTH_LEDGER_URL", ledger_url)
        mp.setenv("DPSYNTH_GIT_SHA", test_lineage.SHA)
        mp.setenv("DPSYNTH_IMAGE", test_lineage.IMAGE)
        for run_id in ("p1", "p2"):
            with contextlib.redirect_stdout(io.StringIO()) as printed:
                code = pipeline(run, source, uri, run_id, *test_logged_keys.EVALUATE,
                                *test_logged_keys.METHODS["dpgan"])
            out[run_id] = printed.getvalue()
            assert code == 0, (run_id, out[run_id][-3000:])
    return {"run": run, "uri": uri, "ledger": ledger, "out": out, "source": source}


def test_parent_and_child_runs(tracked_run):
    run, mlflow_uri, out = tracked_run["run"], tracked_run["uri"], tracked_run["out"]["p1"]
    assert all(f"| {s} | succeeded |" in out for s in STAGES) and "audit passed" in out and "mlflow ui" in out

    client, parent, children = runs_of(mlflow_uri, "p1")
    assert sorted(children) == sorted(STAGES)
    train_eps = manifest(run, "sensitive", "train")["privacy"]["epsilon"]
    dataset = manifest(run, "sensitive", "partition")["dataset_sha256"]
    for stage, child in children.items():
        tags = child.data.tags
        assert tags["mlflow.parentRunId"] == parent.info.run_id and child.info.status == "FINISHED"
        assert tags[tracking.TAG_DATASET_VERSION] == dataset and tags[tracking.TAG_CODE_VERSION]
        assert tags[tracking.TAG_DELTA] == "0.0001" and tags[tracking.TAG_ACCOUNTANT]
        assert float(tags[tracking.TAG_EPSILON_SPENT]) == pytest.approx(train_eps if stage == "train" else 0, rel=1e-5)
        zone = "release" if stage in ("sample", "evaluate") else "sensitive"
        assert manifest(run, zone, stage)["mlflow_run_id"] == child.info.run_id
        assert "manifest.json" in [a.path for a in client.list_artifacts(child.info.run_id)]
    assert children["audit"].data.tags[tracking.TAG_AUDIT] == "passed"
    assert {i.dataset.name for i in children["train"].inputs.dataset_inputs}  # lineage of the training data
    assert {i.dataset.name for i in children["evaluate"].inputs.dataset_inputs} >= {"synthetic", "heldout"}

    parent = client.get_run(parent.info.run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags[tracking.TAG_AUDIT] == "passed"
    # the ledger: the train attempt reserved the target and committed the ε of its trace
    ledger = tracked_run["ledger"]
    (res,) = ledger.reservations(pipeline_run_id="p1")
    assert parent.data.tags[tracking.TAG_LEDGER_RESERVATION] == str(res["id"])
    assert parent.data.tags[tracking.TAG_POPULATION] == "mnist600"
    assert res["status"] == "committed" and res["epsilon_reserved"] == 10 and res["pipeline_run_id"] == "p1"
    assert res["epsilon_spent"] == pytest.approx(train_eps) and res["attempt_id"] and res["resumes_id"] is None
    assert res["dataset_sha256"] == dataset and res["delta"] == 1e-4
    assert parent.data.metrics["ledger_epsilon_charged"] == pytest.approx(res["epsilon_spent"])
    assert "Ledger: population 'mnist600' charged ε=" in out and f"reservation {res['id']} committed" in out
    assert parent.data.metrics["epsilon_total"] == pytest.approx(train_eps)
    assert float(parent.data.tags[tracking.TAG_EPSILON_SPENT]) == pytest.approx(train_eps, rel=1e-5)
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "pipeline")}
    assert artifacts == {"pipeline/stages.json", "pipeline/stages.md"}
    import mlflow

    mlflow.set_tracking_uri(mlflow_uri)
    models = mlflow.search_logged_models(experiment_ids=[parent.info.experiment_id], output_format="list")
    assert [m.source_run_id for m in models] == [children["sample"].info.run_id]  # only the audited generator

    assert release_zone_holds_only_releasables(run)  # nothing sensitive in the release zone
    real_ids = {r for o in manifest(run, "sensitive", "partition")["outputs"] for r in read_parquet(o["uri"]).record_ids}
    assert not real_ids & set(read_parquet(run / "release" / "sample" / "synthetic.parquet").record_ids)

    # Re-running the same pipeline reuses every stage's outputs: six skipped child runs, no new ε.
    out = tracked_run["out"]["p2"]
    assert all(f"| {s} | skipped |" in out for s in STAGES), out
    _, parent2, children2 = runs_of(mlflow_uri, "p2")
    assert sorted(children2) == sorted(STAGES)
    assert {c.data.tags["dpsynth.stage_status"] for c in children2.values()} == {"skipped"}
    assert {c.data.tags[tracking.TAG_EPSILON_SPENT] for c in children2.values()} == {"0"}
    assert children2["train"].data.tags["dpsynth.reused_run_id"] == children["train"].info.run_id
    # ... and is charged nothing: no attempt ran, no reservation
    assert ledger.reservations(pipeline_run_id="p2") == []


def test_every_key_the_dpgan_pipeline_logs_is_declared_and_nothing_passes_the_gate(tracked_run, mnist600, tmp_path):
    """tests/stages/test_logged_keys.py's checks on DPGAN's tracked run (its GS-WGAN case runs there)."""
    from tests.stages.test_logged_keys import check_keys_and_release

    check_keys_and_release(tracked_run["uri"], "stages-test", tracked_run["run"], "dpgan", "p1",
                           source=tracked_run["source"], mnist600=mnist600, tmp_path=tmp_path)


def test_every_stage_the_card_and_the_registered_version_record_the_commit_and_the_image(tracked_run):
    """tests/stages/test_lineage.py's check (#55 item 7) on the tracked run, made with DPSYNTH_GIT_SHA and
    DPSYNTH_IMAGE set."""
    from tests.stages.test_lineage import check_lineage

    check_lineage(tracked_run["run"], tracked_run["uri"], "stages-test", ("p1", "p2"))


def test_a_failed_audit_registers_nothing_and_each_passed_release_takes_the_alias(tracked_run):
    """The Model Registry across audits of the tracked run's generator (tests/stages/test_model_registry.py's
    subject): version 1 is p1's release; a failed audit (a paper's own accounting never passes) makes the sample stage
    refuse and registers nothing; the same generator audited again with sound accounting is released again, as
    version 2, which takes the ``released`` alias. Last of the tracked run's tests: it audits and samples that run
    again."""
    from mlflow import MlflowClient

    from dpsynth import storage
    from tests.stages.helpers import stage
    from tests.stages.test_logged_keys import EVALUATE, METHODS

    run, uri, source = tracked_run["run"], tracked_run["uri"], tracked_run["source"]
    tracked = ("tracking.enabled=true", f"tracking.uri={uri}", "tracking.experiment=stages-test", *EVALUATE,
               *METHODS["dpgan"])
    client = MlflowClient(uri)
    name = tracking.registered_model_name("mnist600", "dpgan")
    assert [m.name for m in client.search_registered_models()] == [name] == ["dpsynth-mnist600-dpgan"]
    assert [str(v.version) for v in client.search_model_versions()] == ["1"]

    assert stage("audit", run, source, *tracked, "privacy.accounting=as_published") == 2
    assert json.loads(storage.read_bytes(f"{run}/sensitive/audit/audit.json"))["decision"] == "failed"
    assert stage("sample", run, source, *tracked) != 0
    assert [str(v.version) for v in client.search_model_versions()] == ["1"]  # nothing registered
    assert client.get_model_version_by_alias(name, "released").version in (1, "1")

    assert stage("audit", run, source, *tracked) == 0
    assert stage("sample", run, source, *tracked) == 0
    versions = {str(v.version): client.get_model_version(name, v.version) for v in client.search_model_versions()}
    assert sorted(versions) == ["1", "2"]
    assert versions["2"].aliases == ["released"] and versions["1"].aliases == []
    assert versions["1"].tags[tracking.TAG_TRACE_SHA256] == versions["2"].tags[tracking.TAG_TRACE_SHA256]
    assert all(v.tags[tracking.TAG_AUDIT] == "passed" for v in versions.values())
    released = manifest(run, "release", "sample")["details"]["release"]
    assert released["registered_model"] == {"name": name, "version": "2", "alias": "released"}


def test_stops_at_the_first_failing_stage(tmp_path, source, mlflow_uri, capsys):
    # warm-up noise 0: train refuses when it builds the trainer (no private step ran)
    assert pipeline(tmp_path / "run", source, mlflow_uri, "p3", "train.batch_size=100000") == 2
    captured = capsys.readouterr()
    assert "| train | failed |" in captured.out and "| audit | not run |" in captured.out
    assert "stage train failed" in captured.err and "batch_size" in captured.err
    _, parent, children = runs_of(mlflow_uri, "p3")
    assert sorted(children) == ["partition", "pretrain"] and parent.info.status == "FAILED"
    assert release_files(tmp_path / "run") == []
    # an attempt that failed before its first private step is released, with the reason
    (res,) = ledger_beside(mlflow_uri).reservations(pipeline_run_id="p3")
    assert res["status"] == "released" and "before its first private step" in res["note"]


def test_on_s3(s3_bucket, source, tmp_path, capsys, monkeypatch, ledger_with_budget):
    monkeypatch.delenv("DPSYNTH_LEDGER_URL")  # no ledger beside a remote run directory: it must be named
    src = f"s3://{s3_bucket}/data/mnist600.parquet"
    storage.copy(source, src)
    run = f"s3://{s3_bucket}/runs/r1"
    assert dpsynth("pipeline", "run", "--run-dir", run, "--json", *settings(src)) == 2  # where is the ledger?
    assert "ledger.url: required" in capsys.readouterr().err
    assert not storage.exists(f"{run}/sensitive/partition/manifest.json")
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"  # the fixture's, with mnist600's budget
    assert dpsynth("pipeline", "run", "--run-dir", run, "--json", *settings(src, f"ledger.url={ledger_url}")) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ledger"]["attempts"] == 1 and summary["ledger"]["population_id"] == "mnist600"
    (res,) = ledger_with_budget.history("mnist600")
    assert summary["ledger"]["reservation_ids"] == [res["id"]] and res["status"] == "committed"
    assert [r["status"] for r in summary["stages"]] == ["succeeded"] * 6 and summary["audit"] == "passed"
    assert release_zone_holds_only_releasables(run)
    for stage in STAGES:
        m = manifest(run, "release" if stage in ("sample", "evaluate") else "sensitive", stage)
        assert all(o["uri"].startswith(f"{run}/") for o in m["outputs"])
    assert storage.exists(f"{run}/sensitive/train/generator.pt")
    assert dpsynth("partition", "--run-dir", run, "--json", *settings(src)) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "skipped"


# What Airflow/KFP do (open the parent run, call each stage entry point with its ids, finish in another call, which
# finds and closes the train attempt's reservation): tests/stages/test_egress.py::
# test_the_orchestrators_path_opens_the_parent_runs_each_stage_and_finish_closes_the_reservation, on the egress walk's
# run of that path (one tracked run of it in the quick tier, not a second one here).


def _provider_installed() -> bool:
    from importlib.metadata import entry_points

    return any(e.name == "dpsynth" for e in entry_points(group="mlflow.run_context_provider"))


def test_a_run_that_fails_before_the_private_stage_is_charged_nothing(tmp_path, source, ledger_with_budget):
    # 600 records in 50 000 shards: partition refuses (empty shards) before training could start
    assert dpsynth("pipeline", "run", "--run-dir", tmp_path / "run", "--pipeline-run-id", "early",
                   *settings(source, "partition.num_shards=50000")) == 2
    assert ledger_with_budget.history("mnist600") == []


def test_a_fresh_restart_is_charged_again_and_the_ledger_refuses_a_run_beyond_the_budget(tmp_path, source, capsys,
                                                                                          ledger_with_budget):
    """A forced rerun of the same pipeline is a fresh attempt, charged again; once what is committed leaves
    less than the target ε, the next run is refused before anything runs. (One test: each full run is one of
    the slowest things in this folder.)"""
    ledger = ledger_with_budget
    ledger.set_budget("mnist600", epsilon=25.0, delta=1e-3, reason="test")  # two runs of ε ≤ 10, not three
    run = tmp_path / "run"
    for flags in ((), ("--force",)):
        assert dpsynth("pipeline", "run", "--run-dir", run, "--pipeline-run-id", "same", *settings(source),
                       *flags) == 0
    first, second = ledger.reservations(pipeline_run_id="same")
    assert first["status"] == second["status"] == "committed" and second["resumes_id"] is None
    assert second["epsilon_spent"] == pytest.approx(first["epsilon_spent"]) and first["epsilon_spent"] > 9
    assert ledger.balance("mnist600")["committed"] > 18  # both runs spent most of their 10
    capsys.readouterr()
    assert dpsynth("pipeline", "run", "--run-dir", tmp_path / "run2", "--pipeline-run-id", "b", *settings(source)) == 2
    err = capsys.readouterr().err
    assert "cannot afford ε=10" in err and "mnist600" in err and "set-budget mnist600" in err
    assert not (tmp_path / "run2").exists()  # refused before any stage ran
    assert [r["pipeline_run_id"] for r in ledger.history("mnist600")] == ["same", "same"]
    # no budget: refused, pointing at `dpsynth ledger set-budget`; no population: refused, naming the field
    assert dpsynth("pipeline", "run", "--run-dir", tmp_path / "run3", *settings(
        source, "ledger.population_id=fresh")) == 2
    assert "dpsynth ledger set-budget fresh" in capsys.readouterr().err
    no_population = [a for a in settings(source) if a != "ledger.population_id=mnist600"][:-1]
    assert dpsynth("pipeline", "run", "--run-dir", tmp_path / "run4", *no_population) == 2
    assert "ledger.population_id: required" in capsys.readouterr().err


# Concurrent reservations racing past a budget: tests/ledger/test_ledger.py (OS processes).
