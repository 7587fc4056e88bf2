"""The top-level ``dpsynth`` command: a cheap ``--help``, ``--version``, ``-v/-q``, ``config show``."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml

from dpsynth import __version__, cli
from dpsynth.config import TrainConfig, load_config
from dpsynth.runner.train_cli import METHODS

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "opacus", "mlflow", "pyarrow", "numpy", "sqlalchemy")

# Run `python -m dpsynth ARGV` in a fresh interpreter, then report which heavy modules it imported.
PROBE = """
import json, runpy, sys
sys.argv = ["dpsynth", *json.loads(sys.argv[1])]
try:
    runpy.run_module("dpsynth", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "heavy": sorted(m for m in %r if m in sys.modules)}))
""" % (HEAVY,)


def fresh(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "components"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["privacy", "epsilon", "--help"],
                                  ["data", "import", "--help"], ["ledger", "show", "--help"],
                                  ["pipeline", "run", "--help"], ["config", "show", "--help"], ["--version"]])
def test_help_imports_no_heavy_module(argv):
    proc = fresh(argv)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"code": 0, "heavy": []}, proc.stdout


def test_the_stage_runner_imports_neither_opacus_nor_scipy_stats():
    """Every stage process imports the stage runner (with it the method registry and the audit's statistics); a
    stage that computes no ε (partition, sample, evaluate, a pipeline's start and finish) spends no time importing
    Opacus's package (its optimizers, torch.distributed.tensor: 3 s) or scipy.stats (1.4 s): they are imported
    where they are used."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "components"), os.environ.get("PYTHONPATH", "")])}
    code = ("import json, sys\nimport dpsynth.runner.run\n"
            "print(json.dumps(sorted(m for m in ('opacus', 'scipy.stats') if m in sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_help_lists_every_method_one_line_each(capsys):
    assert sorted(METHODS) == sorted(typing.get_args(typing.get_type_hints(TrainConfig)["method"]))
    for argv in (["--help"], ["train", "--help"]):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        out = capsys.readouterr().out
        assert exit_info.value.code == 0
        lines = out.splitlines()
        for method, text in METHODS.items():
            assert sum(line.split()[:1] == [method] and text in line for line in lines) == 1, (method, out)
    top = cli.build_parser().format_help()
    assert "DPGAN of 'Private GANs" not in top


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"dpsynth {__version__}"


def test_config_show_prints_the_resolved_configuration(tmp_path, capsys):
    f = tmp_path / "c.yaml"
    f.write_text("privacy:\n  epsilon: 2\n")
    assert cli.main(["config", "show", "--config", str(f), "--set", "train.steps=7",
                     "--set", "partition.key=secret-key"]) == 0
    out = capsys.readouterr().out
    shown = yaml.safe_load(out)
    assert shown["privacy"]["epsilon"] == 2.0 and shown["train"]["steps"] == 7 and shown["train"]["method"] == "dpgan"
    assert "secret-key" not in out and shown["partition"]["key"].startswith("redacted:sha256:")
    shown["partition"].pop("key")
    expected = load_config(f, overrides=["train.steps=7"]).to_dict()
    expected["partition"].pop("key")
    assert shown == expected
    assert cli.main(["config", "show", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["privacy"]["delta"] == 1e-5


@pytest.mark.parametrize("argv,field", [
    (["config", "show", "--set", "train.stepz=3"], "train.stepz"),
    (["config", "show", "--set", "privacy.delta=2"], "privacy.delta"),
    (["train", "--set", "train.method=gswgan"], "train.method"),
])
def test_bad_input_names_the_field_and_exits_2(argv, field, capsys):
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(f"dpsynth: error: {field}: ")


def test_verbosity_sets_the_dpsynth_logger(monkeypatch, capsys):
    monkeypatch.setenv("TQDM_DISABLE", "")  # restored after the test, whatever -q sets
    logger = logging.getLogger("dpsynth")
    for flags, level in ((["-v"], logging.DEBUG), (["-q"], logging.WARNING), (["-qq"], logging.ERROR),
                         ([], logging.INFO)):
        assert cli.main([*flags, "config", "show"]) == 0
        assert logger.level == level
    assert os.environ["TQDM_DISABLE"] == "1"  # -q hides the training progress bars too
    logger.info("to stderr, never stdout")
    captured = capsys.readouterr()
    assert "to stderr" in captured.err and "to stderr" not in captured.out


def test_under_torchrun_only_train_runs(monkeypatch, tmp_path, capsys):
    """A pipeline run (or any command but train) started by torchrun would run once per rank: refused, nothing
    written; train itself goes on to its own checks (here: an unknown method, named)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    run_dir = tmp_path / "run"
    assert cli.main(["pipeline", "run", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpsynth: error: pipeline: runs in one process") and "WORLD_SIZE=2" in err
    assert not run_dir.exists()
    assert cli.main(["train", "--set", "train.method=nosuch"]) == 2
    assert capsys.readouterr().err.startswith("dpsynth: error: train.method")
    monkeypatch.delenv("RANK")  # half a torchrun environment: refused naming what is missing, before any rendezvous
    assert cli.main(["train", "--set", "train.method=gswgan_federated"]) == 2
    assert capsys.readouterr().err.startswith("dpsynth: error: RANK: WORLD_SIZE=2 is set but RANK is not")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert cli.main(["config", "show"]) == 0
