"""KFP (issue #34): a verdict is not repeated by a retry, the exit task closes the parent run whatever happened, and the
stages' output artifacts carry the manifests' URIs and keyed ids, never a raw hash of a sensitive-zone file.

The container program (pipelines/kfp/stage_program.py) is run here as the container runs it, with ``dpsynth`` on
PATH: a fake one that logs its calls, or the real CLI."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest
import yaml

from dpsynth.data import import_source, write_parquet
from tests.pipelines.test_kfp import STAGE_PROGRAM, YAML, all_tasks
from tests.stages.helpers import MNIST, TINY, dpsynth


def program():
    ns = {"__name__": "dpsynth_stage_program"}
    exec(STAGE_PROGRAM.read_text(), ns)  # noqa: S102 — the text the containers run
    return ns


def on_path(tmp_path, monkeypatch, body: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "dpsynth"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def container_argv(command: list[str], run_dir, *, run_id="job-1", rest=()):
    return ["", "dpsynth", *command, "--json", "--run-dir", str(run_dir), "--pipeline-run-id", run_id,
            "--parent-run-id", "P", "--config-file", "", *rest, "--extra-settings", "[]"]


@pytest.mark.parametrize("code", [2, 1])
def test_a_verdict_is_recorded_and_a_retry_does_not_run_the_stage_again(tmp_path, monkeypatch, code):
    """exit 2 (a verdict): the retried attempt exits 2 without running the command (one call in the log); any other
    failure: the retry runs the stage again (it resumes from its manifests and checkpoints)."""
    calls = tmp_path / "calls"
    on_path(tmp_path, monkeypatch, f'echo "$*" >> {calls}\necho "dpsynth: error: audit failed" >&2\nexit {code}\n')
    run = tmp_path / "run"
    for attempt in range(3):  # KFP's set_retry(2): three attempts
        assert program()["main"](container_argv(["audit"], run)) == code
    assert len(calls.read_text().splitlines()) == (1 if code == 2 else 3)
    records = list((run / "sensitive" / "verdicts").rglob("*")) if code == 2 else []
    assert [p.relative_to(run / "sensitive" / "verdicts").as_posix() for p in records if p.is_file()] == (
        ["job-1/audit"] if code == 2 else [])
    # another task, another shard, another pipeline run: not that verdict
    ok = tmp_path / "ok"
    on_path(tmp_path, monkeypatch, f'echo "$*" >> {ok}\nexit 0\n')
    assert program()["main"](container_argv(["pretrain", "--shard", "1"], run)) == 0
    assert program()["main"](container_argv(["audit"], run, run_id="job-2")) == 0
    assert len(ok.read_text().splitlines()) == 2


def test_finish_is_the_exit_task():
    """finish runs when the stages' group ends however it ended (ALL_UPSTREAM_TASKS_COMPLETED), takes only pipeline
    parameters (no task output: KFP refuses an exit task that depends on one) and no --parent-run-id."""
    compiled = list(yaml.safe_load_all(YAML.read_text()))[0]
    finish = compiled["root"]["dag"]["tasks"]["dpsynth-finish"]
    assert finish["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    [group] = finish["dependentTasks"]
    assert group.startswith("exit-handler-")
    stages = compiled["components"][compiled["root"]["dag"]["tasks"][group]["componentRef"]["name"]]["dag"]["tasks"]
    assert {"dpsynth-start", "dpsynth-audit", "dpsynth-evaluate"} <= set(stages)
    for name, value in finish["inputs"]["parameters"].items():
        assert "taskOutputParameter" not in value, name
    args = compiled["deploymentSpec"]["executors"]["exec-dpsynth-finish"]["container"]["args"]
    assert args[:2] == ["pipeline", "finish"] and "--parent-run-id" not in args
    assert "retryPolicy" not in finish


@pytest.fixture
def tracked(tmp_path, monkeypatch):
    """A MNIST-600 source, a ledger with a budget for it and an MLflow store (SQLite) for a tracked run."""
    from dpsynth.ledger.store import Ledger

    source = tmp_path / "mnist600.parquet"
    write_parquet(import_source(MNIST).subset(range(600)), source)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv("DPSYNTH_LEDGER_URL", url)
    Ledger(url).set_budget("mnist600", epsilon=1000.0, delta=1e-3, reason="tests/pipelines/test_kfp_exit.py")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sets = [a for item in (f"data.uri={source}", *TINY, "tracking.enabled=true", f"tracking.uri={store}",
                           f"tracking.artifact_location={tmp_path / 'artifacts'}") for a in ("--set", item)]
    return source, store, sets


def test_the_exit_task_closes_the_parent_run_it_finds(tmp_path, tracked, capsys):
    """`pipeline finish` without --parent-run-id (the exit task) finds the parent run `start` opened for the pipeline
    run id and closes it with the manifests' verdict: here the run stopped after `start` (FAILED, audit not run).
    A run `start` refused has no parent run: finish summarises and exits 0."""
    from mlflow import MlflowClient

    from dpsynth import tracking

    _, store, sets = tracked
    run = tmp_path / "run"
    assert dpsynth("pipeline", "start", "--json", "--run-dir", run, "--pipeline-run-id", "kfp-job-7", *sets) == 0
    parent = json.loads(capsys.readouterr().out)["parent_run_id"]
    client = MlflowClient(store)
    assert client.get_run(parent).info.status == "RUNNING"
    assert dpsynth("pipeline", "finish", "--json", "--run-dir", run, "--pipeline-run-id", "kfp-job-7", *sets) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["parent_run_id"] == parent and not summary["succeeded"]
    closed = client.get_run(parent)
    assert closed.info.status == "FAILED" and closed.data.tags[tracking.TAG_AUDIT] == "not run"
    # a pipeline run that never opened a parent run (start refused it): the summary only
    assert dpsynth("pipeline", "finish", "--json", "--run-dir", tmp_path / "refused", "--pipeline-run-id",
                   "kfp-job-8", *sets) == 0
    assert json.loads(capsys.readouterr().out)["parent_run_id"] is None


def test_output_artifacts_carry_the_manifest_uri_and_keyed_ids(tmp_path, tracked, monkeypatch):
    """The real partition stage run by the container program: its Dataset artifact (the local file KFP uploads and the
    metadata the launcher merges from the executor output) names the source by the manifest's URI and its keyed
    version ids; the raw hashes of the source appear nowhere in what KFP records."""
    from dpsynth import storage
    from dpsynth.config import load_config
    from dpsynth.stages.protocol import StageContext, dataset_version

    source, _, sets = tracked
    sets = [*sets[:-4], "--set", "tracking.enabled=false"]  # partition alone: no parent run
    on_path(tmp_path, monkeypatch, f'exec {sys.executable} -m dpsynth.cli "$@"\n')
    run, art, out = tmp_path / "run", tmp_path / "kfp" / "dataset", tmp_path / "kfp" / "executor_output.json"
    argv = ["", "dpsynth", "partition", "--json", "--run-dir", str(run), "--pipeline-run-id", "job-1",
            "--config-file", "", *sets, "--extra-settings", "[]", "--kfp-artifact", "dataset", str(art),
            "--kfp-executor-output", str(out)]
    assert program()["main"](argv) == 0
    written = json.loads(art.read_text())
    [recorded] = json.loads(out.read_text())["artifacts"]["dataset"]["artifacts"]
    assert recorded == {"metadata": written}  # the launcher keeps KFP's URI, merges these fields
    ctx = StageContext.create(load_config(None, overrides=sets[1::2]), run_dir=str(run))
    content = import_source(source).content_sha256()
    assert written["uri"] == str(source) and written["role"] == "source" and written["stage"] == "partition"
    assert written["sha256"] == dataset_version(ctx, storage.sha256(source))
    assert written["content_sha256"] == dataset_version(ctx, content)
    assert written["manifest_uri"] == ctx.manifest_uri("partition")
    text = art.read_text() + out.read_text()
    assert content not in text and storage.sha256(source) not in text


def test_stage_artifacts_in_the_ir():
    """partition → Dataset, train (and the train job) → Model, sample → Dataset + Model, evaluate → Metrics; each
    container passes the artifact's path and the executor output file to the program."""
    compiled = list(yaml.safe_load_all(YAML.read_text()))[0]
    want = {"partition": {"dataset": "system.Dataset"}, "train": {"model": "system.Model"},
            "train-job": {"model": "system.Model"}, "sample": {"synthetic": "system.Dataset", "model": "system.Model"},
            "evaluate": {"metrics": "system.Metrics"}}
    tasks = all_tasks(compiled)
    for stage, arts in want.items():
        outputs = compiled["components"][f"comp-dpsynth-{stage}"]["outputDefinitions"]["artifacts"]
        assert {n: a["artifactType"]["schemaTitle"] for n, a in outputs.items()} == arts, stage
        args = compiled["deploymentSpec"]["executors"][f"exec-dpsynth-{stage}"]["container"]["args"]
        for name in arts:
            i = args.index(name) - 1
            assert args[i:i + 3] == ["--kfp-artifact", name, f"{{{{$.outputs.artifacts['{name}'].path}}}}"]
        assert args[-2:] == ["--kfp-executor-output", "{{$.outputs.output_file}}"]
        assert f"dpsynth-{stage}" in tasks
