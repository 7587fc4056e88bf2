"""The Helm chart (charts/dpsynth) and the Dockerfiles (images/), checked offline.

Helm and kubernetes-validate live in the tools venv (.venv/tools, `make tools-venv`), run here as
subprocesses; these tests skip when it is absent. Images are not built here (too slow): their
Dockerfiles are linted for structure instead.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "dpsynth"
TOOLS = REPO / ".venv" / "tools" / "bin"
HELM, VALIDATE = TOOLS / "helm", TOOLS / "kubernetes-validate"
K8S_VERSION = "1.33.0"  # validate against a version most clusters run; the chart needs >=1.27
# what every install must give (#34: stage pods share no disk)
REQUIRED = ["--set", "pipeline.runRoot=s3://dpsynth/runs", "--set", "pipeline.datasetUri=s3://dpsynth/data/mnist.parquet",
            "--set", "pipeline.populationId=mnist"]
CREDENTIALS = ["--set", "credentials.create=true", "--set", "credentials.awsAccessKeyId=minio",
               "--set", "credentials.awsSecretAccessKey=minio-secret", "--set", "credentials.postgresPassword=p@ss/word",
               "--set", "credentials.ledgerStagePassword=st@ge/pw1", "--set", "credentials.ledgerAuditorPassword=auditor-pw2",
               "--set", "credentials.mlflowAccessKeyId=mlflow", "--set", "credentials.mlflowSecretAccessKey=mlflow-secret",
               "--set", "credentials.partitionKey=a-key-of-ours", "--set", "credentials.mlflowAdminPassword=mlflow-admin-pw3",
               "--set", "credentials.mlflowServerSecretKey=csrf-key-4"]
VARIANTS = {"default": [], "gpu": ["-f", str(CHART / "values-gpu.yaml")],
            "secrets": CREDENTIALS,
            "external": ["--set", "postgresql.enabled=false", "--set", "postgresql.external.host=db.example.org",
                         "--set", "minio.enabled=false", "--set", "s3.endpoint=https://s3.example.org"]}

tools = pytest.mark.skipif(not (HELM.exists() and VALIDATE.exists()),
                           reason="no .venv/tools (helm, kubernetes-validate): run `make tools-venv`")


def helm(*args: str) -> str:
    """``helm ARGS``' output (it must succeed); ``template`` and ``lint`` get the values every install must give
    (:data:`REQUIRED`) first, so later ``--set`` arguments can replace them."""
    if args and args[0] in ("template", "lint"):
        args = (args[0], *REQUIRED, *args[1:])
    proc = subprocess.run([str(HELM), *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# libyaml's safe loader when PyYAML has it (the same documents, parsed about ten times faster: a chart's render is
# 150 kB, and the deploy tests render it about forty times)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def render(*args: str) -> list[dict]:
    out = helm("template", "dpsynth", str(CHART), "--namespace", "dpsynth", *args)
    return [d for d in yaml.load_all(out, Loader=SAFE_LOADER) if d]


def find(docs: list[dict], kind: str, suffix: str) -> dict:
    [doc] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    return doc


@tools
@pytest.mark.parametrize("variant", VARIANTS)
def test_lint(variant):
    helm("lint", "--strict", str(CHART), *VARIANTS[variant])


@tools
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_manifest_validates(variant, tmp_path):
    docs = render(*VARIANTS[variant])
    assert docs
    files = []
    for i, doc in enumerate(docs):
        files.append(tmp_path / f"{i:02d}-{doc['kind']}.yaml")
        files[-1].write_text(yaml.safe_dump(doc))
    proc = subprocess.run([str(VALIDATE), "--strict", "--quiet", "-k", K8S_VERSION, *map(str, files)],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "ERROR" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@tools
def test_validation_catches_a_bad_manifest(tmp_path):
    """The validation above is not vacuous: a typo in a Deployment fails it."""
    bad = find(render(), "Deployment", "-mlflow")
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    proc = subprocess.run([str(VALIDATE), "--strict", "--quiet", "-k", K8S_VERSION, str(tmp_path / "bad.yaml")],
                          capture_output=True, text=True)
    assert proc.returncode != 0


@tools
def test_the_pipeline_needs_object_store_uris_and_ships_its_config():
    """#34 item 2: no default run root or dataset on a pod's ephemeral disk; the config the image ships."""
    for missing in (["--set", "pipeline.runRoot="], ["--set", "pipeline.datasetUri="]):
        proc = subprocess.run([str(HELM), "template", "dpsynth", str(CHART), *REQUIRED, *missing],
                              capture_output=True, text=True)
        name = missing[1].split("=")[0]
        assert proc.returncode != 0 and f"{name} is required" in proc.stderr, proc.stderr
    proc = subprocess.run([str(HELM), "template", "dpsynth", str(CHART), *REQUIRED, "--set", "pipeline.runRoot=outputs/x"],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "/pipeline/runRoot" in proc.stderr, proc.stderr
    env = find(render("--set", "pipeline.populationId=mnist"), "ConfigMap", "-airflow-env")["data"]
    assert env["DPSYNTH_RUN_ROOT"] == "s3://dpsynth/runs"
    assert env["DPSYNTH_DATASET_URI"] == "s3://dpsynth/data/mnist.parquet"
    assert env["DPSYNTH_CONFIG"] == "/opt/dpsynth/configs/dpgan-mnist-cpu.yaml" and env["DPSYNTH_POPULATION_ID"] == "mnist"
    assert find(render("--set", "pipeline.config="), "ConfigMap", "-airflow-env")["data"]["DPSYNTH_CONFIG"] == ""


@tools
def test_default_values_render_no_secret_and_cpu_settings():
    docs = render()
    assert not [d for d in docs if d["kind"] == "Secret"]  # existingSecret pattern: only when asked
    env = find(docs, "ConfigMap", "-airflow-env")["data"]
    assert env["DPSYNTH_EXECUTOR"] == "kubernetes"
    assert env["DPSYNTH_STAGE_IMAGE"] == "dpsynth-stage:cpu"
    assert env["DPSYNTH_K8S_NAMESPACE"] == "dpsynth"
    assert env["DPSYNTH_GPU_STAGES"] == "pretrain,train" and env["DPSYNTH_GPU_LIMIT"] == "1"
    assert env["DPSYNTH_STAGE_SECRET"] == "dpsynth-stage"


@tools
def test_gpu_values_reach_airflow_env():
    env = find(render(*VARIANTS["gpu"]), "ConfigMap", "-airflow-env")["data"]
    assert env["DPSYNTH_STAGE_IMAGE"] == "dpsynth-stage:cpu" and env["DPSYNTH_GPU_IMAGE"] == "dpsynth-stage:cuda"
    assert env["DPSYNTH_K8S_NAMESPACE"] == "dpsynth-stages"
    assert env["DPSYNTH_GPU_STAGES"] == "pretrain,train,evaluate"
    assert env["DPSYNTH_GPU_LIMIT"] == "1"  # one process per pod; several GPUs: a TrainJob
    assert json.loads(env["DPSYNTH_GPU_NODE_SELECTOR"]) == {
        "cloud.google.com/gke-accelerator": "nvidia-h100-80gb", "dpsynth.io/pool": "gpu"}
    tolerations = json.loads(env["DPSYNTH_GPU_TOLERATIONS"])
    assert {"key": "dpsynth.io/pool", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"} in tolerations
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations


@tools
def test_airflow_env_builds_the_gpu_pod(monkeypatch):
    """The rendered env, read by the DAGs' own dpsynth_pods.pod_settings, gives a GPU pod (needs the
    kubernetes client, present in the Airflow venv; skipped otherwise)."""
    pytest.importorskip("kubernetes")
    import importlib.util
    env = find(render(*VARIANTS["gpu"]), "ConfigMap", "-airflow-env")["data"]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    spec = importlib.util.spec_from_file_location("dpsynth_pods_under_test",
                                                  REPO / "pipelines" / "airflow" / "dags" / "dpsynth_pods.py")
    pods = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pods)
    kw = pods.pod_settings("train")
    assert kw["namespace"] == "dpsynth-stages" and kw["image"] == "dpsynth-stage:cuda"
    assert kw["container_resources"].limits["nvidia.com/gpu"] == "1"
    assert kw["security_context"].run_as_non_root and kw["security_context"].seccomp_profile.type == "RuntimeDefault"
    assert kw["container_security_context"].allow_privilege_escalation is False
    assert kw["container_security_context"].capabilities.drop == ["ALL"]
    assert kw["env_vars"][0].name == "DPSYNTH_IMAGE" and kw["env_vars"][0].value == "dpsynth-stage:cuda"
    assert kw["node_selector"]["dpsynth.io/pool"] == "gpu"
    assert {t.key for t in kw["tolerations"]} == {"nvidia.com/gpu", "dpsynth.io/pool"}
    assert kw["env_from"][0].secret_ref.name == "dpsynth-stage"
    assert kw["env_from"][1].config_map_ref.name == "dpsynth-stage-config"
    assert "nvidia.com/gpu" not in (pods.pod_settings("partition")["container_resources"].limits or {})
    assert "service_account_name" not in kw and "kueue.x-k8s.io/queue-name" not in kw["labels"]


@tools
def test_stage_service_account_and_kueue_queue_reach_the_pods(monkeypatch):
    """stage.serviceAccount (workload identity) and stage.kueueQueue, through the env, on every stage pod."""
    pytest.importorskip("kubernetes")
    import importlib.util
    env = find(render("--set", "stage.serviceAccount=dpsynth-s3", "--set", "stage.kueueQueue=gpu-queue"),
               "ConfigMap", "-airflow-env")["data"]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    spec = importlib.util.spec_from_file_location("dpsynth_pods_sa", REPO / "pipelines" / "airflow" / "dags" / "dpsynth_pods.py")
    pods = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pods)
    for stage in ("partition", "train"):
        kw = pods.pod_settings(stage)
        assert kw["service_account_name"] == "dpsynth-s3" and kw["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"


@tools
@pytest.mark.parametrize("variant", ["default", "gpu"])
def test_rbac_lets_airflow_launch_stage_pods(variant):
    docs = render(*VARIANTS[variant])
    namespace = "dpsynth-stages" if variant == "gpu" else "dpsynth"
    role, binding = find(docs, "Role", "-stage-pods"), find(docs, "RoleBinding", "-stage-pods")
    sa = find(docs, "ServiceAccount", "-airflow")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == namespace
    [rule] = [r for r in role["rules"] if "pods" in r["resources"]]
    assert {"pods", "pods/log", "pods/exec"} <= set(rule["resources"])
    assert {"create", "get", "list", "watch", "delete"} <= set(rule["verbs"])
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "dpsynth"}]


@tools
def test_mlflow_reads_credentials_from_the_secret():
    docs = render()
    [container] = find(docs, "Deployment", "-mlflow")["spec"]["template"]["spec"]["containers"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e}
    # #52 finding 7: MLflow's object-store key is its own (the MLflow bucket only), not the stage pods'; #55 item 8:
    # its login's admin password and CSRF key from the auth Secret
    assert {k: r["name"] for k, r in refs.items()} == {
        "POSTGRES_PASSWORD": "dpsynth-credentials", "LEDGER_AUDITOR_PASSWORD": "dpsynth-credentials",
        "AWS_ACCESS_KEY_ID": "dpsynth-mlflow-s3", "AWS_SECRET_ACCESS_KEY": "dpsynth-mlflow-s3",
        "MLFLOW_AUTH_ADMIN_PASSWORD": "dpsynth-mlflow-auth", "MLFLOW_FLASK_SERVER_SECRET_KEY": "dpsynth-mlflow-auth"}
    assert not any("value" in e and "PASSWORD" in e["name"] for e in container["env"])
    args = " ".join(container["args"])
    assert "--backend-store-uri=postgresql+psycopg2://dpsynth:$(POSTGRES_PASSWORD)@dpsynth-postgresql.dpsynth.svc:5432/mlflow" in args
    assert "--artifacts-destination=s3://mlflow/" in args
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MLFLOW_S3_ENDPOINT_URL"] == "http://dpsynth-minio.dpsynth.svc:9000"


@tools
def test_external_services_replace_postgres_and_minio():
    docs = render(*VARIANTS["external"])
    assert not [d for d in docs if d["kind"] == "StatefulSet" or "minio" in d["metadata"]["name"]]
    [container] = find(docs, "Deployment", "-mlflow")["spec"]["template"]["spec"]["containers"]
    assert "@db.example.org:5432/mlflow" in " ".join(container["args"])
    assert {e["name"]: e.get("value") for e in container["env"]}["MLFLOW_S3_ENDPOINT_URL"] == "https://s3.example.org"


@tools
def test_secrets_rendered_when_asked():
    docs = render(*CREDENTIALS)
    creds = find(docs, "Secret", "-credentials")["stringData"]
    assert set(creds) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "POSTGRES_PASSWORD", "LEDGER_STAGE_PASSWORD",
                          "LEDGER_AUDITOR_PASSWORD"}
    stage = find(docs, "Secret", "-stage")["stringData"]
    # and MLflow's login (mlflow.auth, on by default: #55 item 8)
    assert set(stage) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "DPSYNTH_LEDGER_URL", "MLFLOW_TRACKING_USERNAME",
                          "MLFLOW_TRACKING_PASSWORD"}
    assert stage["MLFLOW_TRACKING_PASSWORD"] == "mlflow-admin-pw3"
    # the stage pods' ledger role (#34: reserve and commit, not set-budget), not the database owner
    assert stage["DPSYNTH_LEDGER_URL"] == ("postgresql+psycopg2://dpsynth_stage:st%40ge%2Fpw1@"
                                           "dpsynth-postgresql.dpsynth.svc:5432/ledger")


@tools
@pytest.mark.parametrize("variant", ["default", "gpu", "external"])
def test_stage_config_map_has_the_non_secret_settings(variant):
    """What KFP's configMapAsEnv (pipelines/kfp) and Airflow's envFrom read, in the stage namespace."""
    docs = render(*VARIANTS[variant])
    config = find(docs, "ConfigMap", "-stage-config")
    assert config["metadata"]["name"] == "dpsynth-stage-config"  # pipelines/kfp: STAGE_CONFIG_MAP
    assert config["metadata"]["namespace"] == ("dpsynth-stages" if variant == "gpu" else "dpsynth")
    data = config["data"]
    assert data["MLFLOW_TRACKING_URI"] == "http://dpsynth-mlflow.dpsynth.svc:5000"
    endpoint = "https://s3.example.org" if variant == "external" else "http://dpsynth-minio.dpsynth.svc:9000"
    assert data["AWS_ENDPOINT_URL_S3"] == data["MLFLOW_S3_ENDPOINT_URL"] == endpoint
    assert find(docs, "ConfigMap", "-airflow-env")["data"]["DPSYNTH_STAGE_CONFIG_MAP"] == "dpsynth-stage-config"


@tools
def test_dags_configmap_carries_the_repository_dags():
    data = find(render(), "ConfigMap", "-dags")["data"]
    dags = REPO / "pipelines" / "airflow" / "dags"
    files = [*dags.glob("*.py"), dags / "dpsynth_config.schema.json"]  # the form is built from the schema
    assert data == {p.name: p.read_text(encoding="utf-8").rstrip("\n") for p in files}


# --- Dockerfiles (no tools needed) ---------------------------------------------------------------

DOCKERFILES = sorted((REPO / "images").glob("*.Dockerfile"))


def test_the_three_dockerfiles_exist():
    assert {p.name for p in DOCKERFILES} == {"stage-cpu.Dockerfile", "stage-cuda.Dockerfile", "airflow.Dockerfile"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_structure(dockerfile):
    lines = [ln.strip() for ln in dockerfile.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    first_from = next(i for i, ln in enumerate(lines) if ln.startswith("FROM "))
    assert any(re.match(r"ARG BASE_IMAGE=\S+", ln) for ln in lines[:first_from]), "ARG BASE_IMAGE=... before FROM"
    assert lines[first_from] == "FROM ${BASE_IMAGE}"
    for ln in lines:
        if ln.startswith(("COPY ", "ADD ")):
            sources = [a for a in ln.split()[1:-1] if not a.startswith("--")]
            for src in sources:
                assert (REPO / src).exists(), f"{dockerfile.name}: {src} is not in the repository"
    assert any(ln.startswith("USER ") and ln.split()[1] not in ("root", "0") for ln in lines), "runs as non-root"
    if dockerfile.name.startswith("stage-"):
        assert 'ENTRYPOINT ["dpsynth"]' in lines


def test_cuda_image_pins_a_cuda_torch_of_the_locked_release():
    locked = re.search(r"^torch==([\d.]+)\+cpu$", (REPO / "requirements" / "stage.lock").read_text(), re.M)
    pins = [ln for ln in (REPO / "images" / "stage-cuda.constraints").read_text().splitlines()
            if ln and not ln.startswith("#")]
    assert len(pins) == 1 and re.fullmatch(rf"torch=={re.escape(locked.group(1))}\+cu\d+", pins[0]), pins


# --- the Airflow image's entrypoint (official-image conventions; the upstream chart's commands) -------

FAKE_AIRFLOW = """#!/usr/bin/env python3
import json, sys
print(json.dumps(sys.argv[1:]))
"""


@pytest.mark.parametrize("args, airflow_argv", [
    (["bash", "-c", "exec airflow scheduler"], ["scheduler"]),             # the chart's components
    (["bash", "-c", "exec \\\nairflow db migrate"], ["db", "migrate"]),    # the chart's migration job
    (["airflow", "db", "check-migrations", "--migration-wait-timeout=60"],  # its wait-for-migrations init
     ["db", "check-migrations", "--migration-wait-timeout=60"]),
    (["api-server"], ["api-server"]),                                       # a bare airflow sub-command
    ([], ["version"]),
])
def test_airflow_entrypoint_runs_what_the_upstream_chart_asks(tmp_path, args, airflow_argv):
    (tmp_path / "airflow").write_text(FAKE_AIRFLOW)
    (tmp_path / "airflow").chmod(0o755)
    proc = subprocess.run(["bash", str(REPO / "images" / "airflow-entrypoint.sh"), *args], capture_output=True,
                          text=True, timeout=30, env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == airflow_argv


def test_airflow_entrypoint_runs_python(tmp_path):
    proc = subprocess.run(["bash", str(REPO / "images" / "airflow-entrypoint.sh"), "python", "-c", "print(6 * 7)"],
                          capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})  # as the image's venv
    assert proc.returncode == 0 and proc.stdout.strip() == "42", proc.stderr


def test_airflow_image_uses_the_entrypoint_under_dumb_init():
    lines = (REPO / "images" / "airflow.Dockerfile").read_text().splitlines()
    [entrypoint] = [json.loads(ln.split(None, 1)[1]) for ln in lines if ln.startswith("ENTRYPOINT ")]
    assert entrypoint[0].endswith("/dumb-init") and entrypoint[1:] == ["--", "/entrypoint"]
    assert "CMD []" in lines
    copies = {ln.split()[-1]: ln.split()[-2] for ln in lines if ln.startswith("COPY ")}
    assert copies["/entrypoint"] == "images/airflow-entrypoint.sh"
    assert copies["/clean-logs"] == "images/airflow-clean-logs.sh"
    assert any(ln.startswith("USER 50000") for ln in lines)


def test_clean_logs_removes_old_task_logs_only(tmp_path):
    import os
    import time

    logs = tmp_path / "logs" / "dag_id=x" / "run_id=old"
    logs.mkdir(parents=True)
    old, new = logs / "attempt=1.log", tmp_path / "logs" / "recent.log"
    old.write_text("old")
    new.write_text("new")
    month_ago = time.time() - 30 * 86400
    os.utime(old, (month_ago, month_ago))
    proc = subprocess.Popen(["bash", str(REPO / "images" / "airflow-clean-logs.sh")], stdout=subprocess.PIPE,
                            env={"PATH": "/usr/bin:/bin", "AIRFLOW_HOME": str(tmp_path),
                                 "AIRFLOW__LOG_RETENTION_DAYS": "15"})
    try:
        deadline = time.time() + 20
        while (old.exists() or logs.exists()) and time.time() < deadline:
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert not old.exists() and not logs.exists() and new.read_text() == "new"


# --- usage telemetry off (MLflow 3 reads MLFLOW_DISABLE_TELEMETRY / DO_NOT_TRACK; Airflow 3.3.2 has none) --

@tools
def test_chart_switches_mlflow_telemetry_off():
    docs = render()
    [container] = find(docs, "Deployment", "-mlflow")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MLFLOW_DISABLE_TELEMETRY"] == "true" and env["DO_NOT_TRACK"] == "true"
    airflow_env = find(docs, "ConfigMap", "-airflow-env")["data"]
    assert airflow_env["MLFLOW_DISABLE_TELEMETRY"] == "true" and airflow_env["DO_NOT_TRACK"] == "true"
    opted_in = find(render("--set", "telemetry.enabled=true"), "Deployment", "-mlflow")
    assert "MLFLOW_DISABLE_TELEMETRY" not in str(opted_in)


@tools
def test_chart_s_mlflow_runs_no_job_consumers():
    """MLflow's server jobs off, as scripts/platform.sh has them: dpsynth submits none, and their consumer processes
    poll (about 3 CPU-s every 10 s of wall time on the 2-core machine, tests/deploy/test_mlflow_hosts.py's server)."""
    [container] = find(render(), "Deployment", "-mlflow")["spec"]["template"]["spec"]["containers"]
    assert {e["name"]: e.get("value") for e in container["env"]}["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    assert "export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false" in (REPO / "scripts" / "platform.sh").read_text()


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_switch_telemetry_off(dockerfile):
    text = dockerfile.read_text()
    assert "DO_NOT_TRACK=true" in text
    if dockerfile.name.startswith("stage-"):  # MLflow lives in the stage images (also the chart's server)
        assert "MLFLOW_DISABLE_TELEMETRY=true" in text


@pytest.mark.parametrize("script", ["scripts/platform.sh", "pipelines/airflow/run_embedded.sh"])
def test_local_scripts_switch_telemetry_off(script):
    """`make up`'s platform and `make run`'s embedded Airflow run (its stages inherit the environment)."""
    exports = [ln for ln in (REPO / script).read_text().splitlines() if ln.startswith("export ")]
    assert any("MLFLOW_DISABLE_TELEMETRY=true" in ln and "DO_NOT_TRACK=true" in ln for ln in exports)


# --- values.schema.json and the `helm test` hook ------------------------------------------------

@tools
@pytest.mark.parametrize("bad, where", [
    (["--set", "mlflow.port=abc"], "/mlflow/port"),
    (["--set", "stage.gpu.stages={pretrain,trian}"], "/stage/gpu/stages/1"),
    (["--set", "minio.enabeld=false"], "enabeld"),
    (["--set", "stage.startupTimeoutSeconds=0"], "/stage/startupTimeoutSeconds"),
    (["--set", "ledger.database=led-ger"], "/ledger/database"),
    # stage.config: dpsynth's own config schema, embedded from the models (scripts/config_schema.py)
    (["--set", "stage.config.train.steps=0"], "/stage/config/train/steps"),
    (["--set", "stage.config.train.stepz=3"], "stepz"),
    (["--set", "stage.config.bogus.x=1"], "bogus"),
    (["--set", "stage.config.train.method=wgan"], "/stage/config/train/method"),
    (["--set", "stage.config.train.n_d=sometimes"], "/stage/config/train/n_d"),
    (["--set-json", "stage.config.privacy.delta=1.5"], "/stage/config/privacy/delta"),
])
def test_values_schema_rejects_bad_values(bad, where):
    proc = subprocess.run([str(HELM), "template", "dpsynth", str(CHART), *bad], capture_output=True, text=True)
    assert proc.returncode != 0 and where in proc.stderr, proc.stderr


@tools
def test_airflow_task_settings_reach_the_airflow_env():
    env = find(render("--set", "stage.startupTimeoutSeconds=1800", "--set", "stage.deferrable=false"),
               "ConfigMap", "-airflow-env")["data"]
    assert env["DPSYNTH_K8S_STARTUP_TIMEOUT_SECONDS"] == "1800" and env["DPSYNTH_K8S_DEFERRABLE"] == "false"
    assert (env["DPSYNTH_TASK_RETRIES"], env["DPSYNTH_TASK_RETRY_DELAY_SECONDS"], env["DPSYNTH_TASK_TIMEOUT_SECONDS"]) == (
        "2", "120", "43200")


@tools
def test_stage_config_reaches_the_airflow_env(tmp_path):
    """The platform's stage settings reach Airflow as DPSYNTH_STAGE_CONFIG (the trigger form's defaults)."""
    values = tmp_path / "values.yaml"
    values.write_text("stage:\n  config:\n    privacy: {epsilon: 3, delta: 1.0e-6}\n    train: {n_d: 5}\n"
                      "    ledger: {population_id: mnist}\n")
    env = find(render("-f", str(values)), "ConfigMap", "-airflow-env")["data"]
    assert json.loads(env["DPSYNTH_STAGE_CONFIG"]) == {"privacy": {"epsilon": 3, "delta": 1e-6}, "train": {"n_d": 5},
                                                       "ledger": {"population_id": "mnist"}}
    assert find(render(), "ConfigMap", "-airflow-env")["data"]["DPSYNTH_STAGE_CONFIG"] == "{}"


def helm_test_pod(docs: list[dict]) -> dict:
    [pod] = [d for d in docs if d["kind"] == "Pod" and d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    return pod


@tools
def test_helm_test_pod_checks_mlflow_and_the_ledger_database():
    pod = helm_test_pod(render())
    [container] = pod["spec"]["containers"]
    assert pod["spec"]["restartPolicy"] == "Never" and container["image"] == "dpsynth-stage:cpu"
    assert container["command"] == ["python", "-c"]
    assert container["args"][0] == (CHART / "files" / "test_connections.py").read_text()
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["MLFLOW_URL"] == "http://dpsynth-mlflow.dpsynth.svc:5000"
    assert (env["PGHOST"], env["PGPORT"], env["PGUSER"], env["PGDATABASE"]) == (
        "dpsynth-postgresql.dpsynth.svc", "5432", "dpsynth_auditor", "ledger")  # the ledger page's role
    assert env["PGPASSWORD"] == {"secretKeyRef": {"name": "dpsynth-credentials", "key": "LEDGER_AUDITOR_PASSWORD"}}
    [no_mlflow] = helm_test_pod(render("--set", "mlflow.enabled=false"))["spec"]["containers"]
    assert "MLFLOW_URL" not in {e["name"] for e in no_mlflow["env"]}
    assert not [d for d in render("--set", "tests.enabled=false") if d["kind"] == "Pod"]


@pytest.fixture
def mlflow_health():
    """An HTTP server answering /health like MLflow's (``OK``) and its experiments search; its URL."""
    import http.server
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            ok = self.path == "/health" or self.path.startswith("/api/2.0/mlflow/experiments/search")
            self.send_response(200 if ok else 404)
            self.end_headers()
            self.wfile.write(b"OK" if ok else b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_helm_test_script_passes_and_fails_for_real(postgres, mlflow_health):
    """The hook's script against a real PostgreSQL and an MLflow-like /health."""
    script = str(CHART / "files" / "test_connections.py")

    def check(**env):
        return subprocess.run([sys.executable, script], env={"PATH": "/usr/bin:/bin", **postgres, **env},
                              capture_output=True, text=True, timeout=60)

    from sqlalchemy.engine import URL

    from dpsynth.ledger.store import Ledger

    Ledger(URL.create("postgresql+psycopg2", username=postgres["PGUSER"], password=postgres["PGPASSWORD"],  # its tables
                      host=postgres["PGHOST"], port=int(postgres["PGPORT"]), database=postgres["PGDATABASE"]))
    ok = check(MLFLOW_URL=mlflow_health)
    assert ok.returncode == 0 and "MLflow /health: OK" in ok.stdout and "reachable" in ok.stdout, ok.stdout + ok.stderr
    assert check(MLFLOW_URL=mlflow_health, PGPASSWORD="wrong").returncode == 1
    assert check(MLFLOW_URL=mlflow_health, PGDATABASE="nope").returncode == 1
    assert check(MLFLOW_URL=mlflow_health + "/nothing-here").returncode == 1
