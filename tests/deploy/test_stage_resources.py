"""Per-stage resources as chart values (issue #34): stage.resources reaches Airflow's stage pods (the rendered env,
read by the DAGs' own dpsynth_pods.pod_settings) and, as DPSYNTH_STAGE_RESOURCES at compile time, KFP's."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.deploy.test_chart import REPO, find, render, tools

VALUES = {"cpu": {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"memory": "3Gi"}},
          "stages": {"evaluate": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "3", "memory": "16Gi"}},
                     "train": {"requests": {"cpu": "8", "memory": "60Gi"}, "limits": {"memory": "64Gi"}}}}


@tools
def test_stage_resources_reach_the_airflow_pods(monkeypatch):
    pytest.importorskip("kubernetes")
    env = find(render("--set-json", f"stage.resources={json.dumps(VALUES)}"), "ConfigMap", "-airflow-env")["data"]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    spec = importlib.util.spec_from_file_location("dpsynth_pods_resources",
                                                  REPO / "pipelines" / "airflow" / "dags" / "dpsynth_pods.py")
    pods = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pods)

    def of(stage):
        r = pods.pod_settings(stage)["container_resources"]
        return r.requests, r.limits

    assert of("evaluate") == (VALUES["stages"]["evaluate"]["requests"], VALUES["stages"]["evaluate"]["limits"])
    assert of("partition") == (VALUES["cpu"]["requests"], VALUES["cpu"]["limits"])  # "cpu" given, replaces the default
    assert of("train") == (VALUES["stages"]["train"]["requests"], {"memory": "64Gi", "nvidia.com/gpu": "1"})
    assert of("pretrain") == ({"cpu": "4", "memory": "16Gi"}, {"memory": "32Gi", "nvidia.com/gpu": "1"})  # gpu: default


@tools
def test_the_values_schema_refuses_an_unknown_stage():
    proc = subprocess.run([str(REPO / ".venv" / "tools" / "bin" / "helm"), "template", "dpsynth", str(REPO / "charts" / "dpsynth"),
                           "--set", "pipeline.runRoot=s3://d/r", "--set", "pipeline.datasetUri=s3://d/x.parquet",
                           "--set", "stage.resources.stages.trian.requests.cpu=1"], capture_output=True, text=True)
    assert proc.returncode != 0 and "trian" in proc.stderr


def test_stage_resources_reach_the_kfp_pods(tmp_path):
    out = tmp_path / "pipeline.yaml"
    subprocess.run([sys.executable, str(REPO / "pipelines" / "kfp" / "dpsynth_pipeline.py"), "--compile", str(out)],
                   check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "DPSYNTH_POPULATION_ID": "mnist", "DPSYNTH_STAGE_RESOURCES": json.dumps(VALUES)})
    executors = list(yaml.safe_load_all(out.read_text()))[0]["deploymentSpec"]["executors"]

    def of(stage):
        r = executors[f"exec-dpsynth-{stage}"]["container"]["resources"]
        return {k: v for k, v in r.items() if k.startswith("resource") and k.endswith(("Request", "Limit"))}

    assert of("evaluate") == {"resourceCpuRequest": "2", "resourceMemoryRequest": "8Gi", "resourceCpuLimit": "3",
                              "resourceMemoryLimit": "16Gi"}
    assert of("partition") == {"resourceCpuRequest": "500m", "resourceMemoryRequest": "2Gi", "resourceMemoryLimit": "3Gi"}
    assert of("train") == {"resourceCpuRequest": "8", "resourceMemoryRequest": "60Gi", "resourceMemoryLimit": "64Gi"}
    assert of("pretrain-shard") == {"resourceCpuRequest": "4", "resourceMemoryRequest": "16Gi",
                                     "resourceMemoryLimit": "32Gi"}
