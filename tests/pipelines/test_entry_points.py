"""Every entry point trains the recipe `make run` trains (issue #34, item 4).

A UI trigger of ``dpsynth_train`` with only the dataset filled in, a REST trigger (``conf`` with only the dataset),
``make run``'s own trigger (``run_embedded.sh``'s conf), an Asset-scheduled retrain and the KFP cluster pipeline
with only its required inputs each build the stage command lines; the settings those resolve to (``--config`` plus
the ``--set`` list, through ``load_config``, as the stages do) must equal ``dpsynth config show`` of the make-run
config with the same dataset and population. Before, every form field was sent as ``--set`` with the schema's
default (train.steps 2000, train.n_d adaptive, ...), and the KFP pipeline had no config input at all.

Also: the governance settings are refused in the extra settings, in Airflow and in the KFP container program.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.airflow_fixtures import AIRFLOW_BIN, LOAD, in_airflow

REPO = Path(__file__).resolve().parents[2]
CONFIG = "configs/dpgan-mnist-cpu.yaml"
DATASET, POPULATION, TRACKING = "s3://bucket/data/mnist.parquet", "mnist", "http://mlflow.example:5000"
# #55 item 5: settings the form used to accept that are the platform's (tracking.enabled=false came after the
# platform's true, so the run went untracked)
REFUSED = ("tracking.enabled=false", "partition.key=mine", "audit.confidence=0.5",
           "data.public_fraction_unprotected=true")


def show(*args: str) -> dict:
    """``dpsynth config show --json`` of the stage venv, run as its own process: the settings a stage given these
    arguments runs with."""
    out = subprocess.run([sys.executable, "-m", "dpsynth.cli", "config", "show", "--json", *args], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def shown(*args: str) -> dict:
    """The same as ``show``, in this process (the CLI's parser and its ``config show`` action, without
    ``main``'s process set-up): each comparison below costs no interpreter start; ``make_run_settings`` keeps
    the real entry point on the other side of every comparison."""
    return json.loads(_shown(args))


@functools.cache
def _shown(args: tuple[str, ...]) -> str:
    from dpsynth import cli

    parsed = cli.build_parser().parse_args(["config", "show", "--json", *args])
    out = io.StringIO()
    with contextlib.chdir(REPO), contextlib.redirect_stdout(out):
        assert parsed.func(parsed) == 0
    return out.getvalue()


@functools.cache
def _make_run_settings() -> str:
    return json.dumps(show("--config", CONFIG, "--set", f"data.uri={DATASET}", "--set",
                           f"ledger.population_id={POPULATION}", "--set", "tracking.enabled=true",
                           "--set", f"tracking.uri={TRACKING}"))


def make_run_settings() -> dict:
    """What `make run` trains: its config, its dataset and population, tracked at the platform's URI (through
    the real ``dpsynth`` entry point, once per test process; a fresh copy for each caller to change)."""
    return json.loads(_make_run_settings())


def resolved(argv: list[str]) -> dict:
    """The settings of a stage argv (``dpsynth <stage> ...``): its --config and --set, as the stage reads them."""
    args = []
    it = iter(argv)
    for a in it:
        if a in ("--config", "--set"):
            args += [a, next(it)]
    return shown(*args)


@pytest.fixture(scope="module")
def airflow_argvs(airflow_env):
    if not (AIRFLOW_BIN / "airflow").exists():
        pytest.skip(".venv/airflow is missing")
    env = {**airflow_env, "DPSYNTH_CONFIG": CONFIG, "DPSYNTH_POPULATION_ID": POPULATION,
           "DPSYNTH_TRACKING_URI": TRACKING}
    return in_airflow(LOAD + f"""
    import copy, types
    import dpsynth_pipeline
    DATASET = {DATASET!r}
    def plan_of(dag, values, events=None):
        params = copy.deepcopy(bag.dags[dag].params)
        params.update(values)   # what the form's submit and a REST trigger's conf do
        params.validate()
        context = {{"params": params.dump(), "run_id": "manual__2026-11-27", "triggering_asset_events": events}}
        return dpsynth_pipeline.plan.function(**context)["argv"]["train"]
    event = types.SimpleNamespace(timestamp=1, extra={{"dataset_uri": DATASET, "sha256": "x", "rows": 1}})
    refused = []
    for item in ("ledger.url=sqlite:////tmp/fresh.db", "tracking.uri=file:/tmp/x", "privacy.accounting=paper",
                 "ledger.population_id=other", *{REFUSED!r}, "train.steps=5"):
        try:
            plan_of("dpsynth_train", {{"dataset_uri": DATASET, "overrides": [item]}})
            refused.append(None)
        except Exception as exc:
            refused.append(type(exc).__name__ + ": " + str(exc))
    print(json.dumps({{
        "ui": plan_of("dpsynth_train", {{"dataset_uri": DATASET}}),
        "rest": plan_of("dpsynth_train", {{"dataset_uri": DATASET}}),
        "make_run": plan_of("dpsynth_train", {{"dataset_uri": DATASET, "config": {CONFIG!r}, "run_root": "/tmp/runs",
                                               "pipeline_run_id": "make-run-x", "population_id": {POPULATION!r}}}),
        "retrain": plan_of("dpsynth_retrain_on_new_data", {{}}, {{"asset": [event]}}),
        "refused": refused,
    }}))
    """, env)


@pytest.mark.parametrize("entry", ["ui", "rest", "make_run", "retrain"])
def test_airflow_triggers_train_the_make_run_recipe(airflow_argvs, entry):
    assert resolved(airflow_argvs[entry]) == make_run_settings()


def test_make_run_triggers_like_the_ui():
    """make run's conf fills in only what a UI trigger does (dataset, config, run root, run id, population)."""
    script = (REPO / "pipelines" / "airflow" / "run_embedded.sh").read_text()
    block = script[script.index("print(json.dumps("):script.index("PY\n)")]
    assert set(re.findall(r'"(\w+)":', block)) == {"dataset_uri", "config", "run_root", "pipeline_run_id",
                                                   "population_id"}


def test_airflow_extra_settings_accept_only_the_recipe_settings(airflow_argvs):
    """#55 item 5: the plan task (the run's first: nothing reserved) refuses every setting that is not on the
    allow-list with one line naming it and who sets it (before: a governance deny-list, and a 3,591-character
    pattern as the form's message), and never retries (AirflowFailException)."""
    *refused, allowed = airflow_argvs["refused"]
    assert allowed is None
    names = ("ledger.url", "tracking.uri", "privacy.accounting", "ledger.population_id",
             *(item.split("=")[0] for item in REFUSED))
    for name, message in zip(names, refused, strict=True):
        kind, _, text = message.partition(": ")
        assert kind == "AirflowFailException", message
        assert "\n" not in text and len(text) < 200, text
        assert text.startswith(f"extra settings: {name}: not a run's setting; ") and text.endswith(" sets it"), text


# --- KFP -----------------------------------------------------------------------------------------

@functools.cache
def _compiled() -> dict:
    """The committed compiled pipeline, read as a file (test_kfp.py keeps it in step with the pipeline's code):
    without importing kfp and building the pipeline (1-2 CPU-s)."""
    from tests.pipelines.test_kfp import YAML

    return next(yaml.safe_load_all(YAML.read_text()))


def compiled_pipeline() -> dict:
    """The compiled pipeline spec (the YAML's first document), parsed once; a fresh copy for each caller."""
    return copy.deepcopy(_compiled())


def render_args(args: list, inputs: dict) -> list[str]:
    """What KFP's launcher makes of a container's args: placeholders filled, IfPresent items kept only for
    inputs the task has (an optional pipeline input left empty is absent)."""
    def fill(text: str) -> str:
        return re.sub(r"\{\{\$\.inputs\.parameters\['(\w+)'\]\}\}",
                      lambda m: inputs[m[1]] if isinstance(inputs[m[1]], str) else json.dumps(inputs[m[1]]), text)
    out = []
    for a in args:
        if a.startswith('{"IfPresent"'):
            cond = json.loads(a)["IfPresent"]
            if cond["InputName"] in inputs:
                out += [fill(x) for x in cond["Then"]]
        else:
            out.append(fill(a))
    return out


def test_kfp_pipeline_with_only_its_required_inputs_trains_the_make_run_recipe():
    compiled = compiled_pipeline()
    params = compiled["root"]["inputDefinitions"]["parameters"]
    required = {n for n, p in params.items() if not p.get("isOptional") and "defaultValue" not in p}
    assert required == {"dataset_uri", "run_dir"}  # the population is the platform's, compiled in (#34)
    inputs = {"dataset_uri": DATASET, "run_dir": "s3://bucket/runs/x",
              "pipeline_run_id": "job", "parent_run_id": "P",
              **{n: p["defaultValue"] for n, p in params.items() if "defaultValue" in p}}
    assert inputs["config"] == "/opt/dpsynth/configs/dpgan-mnist-cpu.yaml" and inputs["extra"] == []
    for dockerfile in ("stage-cpu", "stage-cuda"):  # the image ships the recipe where the default points
        assert "COPY configs /opt/dpsynth/configs" in (REPO / "images" / f"{dockerfile}.Dockerfile").read_text()
    container = compiled["deploymentSpec"]["executors"]["exec-dpsynth-train"]["container"]
    assert container["command"][:2] == ["python", "-c"]
    program = {"__name__": "dpsynth_run"}
    exec(container["command"][2], program)  # the container's own program, not run as __main__
    argv = program["resolve"](render_args(container["args"], inputs))
    argv = [str(REPO / CONFIG) if a == inputs["config"] else a for a in argv]  # the image's copy of configs/
    got = resolved(argv)
    expected = make_run_settings()
    # KFP stage pods track through MLFLOW_TRACKING_URI (the stage ConfigMap), not a setting
    expected["tracking"]["uri"] = None
    assert got == expected
    # the extra settings: only the recipe's (an allow-list); any other refused, exit 2, one line naming who sets it
    assert "train.steps=5" in program["resolve"](["--extra-settings", json.dumps(["train.steps=5"])])


@pytest.mark.parametrize("item", ["ledger.url=sqlite:////tmp/fresh.db", "tracking.uri=x", "privacy.accounting=paper",
                                  *REFUSED])
def test_kfp_extra_accepts_only_the_recipe_settings(item, capsys):
    """#55 item 5 on KFP: the container program refuses a setting that is not on the allow-list, exit 2 (a verdict,
    not retried), with one line naming it and who sets it."""
    compiled = compiled_pipeline()
    program = {"__name__": "dpsynth_run"}
    exec(compiled["deploymentSpec"]["executors"]["exec-dpsynth-train"]["container"]["command"][2], program)
    with pytest.raises(SystemExit) as exited:
        program["resolve"](["--extra-settings", json.dumps(["train.steps=5", item])])
    assert exited.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    name = item.split("=")[0]
    assert len(lines) == 1 and lines[0].startswith(f"dpsynth: error: extra settings: {name}: not a run's setting; ")
    assert lines[0].endswith(" sets it") and len(lines[0]) < 200


def test_kubernetes_plan_refuses_local_uris_and_empty_config_means_none(airflow_env, tmp_path):
    """#34 item 2: on Kubernetes the plan task fails (no retry) on a local run root or dataset, naming the field;
    DPSYNTH_CONFIG="" (the chart's pipeline.config emptied) means no base config, not the local recipe."""
    kubeconfig = tmp_path / "kubeconfig"
    from tests.airflow_fixtures import KUBECONFIG

    kubeconfig.write_text(KUBECONFIG)
    env = {**airflow_env, "DPSYNTH_EXECUTOR": "kubernetes", "DPSYNTH_K8S_CONFIG_FILE": str(kubeconfig),
           "DPSYNTH_CONFIG": "", "DPSYNTH_RUN_ROOT": "s3://b/runs", "DPSYNTH_DATASET_URI": "s3://b/d.parquet",
           "DPSYNTH_POPULATION_ID": POPULATION}
    out = in_airflow(LOAD + """
    import copy, dpsynth_pipeline
    dag = bag.dags["dpsynth_train"]
    def plan(**values):
        params = copy.deepcopy(dag.params)
        params.update(values)
        try:
            return dpsynth_pipeline.plan.function(params=params.dump(), run_id="r")["argv"]["train"]
        except Exception as exc:
            return [type(exc).__name__, str(exc)]
    print(json.dumps({"config": dag.params["config"], "ok": plan(),
                      "root": plan(run_root="outputs/airflow"), "data": plan(dataset_uri="file:///data/x.parquet")}))
    """, env)
    assert out["config"] is None and "--config" not in out["ok"]
    assert out["root"][0] == "AirflowFailException" and out["root"][1].startswith("run_root (DPSYNTH_RUN_ROOT): 'outputs/airflow' is a local path")
    assert out["data"][0] == "AirflowFailException" and out["data"][1].startswith("dataset_uri (data.uri)")


def test_a_platform_population_cannot_be_changed_by_a_trigger(airflow_env):
    """#34 item 5: with DPSYNTH_POPULATION_ID set (the chart's pipeline.populationId) the form's population is
    that value only: a UI or REST trigger naming another population (another budget) is refused."""
    out = in_airflow(LOAD + """
    import copy
    from airflow.sdk.exceptions import ParamValidationError
    def refused(**values):
        params = copy.deepcopy(bag.dags["dpsynth_train"].params)
        try:
            params.update(values)
            params.validate()
        except ParamValidationError:
            return True
        return False
    print(json.dumps({"same": refused(population_id="mnist"), "other": refused(population_id="fresh-budget"),
                      "default": bag.dags["dpsynth_train"].params["population_id"]}))
    """, {**airflow_env, "DPSYNTH_POPULATION_ID": "mnist"})
    assert out == {"same": False, "other": True, "default": "mnist"}


def test_platform_settings_come_after_the_trigger_and_a_cluster_needs_the_population(airflow_env, tmp_path):
    """#55 item 5: the platform's settings that are not a run's (the chart's stage.config: audit.confidence here),
    the tracking URI and the population are given after the trigger's, so nothing a trigger passes replaces them;
    with the Kubernetes executor a run without the platform's population (pipeline.populationId) is refused."""
    from tests.airflow_fixtures import KUBECONFIG

    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    env = {**airflow_env, "DPSYNTH_EXECUTOR": "kubernetes", "DPSYNTH_K8S_CONFIG_FILE": str(tmp_path / "kubeconfig"),
           "DPSYNTH_RUN_ROOT": "s3://b/runs", "DPSYNTH_DATASET_URI": "s3://b/d.parquet", "DPSYNTH_TRACKING_URI": TRACKING,
           "DPSYNTH_STAGE_CONFIG": json.dumps({"audit": {"confidence": 0.99}, "train": {"lr_g": 0.0001}})}
    code = LOAD + """
    import copy, dpsynth_pipeline
    dag = bag.dags["dpsynth_train"]
    params = copy.deepcopy(dag.params)
    params.update({"epsilon": 4.0})
    try:
        argv = dpsynth_pipeline.plan.function(params=params.dump(), run_id="r")["argv"]["train"]
    except Exception as exc:
        argv = [type(exc).__name__, str(exc)]
    print(json.dumps({"argv": argv, "extra": dag.params["overrides"]}))
    """
    with_population = in_airflow(code, {**env, "DPSYNTH_POPULATION_ID": POPULATION})
    sets = [with_population["argv"][i + 1] for i, a in enumerate(with_population["argv"]) if a == "--set"]
    assert sets == ["data.uri=s3://b/d.parquet", "privacy.epsilon=4.0", "train.lr_g=0.0001", "audit.confidence=0.99",
                    "tracking.enabled=true",
                    f"tracking.uri={TRACKING}", f"ledger.population_id={POPULATION}"]
    assert with_population["extra"] == ["train.lr_g=0.0001"]  # the form shows only the run settings as its default
    without = in_airflow(code, env)["argv"]
    assert without[0] == "AirflowFailException" and without[1].startswith(
        "DPSYNTH_POPULATION_ID (ledger.population_id): not set; on a cluster every run charges the platform's")
