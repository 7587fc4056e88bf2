"""#55 item 3: the DAGs are unpaused on deploy, so an import's asset event queues the retrain.

A paused DAG gets no queued run from an asset event (Airflow's AssetManager queues only DAGs that are not paused), and
Airflow pauses every new DAG by default (``[core] dags_are_paused_at_creation``): a fresh cluster dropped the import's
events and never retrained. Here, on a fresh metadata database: the DAGs as the DAG processor first stores them
(``airflow dags reserialize``) are unpaused, and ``airflow dags test dpsynth_import_data`` with the real
``dpsynth data import`` leaves a queued run of ``dpsynth_retrain_on_new_data`` for the dataset's asset (what the
scheduler turns into the retrain's DAG run). The upstream chart's values say the same (values-airflow.yaml).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import yaml

from dpsynth.data import import_source, write_parquet
from tests.pipelines.test_airflow import AIRFLOW_BIN, REPO, airflow_db, airflow_env, migrated_db  # noqa: F401 (fixtures)

MNIST = REPO / "data" / "mnist"


def test_dags_start_unpaused_and_an_import_queues_the_retrain(airflow_db, tmp_path):  # noqa: F811
    source, dst = tmp_path / "a.parquet", tmp_path / "data" / "mnist.parquet"
    write_parquet(import_source(MNIST).subset(np.arange(100)), source)
    env = {**airflow_db, "DPSYNTH_DATASET_URI": str(dst)}
    airflow = str(AIRFLOW_BIN / "airflow")
    subprocess.run([airflow, "dags", "reserialize"], env=env, cwd=REPO, check=True, capture_output=True, timeout=300)
    db = sqlite3.connect(Path(airflow_db["AIRFLOW_HOME"]) / "airflow.db")
    paused = dict(db.execute("SELECT dag_id, is_paused FROM dag WHERE dag_id LIKE 'dpsynth_%'").fetchall())
    assert paused == {"dpsynth_import_data": 0, "dpsynth_retrain_on_new_data": 0, "dpsynth_train": 0}
    proc = subprocess.run([airflow, "dags", "test", "dpsynth_import_data", "-c", json.dumps({"source": str(source)})],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    queued = db.execute("SELECT q.target_dag_id, a.name FROM asset_dag_run_queue q JOIN asset a ON a.id = q.asset_id"
                        ).fetchall()
    assert queued == [("dpsynth_retrain_on_new_data", str(dst))]


def test_the_upstream_charts_values_unpause_and_log_in():
    values = yaml.safe_load((REPO / "charts" / "dpsynth" / "values-airflow.yaml").read_text())
    core = values["config"]["core"]
    assert core["dags_are_paused_at_creation"] == "False"
    assert core["auth_manager"].endswith("SimpleAuthManager") and core["simple_auth_manager_all_admins"] == "False"
