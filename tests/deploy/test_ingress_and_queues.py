"""#55 items 8 and 9: MLflow's Ingress leads to a login (MLflow's basic auth, or an authenticating proxy); Kueue's
label on TrainJobs and KFP pods."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

from tests.deploy.test_chart import CHART, HELM, K8S_VERSION, REPO, REQUIRED, VALIDATE, find, render, tools
from tests.deploy.test_trainjob import errors

AUTH = ["--set", "mlflow.ingress.enabled=true", "--set", "mlflow.ingressHost=mlflow.example.org"]


@tools
def test_an_ingress_leads_only_to_a_login():
    """On by default, MLflow's basic auth guards every route the Ingress serves (one path, /, to the MLflow Service,
    whose server asks for the login: tests/deploy/test_mlflow_hosts.py); with it off, an Ingress without an auth
    proxy is refused."""
    assert not [d for d in render() if d["kind"] == "Ingress"]  # off by default
    docs = render(*AUTH)
    ingress = find(docs, "Ingress", "-mlflow")
    backends = {p["backend"]["service"]["name"] for r in ingress["spec"]["rules"] for p in r["http"]["paths"]}
    assert backends == {"dpsynth-mlflow"}  # no other Service: nothing reaches MLflow or the ledger page around it
    [mlflow] = find(docs, "Deployment", "-mlflow")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in mlflow["env"]}
    assert "--app-name=dpsynth-ledger" in mlflow["args"] and env["DPSYNTH_LEDGER_AUTH"] == "basic"
    assert env["MLFLOW_BASIC_AUTH_FAIL_CLOSED"] == "true"
    proc = subprocess.run([str(HELM), "template", "dpsynth", str(CHART), *REQUIRED, *AUTH, "--set", "mlflow.auth.enabled=false"],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "mlflow.ingress: with mlflow.auth.enabled=false" in proc.stderr
    [plain] = find(render("--set", "mlflow.ledgerPage=false"), "Deployment", "-mlflow")["spec"]["template"]["spec"]["containers"]
    assert "--app-name=basic-auth" in plain["args"]  # without the ledger page: MLflow's own basic-auth app


@tools
def test_the_ingress_sends_every_request_through_the_proxy(tmp_path):
    docs = render(*AUTH, "--set", "mlflow.auth.enabled=false", "--set", "mlflow.ingress.authUrl=https://oauth2.example.org/oauth2/auth",
                  "--set", "mlflow.ingress.authSignin=https://oauth2.example.org/oauth2/start", "--set",
                  "mlflow.ingress.className=nginx")
    ingress = find(docs, "Ingress", "-mlflow")
    notes = ingress["metadata"]["annotations"]
    assert notes["nginx.ingress.kubernetes.io/auth-url"] == "https://oauth2.example.org/oauth2/auth"
    assert notes["nginx.ingress.kubernetes.io/auth-signin"] == "https://oauth2.example.org/oauth2/start"
    [rule] = ingress["spec"]["rules"]
    assert rule["host"] == "mlflow.example.org"  # also an allowed Host of MLflow's (--allowed-hosts)
    assert rule["http"]["paths"][0]["backend"]["service"]["name"] == "dpsynth-mlflow"
    [mlflow] = find(docs, "Deployment", "-mlflow")["spec"]["template"]["spec"]["containers"]
    assert "mlflow.example.org" in next(a for a in mlflow["args"] if a.startswith("--allowed-hosts="))
    (tmp_path / "ingress.yaml").write_text(yaml.safe_dump(ingress))
    proc = subprocess.run([str(VALIDATE), "--strict", "--quiet", "-k", K8S_VERSION, str(tmp_path / "ingress.yaml")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@tools
def test_trainjobs_and_kfp_pods_get_the_kueue_queue(tmp_path):
    docs = render("--set", "stage.kueueQueue=team-gpu")
    [cm] = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-trainjob")]
    job = yaml.safe_load(cm["data"]["trainjob.yaml"])
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-gpu" and errors(job) == []
    env = find(docs, "ConfigMap", "-airflow-env")["data"]
    out = tmp_path / "p.yaml"
    subprocess.run([sys.executable, str(REPO / "pipelines" / "kfp" / "dpsynth_pipeline.py"), "--compile", str(out)],
                   check=True, capture_output=True, env={**os.environ, **env})
    executors = list(yaml.safe_load_all(out.read_text()))[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for name, executor in executors.items():
        assert executor["podMetadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-gpu", name


@tools
def test_the_partition_key_is_never_a_chart_value():
    """#55 item 6: stage.config reaches Airflow as a ConfigMap: a partition key there would be plain text."""
    proc = subprocess.run([str(HELM), "template", "dpsynth", str(CHART), *REQUIRED, "--set",
                           "stage.config.partition.key=our-secret"], capture_output=True, text=True)
    assert proc.returncode != 0 and "'/stage': 'not' failed" in proc.stderr, proc.stderr
    assert find(render("--set", "stage.config.partition.num_shards=4"), "ConfigMap", "-airflow-env")
