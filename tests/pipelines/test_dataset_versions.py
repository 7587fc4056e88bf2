"""Retraining on new data (issue #34, item 10): imports are versioned by a keyed id of the records' content, the
asset event names the version (never a raw digest), and a retrain whose version is its population's last release
opens no run and spends no ε (its start, ``--unless-released``, and the ``data_changed`` gate)."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dpsynth.data import import_source, write_parquet
from tests.airflow_fixtures import AIRFLOW_BIN, LOAD, REPO, in_airflow
from tests.stages.helpers import MNIST, dpsynth


def sources(tmp_path) -> tuple[Path, Path, str, str]:
    ds = import_source(MNIST)
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    write_parquet(ds.subset(np.arange(300)), a)
    write_parquet(ds.subset(np.arange(300, 500)), b)
    return a, b, import_source(a).content_sha256(), import_source(b).content_sha256()


def test_versioned_import_names_versions_by_keyed_id_and_skips_unchanged_data(tmp_path, capsys):
    a, b, sha_a, sha_b = sources(tmp_path)
    dst = tmp_path / "data" / "mnist.parquet"

    def imported(src) -> dict:
        assert dpsynth("data", "import", "--json", "--outside", "--versioned", "--", src, dst) == 0
        out = capsys.readouterr().out
        assert sha_a not in out and sha_b not in out and '"rows"' not in out  # the outside view: no digest, count
        return json.loads(out)

    first = imported(a)
    assert first["changed"] and first["versioned_uri"] == str(tmp_path / "data" / "mnist" / f"{first['version']}.parquet")
    assert first["version"] not in (sha_a, sha_a[:32], hashlib.sha256(a.read_bytes()).hexdigest()[:32])  # keyed
    versioned = Path(first["versioned_uri"])
    assert import_source(versioned).content_sha256() == import_source(dst).content_sha256() == sha_a
    stamp = versioned.stat().st_mtime_ns, dst.stat().st_mtime_ns

    again = imported(a)  # the same records: nothing written, "changed": false
    assert again == {**first, "changed": False}
    assert (versioned.stat().st_mtime_ns, dst.stat().st_mtime_ns) == stamp

    second = imported(b)  # new records: a new version, DST follows it
    assert second["changed"] and second["version"] != first["version"]
    assert import_source(dst).content_sha256() == sha_b and versioned.exists()
    back = imported(a)  # back to the first records: changed (from the newest), its version file reused
    assert back["changed"] and back["version"] == first["version"]
    assert sorted(p.name for p in (tmp_path / "data" / "mnist").iterdir()) == sorted(
        [".version-key", "LATEST", "blocks.json", f"{first['version']}.parquet", f"{second['version']}.parquet"])


FAKE_IMPORT = """\
import json, os, sys
print(json.dumps({"changed": os.environ["FAKE_CHANGED"] == "1", "version": "v7", "sha256": "0" * 64, "rows": 5,
                  "versioned_uri": "outputs/data/mnist/v7.parquet"}))
"""


def test_the_import_task_emits_an_event_naming_the_version(airflow_env, tmp_path):
    """The import task of `dpsynth_import_data` (its own code, in the Airflow venv; `dpsynth` faked): every import,
    new records or not, sets the event's extra to the versioned URI and its keyed id, nothing else of what the import
    printed (no raw digest); whether it retrains is decided against the population's last release. The whole DAG
    run with the real import is the slow tier's test_import_dag_emits_an_event_naming_the_version_and_the_retrain_decides."""
    fake = tmp_path / "fake-dpsynth"
    fake.write_text(f"#!{AIRFLOW_BIN / 'python'}\n" + FAKE_IMPORT)
    fake.chmod(0o755)
    out = in_airflow(LOAD + """
    import collections, os, types
    task = bag.dags["dpsynth_import_data"].get_task("import_data")
    out = {}
    for changed in ("1", "0"):
        os.environ["FAKE_CHANGED"] = changed
        events = collections.defaultdict(types.SimpleNamespace)
        task.python_callable(params={"source": "data/mnist"}, outlet_events=events)
        out[changed] = [getattr(e, "extra", None) for e in events.values()]
    print(json.dumps(out))
    """, {**airflow_env, "DPSYNTH_STAGE_BIN": str(fake)})
    expected = [{"dataset_uri": "outputs/data/mnist/v7.parquet", "version": "v7"}]
    assert out["1"] == expected and out["0"] == expected


# Slow tier (#35 item 5: three `airflow dags test` runs, ~2 min): the task's event is
# test_the_import_task_emits_an_event_naming_the_version, the versions the CLI's
# (test_versioned_import_names_versions_by_keyed_id_and_skips_unchanged_data), a real import DAG run's event
# tests/platform/test_ui.py::test_a_new_dataset_version_triggers_the_retrain_dag.
@pytest.mark.slow
def test_import_dag_emits_an_event_naming_the_version_and_the_retrain_decides(airflow_db, tmp_path):
    """`airflow dags test dpsynth_import_data` with the real `dpsynth data import`: each import's asset event names
    the versioned URI and its keyed id (no raw digest). The same records again give the same version: whether that
    retrains is decided against the population's last release (test_retrain_gate_*, tests/stages/
    test_retrain_released.py), not here against the newest import. New records: a new version."""
    a, b, sha_a, sha_b = sources(tmp_path)
    dst = tmp_path / "data" / "mnist.parquet"
    env = {**airflow_db, "DPSYNTH_DATASET_URI": str(dst)}
    db = sqlite3.connect(Path(airflow_db["AIRFLOW_HOME"]) / "airflow.db")

    def import_run(src) -> tuple[str, list]:
        proc = subprocess.run([str(AIRFLOW_BIN / "airflow"), "dags", "test", "dpsynth_import_data", "-c",
                               json.dumps({"source": str(src)})], env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=600)
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, log[-5000:]
        assert sha_a not in log and sha_b not in log
        events = db.execute("SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                            "WHERE e.source_dag_id = 'dpsynth_import_data' AND a.name = ? ORDER BY e.id",
                            (str(dst),)).fetchall()
        return log, [json.loads(e) for (e,) in events]

    _, events = import_run(a)
    [event] = events
    version = event["version"]
    assert event == {"dataset_uri": str(tmp_path / "data" / "mnist" / f"{version}.parquet"), "version": version}
    assert sha_a not in json.dumps(event)
    _, events = import_run(a)
    assert len(events) == 2 and events[1] == events[0], events  # the same version: the retrain compares releases
    _, events = import_run(b)
    assert len(events) == 3 and events[2]["version"] != version


def test_partition_refuses_a_versioned_file_replaced_after_its_import(tmp_path, capsys, monkeypatch):
    """The event names a version; partition (in the sensitive zone) checks that the file at that versioned URI still
    holds that version's records, and refuses (exit 2, naming data.uri) one replaced since, writing nothing."""
    from dpsynth.ledger.store import Ledger
    from tests.stages.helpers import settings

    a, b, _, _ = sources(tmp_path)
    monkeypatch.setenv("DPSYNTH_LEDGER_URL", f"sqlite:///{tmp_path / 'ledger.db'}")
    Ledger(f"sqlite:///{tmp_path / 'ledger.db'}").set_budget("mnist600", epsilon=100.0, delta=1e-3, reason="test")
    dst = tmp_path / "data" / "mnist.parquet"
    assert dpsynth("data", "import", "--json", "--outside", "--versioned", "--", a, dst) == 0
    versioned = json.loads(capsys.readouterr().out)["versioned_uri"]
    assert dpsynth("partition", "--run-dir", tmp_path / "ok", *settings(versioned)) == 0  # the version it names
    capsys.readouterr()
    write_parquet(import_source(b), versioned)  # replaced after the import
    assert dpsynth("partition", "--run-dir", tmp_path / "run", *settings(versioned)) == 2
    assert f"data.uri: {versioned} is version" in capsys.readouterr().err
    assert not (tmp_path / "run" / "sensitive" / "partition" / "manifest.json").exists()


@pytest.mark.parametrize("executor", ["local", "kubernetes"])
def test_retrain_gate_skips_every_later_task_when_start_found_the_release(airflow_env, tmp_path, executor):
    """The retrain's plan asks ``start`` for ``--unless-released`` (a manual run does not); when start reports
    "skipped", the ``data_changed`` short circuit skips every later task, ``finish`` (trigger rule all_done) too."""
    from tests.airflow_fixtures import KUBECONFIG, LOAD, in_airflow

    env = dict(airflow_env)
    if executor == "kubernetes":
        (tmp_path / "kubeconfig").write_text(KUBECONFIG)
        env.update(DPSYNTH_EXECUTOR="kubernetes", DPSYNTH_K8S_CONFIG_FILE=str(tmp_path / "kubeconfig"),
                   DPSYNTH_RUN_ROOT="s3://b/runs", DPSYNTH_DATASET_URI="s3://b/data/mnist.parquet",
                   DPSYNTH_POPULATION_ID="mnist")  # a cluster's runs charge the platform's population (#55)
    out = in_airflow(LOAD + """
    import types
    import dpsynth_pipeline
    dag = bag.dags["dpsynth_retrain_on_new_data"]
    gate = dag.get_task("data_changed")
    later = set(gate.get_flat_relative_ids(upstream=False))
    event = types.SimpleNamespace(timestamp=1, extra={"dataset_uri": "s3://b/data/mnist/v.parquet", "version": "v"})
    def start_argv(**context):
        return dpsynth_pipeline.plan.function(params=dict(dag.params.dump()), run_id="r", **context)["argv"]["start"]
    print(json.dumps({
        "kind": [c.__name__ for c in type(gate).__mro__], "ignore": gate.ignore_downstream_trigger_rules,
        "upstream": sorted(gate.upstream_task_ids), "all": sorted(dag.task_ids), "later": sorted(later),
        "retrain": start_argv(triggering_asset_events={"a": [event]}), "manual": start_argv(),
        "skip": gate.python_callable({"skipped": "unchanged"}), "go": gate.python_callable({"parent_run_id": "p"})}))
    """, env)
    assert "ShortCircuitOperator" in out["kind"] and out["ignore"] is True and out["upstream"] == ["start"]
    assert set(out["all"]) - set(out["later"]) == {"plan", "start", "data_changed"} | (
        {"start_command", "stage_commands", "train_launch"} if executor == "kubernetes" else set())
    assert "finish" in out["later"] and "train" in out["later"]
    assert out["retrain"][-1] == "--unless-released" and "--unless-released" not in out["manual"]
    assert out["skip"] is False and out["go"] is True
