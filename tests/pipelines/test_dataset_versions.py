"""Retraining on new data (issue #34, item 10): imports are versioned by a keyed id of the records' content, the
asset event names the version (never a raw digest), and an import of data that did not change emits no event, so
the retrain DAG does not run and spends no ε."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dpsynth.data import import_source, write_parquet
from tests.pipelines.test_airflow import AIRFLOW_BIN, LOAD, REPO, airflow_db, airflow_env, in_airflow  # noqa: F401
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
        [".version-key", "LATEST", f"{first['version']}.parquet", f"{second['version']}.parquet"])


FAKE_IMPORT = """\
import json, os, sys
print(json.dumps({"changed": os.environ["FAKE_CHANGED"] == "1", "version": "v7", "sha256": "0" * 64, "rows": 5,
                  "versioned_uri": "outputs/data/mnist/v7.parquet"}))
"""


def test_the_import_task_is_skipped_when_the_data_did_not_change(airflow_env, tmp_path):  # noqa: F811
    """The import task of `dpsynth_import_data` (its own code, in the Airflow venv; `dpsynth` faked): an import that
    reports "changed": false skips the task (no asset event, so no retrain); "changed": true sets the event's extra to
    the versioned URI and its keyed id, nothing else of what the import printed. The whole DAG run with the real
    import is the slow tier's test_import_dag_emits_no_event_when_the_data_did_not_change."""
    fake = tmp_path / "fake-dpsynth"
    fake.write_text(f"#!{AIRFLOW_BIN / 'python'}\n" + FAKE_IMPORT)
    fake.chmod(0o755)
    out = in_airflow(LOAD + """
    import collections, os, types
    from airflow.exceptions import AirflowSkipException
    task = bag.dags["dpsynth_import_data"].get_task("import_data")
    out = {}
    for changed in ("1", "0"):
        os.environ["FAKE_CHANGED"] = changed
        events = collections.defaultdict(types.SimpleNamespace)
        try:
            task.python_callable(params={"source": "data/mnist"}, outlet_events=events)
            out[changed] = [getattr(e, "extra", None) for e in events.values()]
        except AirflowSkipException as exc:
            out[changed] = ["skipped", str(exc), [vars(e) for e in events.values()]]
    print(json.dumps(out))
    """, {**airflow_env, "DPSYNTH_STAGE_BIN": str(fake)})
    assert out["1"] == [{"dataset_uri": "outputs/data/mnist/v7.parquet", "version": "v7"}]
    skipped, reason, events = out["0"]
    assert skipped == "skipped" and "the data did not change" in reason and events in ([], [{}])


# Slow tier (#35 item 5: three `airflow dags test` runs, ~2 min): the task's decision is
# test_the_import_task_is_skipped_when_the_data_did_not_change, the versions the CLI's
# (test_versioned_import_names_versions_by_keyed_id_and_skips_unchanged_data), a real import DAG run's event
# tests/platform/test_ui.py::test_a_new_dataset_version_triggers_the_retrain_dag.
@pytest.mark.slow
def test_import_dag_emits_no_event_when_the_data_did_not_change(airflow_db, tmp_path):  # noqa: F811
    """`airflow dags test dpsynth_import_data` with the real `dpsynth data import`, twice on the same records: one
    asset event, naming the versioned URI and its keyed id (no raw digest); the second run's import task is skipped,
    so `dpsynth_retrain_on_new_data` (scheduled on that asset) gets no event and spends no ε. New records: a new
    event."""
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
    log, events = import_run(a)
    assert len(events) == 1, events  # no event: no retrain
    assert "the data did not change" in log
    _, events = import_run(b)
    assert len(events) == 2 and events[1]["version"] != version


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
