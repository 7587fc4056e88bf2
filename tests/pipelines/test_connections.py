"""Airflow Connections for MLflow and S3 (issue #34), Variables as the fallback: the plan task takes the tracking URI
from the Connection ``dpsynth_mlflow``, a local stage process its S3 keys and endpoint from ``dpsynth_s3``; both read
at run time through Airflow's secrets backends (here ``AIRFLOW_CONN_*``), none at parse time."""

from __future__ import annotations

import json

from tests.airflow_fixtures import LOAD, in_airflow

PLAN = LOAD + """
    import dpsynth_pipeline, dpsynth_pods
    dag = bag.dags["dpsynth_train"]
    plan = dpsynth_pipeline.plan.function(params={**dag.params.dump(), "config": None}, run_id="r1")
    print(json.dumps({"start": plan["argv"]["start"], "s3": dpsynth_pods.s3_env()}))
"""


def sets(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]


def test_the_connections_give_mlflow_and_s3(airflow_env):
    env = {**airflow_env, "DPSYNTH_TRACKING_URI": "http://from-the-variable:5000",
           "AIRFLOW_CONN_DPSYNTH_MLFLOW": json.dumps({"conn_type": "http", "host": "dpsynth-mlflow.dpsynth.svc",
                                                      "port": 5000}),
           "AIRFLOW_CONN_DPSYNTH_S3": json.dumps({"conn_type": "aws", "login": "AKIA-test", "password": "s3cret",
                                                  "extra": {"endpoint_url": "http://minio:9000",
                                                            "region_name": "eu-west-1"}})}
    out = in_airflow(PLAN, env)
    assert "tracking.uri=http://dpsynth-mlflow.dpsynth.svc:5000" in sets(out["start"])
    assert out["s3"] == {"AWS_ACCESS_KEY_ID": "AKIA-test", "AWS_SECRET_ACCESS_KEY": "s3cret",
                         "AWS_ENDPOINT_URL_S3": "http://minio:9000", "MLFLOW_S3_ENDPOINT_URL": "http://minio:9000",
                         "AWS_DEFAULT_REGION": "eu-west-1"}


def test_without_connections_the_variable_decides(airflow_env):
    out = in_airflow(PLAN, {**airflow_env, "AIRFLOW_VAR_DPSYNTH_TRACKING_URI": "https://mlflow.example.org"})
    assert "tracking.uri=https://mlflow.example.org" in sets(out["start"]) and out["s3"] == {}
    out = in_airflow(PLAN, {**airflow_env, "AIRFLOW_CONN_DPSYNTH_MLFLOW": "https://mlflow.internal.example.org:8443"})
    assert "tracking.uri=https://mlflow.internal.example.org:8443" in sets(out["start"])  # a URI connection
