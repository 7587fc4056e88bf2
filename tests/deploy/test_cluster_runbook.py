"""docs/cluster.md's Install, walked as a script (#55, "Done when").

Every command of the runbook's Install section (its ``sh`` blocks, in order) is interpreted against a model of the
cluster that the earlier commands built: namespaces, Secrets with their keys, Helm releases (the dpsynth chart
rendered by ``helm template`` with the runbook's own ``my-values.yaml``; the upstream Airflow chart as its values),
Airflow pools, the images the build step pushes (``scripts/build_image.sh``'s ``IMAGES``). A command the walk does not
know fails it. Then:

- every object a command names (a namespace, a ConfigMap, a release, a Deployment) exists by then;
- every Secret a pod reads (env, envFrom, volumes, imagePullSecrets) — the chart's pods, the stage pods the DAGs build
  from the rendered Airflow env, the TrainJob template, the upstream chart's values, the compiled KFP pipeline — was
  created in its namespace, with the key it reads;
- every image any of them names is one the build step pushed (or a pinned third-party image);
- every pod passes PodSecurity "restricted" (tests/deploy/test_pod_security.py's rules), the XCom sidecars too;
- the KFP pipeline compiled as the runbook says (the chart's Airflow env exported, the stage venv's python, no
  PYTHONPATH) puts the GPU stages on the CUDA image and the GPU pool of values-gpu.yaml.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.test_chart import CHART, HELM, REPO, tools
from tests.deploy.test_pod_security import airflow_pods, pod_specs, violations

DOC = REPO / "docs" / "cluster.md"
THIRD_PARTY = ("docker.io/library/postgres:", "quay.io/minio/minio:", "quay.io/minio/mc:")


def section(text: str, start: str, end: str) -> str:
    return text[text.index(start):text.index(end)]


def commands(text: str) -> list[str]:
    """The commands of the ``sh`` blocks of ``text``, continuation lines joined, comments dropped."""
    out = []
    for block in re.findall(r"^( *)```sh\n(.*?)^\1```", text, re.S | re.M):
        indent, body = block
        joined = re.sub(r"\\\n\s*", " ", "\n".join(line[len(indent):] for line in body.splitlines()))
        out += [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]
    return out


def my_values(text: str) -> dict:
    """The runbook's ``my-values.yaml``: the yaml block of its Values section."""
    [block] = re.findall(r"```yaml\n(.*?)```", section(text, "## Values", "### Ledger roles"), re.S)
    return yaml.safe_load(block)


def build_images() -> list[str]:
    script = (REPO / "scripts" / "build_image.sh").read_text()
    block = re.search(r"^IMAGES=\((.*?)^\)", script, re.S | re.M)[1]
    return [line.split()[0] for line in re.findall(r'"([^"]+)"', block)]


class Cluster:
    def __init__(self, values_file: Path):
        self.values_file = values_file
        self.namespaces: set[str] = set()
        self.secrets: dict[tuple[str, str], set[str]] = {}
        self.pushed: set[str] = set()
        self.repos: set[str] = set()
        self.releases: dict[str, dict] = {}   # name -> {"namespace", "docs" | "values"}
        self.pools: set[str] = set()
        self.env: dict[str, str] = {}          # what `eval "$(kubectl get configmap ...)"` exported
        self.compiled: list[dict] | None = None
        self.tmp = values_file.parent

    def need_namespace(self, ns: str, command: str) -> None:
        assert ns in self.namespaces, f"{command!r}: namespace {ns} is created by no earlier step"

    def docs(self) -> list[dict]:
        return [d for r in self.releases.values() for d in r.get("docs", [])]

    def run(self, command: str) -> None:
        if command.startswith("eval "):
            return self.export(command)
        argv = shlex.split(command, comments=True)
        env = {}
        while argv and re.match(r"^[A-Z_]+=", argv[0]):
            k, v = argv.pop(0).split("=", 1)
            env[k] = v
        ns = None
        if argv[:1] == ["kubectl"] and argv[1] == "-n":
            ns = argv[2]
            argv = ["kubectl", *argv[3:]]
        match argv:
            case ["scripts/build_image.sh", "all", "--push"]:
                self.pushed |= {f"{env['REGISTRY'].rstrip('/')}/{name}" for name in build_images()}
            case ["kubectl", "create", "namespace", name]:
                self.namespaces.add(name)
            case ["kubectl", "label", "namespace", *rest]:
                for name in rest[:-1]:
                    self.need_namespace(name, command)
                assert rest[-1] == "pod-security.kubernetes.io/enforce=restricted", command
            case ["kubectl", "create", "secret", "generic", name, *options]:
                self.need_namespace(ns, command)
                self.secrets[(ns, name)] = {o.split("=", 2)[1] for o in options if o.startswith("--from-literal=")}
            case ["kubectl", "create", "secret", "docker-registry", name, *_]:
                self.need_namespace(ns, command)
                self.secrets[(ns, name)] = {".dockerconfigjson"}
            case ["helm", "repo", "add", name, url]:
                self.repos.add(name)
            case ["helm", "install", release, chart, *options]:
                self.install(release, chart, options, command)
            case ["helm", "test", release, "-n", namespace]:
                assert self.releases[release]["namespace"] == namespace, command
                assert [d for d in self.releases[release]["docs"] if d["kind"] == "Pod" and
                        d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"], command
            case ["kubectl", "exec", target, "--", "airflow", "pools", "set", pool, slots, _]:
                airflow = [n for n, r in self.releases.items() if "values" in r and r["namespace"] == ns]
                assert airflow and target == f"deploy/{airflow[0]}-scheduler", f"{command!r}: no such Deployment"
                assert int(slots) > 0
                self.pools.add(pool)
            case [".venv/stage/bin/python", "pipelines/kfp/dpsynth_pipeline.py", "--compile", path]:
                assert (REPO / argv[0]).exists(), argv[0]
                out = self.tmp / path
                env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",) and
                          not k.startswith("DPSYNTH_")}, **self.env}
                done = subprocess.run([str(REPO / argv[0]), argv[1], "--compile", str(out)], cwd=REPO, env=env,
                                      capture_output=True, text=True, timeout=300)
                assert done.returncode == 0, done.stderr[-3000:]
                self.compiled = list(yaml.safe_load_all(out.read_text()))
            case _:
                raise AssertionError(f"the runbook walk does not know this command: {command!r}")

    def install(self, release: str, chart: str, options: list[str], command: str) -> None:
        namespace = options[options.index("-n") + 1]
        self.need_namespace(namespace, command)
        files = [options[i + 1] for i, o in enumerate(options) if o == "-f"]
        sets = [options[i + 1] for i, o in enumerate(options) if o == "--set"]
        if chart == "charts/dpsynth":
            paths = [str(self.values_file if f == "my-values.yaml" else REPO / f) for f in files]
            args = [a for p in paths for a in ("-f", p)] + [a for s in sets for a in ("--set", s)]
            out = subprocess.run([str(HELM), "template", release, str(CHART), "-n", namespace, *args],
                                 capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
            docs = [d for d in yaml.safe_load_all(out.stdout) if d]
            for d in docs:  # every namespace the chart renders into exists
                self.need_namespace(d["metadata"].get("namespace", namespace), f"{command!r} ({d['kind']})")
            self.releases[release] = {"namespace": namespace, "docs": docs}
        elif chart == "apache-airflow/airflow":
            assert "apache-airflow" in self.repos, f"{command!r}: the chart repository is added by no earlier step"
            assert "--version" in options, f"{command!r}: the upstream chart's version is not pinned"
            values: dict = {}
            for f in files:
                values = merge(values, yaml.safe_load((REPO / f).read_text()))
            for s in sets:
                key, value = s.split("=", 1)
                node = values
                *path, last = key.split(".")
                for p in path:
                    node = node.setdefault(p, {})
                node[last] = value
            self.releases[release] = {"namespace": namespace, "values": values}
        else:
            raise AssertionError(f"{command!r}: an unknown chart")

    def export(self, command: str) -> None:
        """``eval "$(kubectl -n NS get configmap NAME -o go-template=…{{printf "%q" $v}}…)"``: the ConfigMap must be
        rendered by a release in NS; its data, quoted as Go's %q does, evaluated by bash."""
        inner = re.fullmatch(r'eval "\$\((kubectl .*)\)"', command)[1]
        argv = shlex.split(inner)
        assert argv[:2] == ["kubectl", "-n"] and argv[3:5] == ["get", "configmap"], command
        ns, name = argv[2], argv[5]
        assert '{{printf "%q" $v}}' in argv[-1]
        [cm] = [d for r in self.releases.values() if r["namespace"] == ns for d in r.get("docs", [])
                if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name]
        lines = "".join(f"export {k}={json.dumps(v)}\n" for k, v in sorted(cm["data"].items()))  # Go's %q for these
        shown = subprocess.run(["bash", "-c", f'eval "$1"; python3 -c "import json, os; print(json.dumps(dict('
                                f'(k, v) for k, v in os.environ.items() if k in {sorted(cm["data"])!r})))"', "_", lines],
                               capture_output=True, text=True, check=True)
        self.env = json.loads(shown.stdout)
        assert self.env == cm["data"]  # the quoting survives bash


def merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def secret_refs(spec: dict) -> set[tuple[str, str | None]]:
    """(Secret, key) pairs a pod spec reads (key None: the whole Secret)."""
    refs = {(s["name"], None) for s in spec.get("imagePullSecrets") or []}
    refs |= {(v["secret"]["secretName"], None) for v in spec.get("volumes") or [] if "secret" in v}
    for c in [*(spec.get("initContainers") or []), *spec.get("containers", [])]:
        for e in c.get("env") or []:
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref and not ref.get("optional"):
                refs.add((ref["name"], ref["key"]))
        refs |= {(e["secretRef"]["name"], None) for e in c.get("envFrom") or [] if "secretRef" in e}
    return refs


@pytest.fixture(scope="module")
def walked(tmp_path_factory):
    if not HELM.exists():
        pytest.skip("no .venv/tools (helm): run `make tools-venv`")
    text = DOC.read_text()
    tmp = tmp_path_factory.mktemp("runbook")
    (tmp / "my-values.yaml").write_text(yaml.safe_dump(my_values(text)))
    cluster = Cluster(tmp / "my-values.yaml")
    for command in commands(section(text, "## Install", "## First run")):
        cluster.run(command)
    return cluster


@tools
def test_every_secret_a_pod_reads_is_created_by_a_step(walked):
    missing = []

    def need(ns, name, key, who):
        keys = walked.secrets.get((ns, name))
        if keys is None or (key is not None and key not in keys):
            missing.append(f"{who}: Secret {ns}/{name}" + (f" key {key}" if key else ""))

    for release in walked.releases.values():
        for d in release.get("docs", []):
            ns = d["metadata"].get("namespace", release["namespace"])
            for who, spec in pod_specs([d]).items():
                for name, key in secret_refs(spec):
                    need(ns, name, key, who)
    [env] = [d["data"] for d in walked.docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-airflow-env")]
    stages = env["DPSYNTH_K8S_NAMESPACE"]
    need(stages, env["DPSYNTH_STAGE_SECRET"], "DPSYNTH_LEDGER_URL", "stage pods")
    need(stages, env["DPSYNTH_PARTITION_KEY_SECRET"], "DPSYNTH_PARTITION_KEY", "the partition pod")
    [mlflow] = [d for d in walked.docs() if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-mlflow")]
    if any(e["name"] == "MLFLOW_AUTH_CONFIG_PATH" for e in mlflow["spec"]["template"]["spec"]["containers"][0]["env"]):
        for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):  # MLflow asks the stage pods for a login
            need(stages, env["DPSYNTH_STAGE_SECRET"], key, "stage pods (MLflow's login)")
    for name in env.get("DPSYNTH_IMAGE_PULL_SECRETS", "").split(","):
        need(stages, name, None, "stage pods' imagePullSecrets")
    [template] = [d for d in walked.docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-trainjob")]
    for ref in re.findall(r"secretKeyRef: \{name: ([\w-]+), key: (\w+)\}", template["data"]["trainjob.yaml"]):
        need(template["metadata"]["namespace"], *ref, "the TrainJob template")
    [airflow] = [r for r in walked.releases.values() if "values" in r]
    values = airflow["values"]
    need(airflow["namespace"], values["data"]["metadataSecretName"], "connection", "Airflow's metadata database")
    need(airflow["namespace"], values["registry"]["secretName"], None, "Airflow's imagePullSecrets")
    for v in values["apiServer"]["extraVolumes"]:
        if "secret" in v:
            need(airflow["namespace"], v["secret"]["secretName"], "passwords.json", "Airflow's login")
    for executor in walked.compiled[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"].values():
        for s in executor.get("secretAsEnv", []):
            for k in s["keyToEnv"]:
                need(stages, s["secretName"], k["secretKey"], "KFP pods (the profile namespace: docs/cluster.md)")
    assert missing == []


@tools
def test_every_image_is_produced_by_the_build_step(walked):
    named = set()
    for d in walked.docs():
        for spec in pod_specs([d]).values():
            named |= {c["image"] for c in [*(spec.get("initContainers") or []), *spec["containers"]]}
    [env] = [d["data"] for d in walked.docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-airflow-env")]
    named |= {env["DPSYNTH_STAGE_IMAGE"], env["DPSYNTH_GPU_IMAGE"]}
    [template] = [d for d in walked.docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-trainjob")]
    named |= set(re.findall(r"image: \"?([^\s\"]+)", template["data"]["trainjob.yaml"]))
    [airflow] = [r["values"] for r in walked.releases.values() if "values" in r]
    named.add(f"{airflow['images']['airflow']['repository']}:{airflow['images']['airflow']['tag']}")
    named |= {e["container"]["image"] for e in walked.compiled[0]["deploymentSpec"]["executors"].values()}
    unbuilt = sorted(i for i in named if i not in walked.pushed and not i.startswith(THIRD_PARTY))
    assert unbuilt == [], f"images no step builds: {unbuilt} (built: {sorted(walked.pushed)})"
    assert all(":" in i and not i.endswith(":latest") for i in named)


@tools
def test_every_pod_is_restricted(walked):
    bad = {}
    for d in walked.docs():
        for name, spec in pod_specs([d]).items():
            if violations(spec):
                bad[name] = violations(spec)
    [env] = [d["data"] for d in walked.docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-airflow-env")]
    for name, spec in airflow_pods(env).items():  # the stage pods the DAGs create, XCom sidecars included
        if violations(spec):
            bad[name] = violations(spec)
    assert bad == {}


@tools
def test_the_gpu_stages_get_the_pool_the_images_and_the_placement(walked):
    [env] = [d["data"] for d in walked.docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-airflow-env")]
    assert env["DPSYNTH_GPU_POOL"] in walked.pools  # Airflow schedules no task of a missing pool
    assert env["DPSYNTH_POPULATION_ID"] == "mnist"
    values_gpu = yaml.safe_load((CHART / "values-gpu.yaml").read_text())["stage"]["gpu"]
    pool = {k: v for k, v in values_gpu["nodeSelector"].items() if v is not None}
    platform = walked.compiled[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    executors = walked.compiled[0]["deploymentSpec"]["executors"]
    for name in ("exec-dpsynth-pretrain-shard", "exec-dpsynth-train", "exec-dpsynth-evaluate"):
        assert executors[name]["container"]["image"] == "registry.example.org/ml/dpsynth-stage:cuda", name
        assert platform[name]["nodeSelector"]["labels"] == pool, name
        assert {t["key"] for t in platform[name]["tolerations"]} == {t["key"] for t in values_gpu["tolerations"]}
    assert executors["exec-dpsynth-sample"]["container"]["image"] == "registry.example.org/ml/dpsynth-stage:cpu"
    for name, executor in platform.items():
        assert executor["securityContext"]["runAsNonRoot"] is True, name
        assert [s["secretName"] for s in executor["imagePullSecret"]] == ["regcred"], name


@tools
def test_the_airflow_install_unpauses_its_dags_and_reads_a_psycopg2_url(walked):
    [airflow] = [r for r in walked.releases.values() if "values" in r]
    core = airflow["values"]["config"]["core"]
    assert core["dags_are_paused_at_creation"] == "False" and core["simple_auth_manager_all_admins"] == "False"
    metadata = [c for c in commands(section(DOC.read_text(), "## Install", "## First run")) if "airflow-metadata" in c]
    assert metadata and all("postgresql+psycopg2://" in c for c in metadata)


def test_the_walk_refuses_what_it_does_not_know(tmp_path):
    cluster = Cluster(tmp_path / "v.yaml")
    with pytest.raises(AssertionError, match="does not know"):
        cluster.run("kubectl apply -f something.yaml")
    with pytest.raises(AssertionError, match="namespace dpsynth-stages is created by no earlier step"):
        cluster.run("kubectl -n dpsynth-stages create secret generic dpsynth-stage --from-literal=A=b")
