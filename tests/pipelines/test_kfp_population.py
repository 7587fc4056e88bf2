"""#34: the KFP pipeline's population (ledger.population_id) is the platform's, like the ledger URL and the tracking
URI: compiled in (DPSYNTH_POPULATION_ID), no run input, so whoever triggers a run cannot charge it to another
budget — not by an input, not by the extra settings, not by choosing another config file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.pipelines.test_entry_points import REPO, render_args, resolved
from tests.pipelines.test_kfp import KFP, load_run_local

ENV = {k: v for k, v in os.environ.items() if k != "DPSYNTH_POPULATION_ID"}


def compile_to(path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(KFP / "dpsynth_pipeline.py"), "--compile", str(path)],
                          capture_output=True, text=True, env={**ENV, **env}, timeout=300)


def test_compiling_needs_the_platforms_population(tmp_path):
    done = compile_to(tmp_path / "p.yaml")
    assert done.returncode == 2 and "DPSYNTH_POPULATION_ID: required when compiling" in done.stderr
    assert not (tmp_path / "p.yaml").exists()


def test_a_run_cannot_choose_the_population(tmp_path):
    assert compile_to(tmp_path / "p.yaml", DPSYNTH_POPULATION_ID="cohort-a").returncode == 0
    compiled = next(yaml.safe_load_all((tmp_path / "p.yaml").read_text()))
    assert "population_id" not in compiled["root"]["inputDefinitions"]["parameters"]  # no run input to set
    with pytest.raises(TypeError):  # nor a keyword of the pipeline function
        load_run_local().kp.dpsynth_pipeline.pipeline_func(dataset_uri="s3://b/d.parquet", run_dir="s3://b/r",
                                                           population_id="fresh")
    container = compiled["deploymentSpec"]["executors"]["exec-dpsynth-train"]["container"]
    program = {"__name__": "dpsynth_run"}
    exec(container["command"][2], program)
    inputs = {"dataset_uri": "s3://b/d.parquet", "run_dir": "s3://b/r", "pipeline_run_id": "job", "parent_run_id": "P",
              "config": str(REPO / "configs" / "dpgan-mnist-gpu.yaml"), "extra": []}  # its own population: mnist-train
    argv = program["resolve"](render_args(container["args"], inputs))
    assert resolved(argv)["ledger"]["population_id"] == "cohort-a"  # the compiled one wins over the config file's
    with pytest.raises(SystemExit) as refused:  # exit 2: "extra settings: ledger.population_id: not a run's setting"
        program["resolve"](render_args(container["args"], {**inputs, "extra": ["ledger.population_id=fresh"]}))
    assert refused.value.code == 2
    for executor in compiled["deploymentSpec"]["executors"].values():
        args = json.dumps(executor.get("container", {}).get("args", []))
        assert "inputs.parameters['population_id']" not in args
