"""The benchmark harness (benchmarks/run.py): every suite of benchmarks/suites.toml calls a function that exists with
arguments it takes, and a result file keeps the latest run of each row (the other rows, and a row whose new run
failed, stay as they were)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_run", REPO / "benchmarks" / "run.py")
run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run)


def test_every_suite_calls_a_function_that_takes_its_rows_arguments():
    suites = run.load_suites()
    assert {"speed", "utility", "generality", "scaling", "empirical-audit"} <= set(suites)
    assert run.check(suites) == []


def test_every_result_file_is_a_suites():
    suites = run.load_suites()
    for path in (REPO / "benchmarks" / "results").iterdir():
        assert path.suffix == ".json" and path.stem in suites, path.name
        assert json.loads(path.read_text())["suite"] == path.stem


def test_a_row_that_names_a_missing_function_or_argument_is_found(tmp_path):
    (tmp_path / "suites.toml").write_text(
        '[s]\nfunction = "dp_discriminator_step:measure"\nargs = { overrides = ["a=1"] }\n[s.rows]\n'
        'ok = { width = 8 }\nbad-arg = { widht = 8 }\nbad-function = { function = "dp_discriminator_step:nope" }\n')
    suites = run.load_suites(tmp_path / "suites.toml")
    assert run.check(suites) == [
        "s/ok: dp_discriminator_step:measure takes no overrides",
        "s/bad-arg: dp_discriminator_step:measure takes no overrides, widht",
        "s/bad-function: no function dp_discriminator_step:nope in benchmarks/",
    ]


def test_a_rows_overrides_extend_the_suites(tmp_path):
    (tmp_path / "suites.toml").write_text(
        '[s]\nfunction = "utility:generality"\nargs = { dataset = "greek", overrides = ["audit.empirical=off"] }\n'
        '[s.rows]\nplain = {}\nkey = { overrides = ["partition.key=confirm-a"], dataset = "mnist" }\n')
    rows = run.load_suites(tmp_path / "suites.toml")["s"]["rows"]
    assert rows["plain"]["args"] == {"dataset": "greek", "overrides": ["audit.empirical=off"]}
    assert rows["key"]["args"] == {"dataset": "mnist", "overrides": ["audit.empirical=off", "partition.key=confirm-a"]}


@pytest.fixture
def bench_module(tmp_path, monkeypatch):
    """A benchmark module of one function that returns its argument, or raises on a negative one."""
    (tmp_path / "tiny_bench.py").write_text(
        "def measure(*, x: int) -> dict:\n"
        "    if x < 0:\n        raise ValueError('negative')\n"
        "    return {'x': x}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("tiny_bench", None)


def test_a_result_file_keeps_the_latest_run_of_each_row(tmp_path, bench_module, capsys, monkeypatch):
    monkeypatch.setattr(run, "_machine", lambda: "test machine")  # (the real one asks torch for a GPU)
    spec = {"about": "tiny", "rows": {"a": {"function": "tiny_bench:measure", "args": {"x": 1}},
                                      "b": {"function": "tiny_bench:measure", "args": {"x": 2}}}}
    results = tmp_path / "results"
    assert run.run_row("tiny", spec, "a", results=results, out=tmp_path)
    assert run.run_row("tiny", spec, "b", results=results, out=tmp_path)
    spec["rows"]["a"]["args"] = {"x": 3}
    assert run.run_row("tiny", spec, "a", results=results, out=tmp_path)  # a again: replaces a, keeps b
    data = json.loads((results / "tiny.json").read_text())
    assert {r: v["result"] for r, v in data["rows"].items()} == {"a": {"x": 3}, "b": {"x": 2}}
    assert data["rows"]["a"]["args"] == {"x": 3} and data["rows"]["a"]["function"] == "tiny_bench:measure"
    assert {"commit", "machine", "measured", "seconds"} <= set(data["rows"]["a"])

    spec["rows"]["b"]["args"] = {"x": -1}  # a failed run of b leaves b's last result
    assert not run.run_row("tiny", spec, "b", results=results, out=tmp_path)
    assert json.loads((results / "tiny.json").read_text())["rows"]["b"]["result"] == {"x": 2}
    assert "tiny/b FAILED" in capsys.readouterr().out


def test_the_command_line_lists_dry_runs_and_refuses_an_unknown_suite(capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # run.main works from the repository root; the test's directory comes back after
    assert run.main(["--list"]) == 0
    assert "speed" in capsys.readouterr().out
    assert run.main(["speed", "smoke-cpu", "--dry-run"]) == 0
    assert "dp_discriminator_step:measure(" in capsys.readouterr().out
    assert run.main(["no-such-suite"]) == 2
    assert "no suite 'no-such-suite'" in capsys.readouterr().err
    assert run.main(["speed", "no-such-row"]) == 2
    capsys.readouterr()
    # --arg takes a TOML value or a bare word (the text it spells); no "=": refused in one line, not a traceback
    assert run.main(["generality", "greek", "--arg", "rows=default", "--arg", "epsilons=\"10\"", "--dry-run"]) == 0
    assert "rows='default', epsilons='10'" in capsys.readouterr().out
    assert run.main(["generality", "greek", "--arg", "rows", "--dry-run"]) == 2
    assert "--arg 'rows': give NAME=VALUE" in capsys.readouterr().err


def test_another_machines_rows_merge_into_the_suites_file(tmp_path):
    run.store(tmp_path / "here", "tiny", "tiny", "a", {"result": 1})
    run.store(tmp_path / "here", "tiny", "tiny", "b", {"result": 2})
    run.store(tmp_path / "gpu", "tiny", "tiny", "b", {"result": 3})
    assert run.main(["--merge", str(tmp_path / "gpu" / "tiny.json"), "--results", str(tmp_path / "here")]) == 0
    rows = json.loads((tmp_path / "here" / "tiny.json").read_text())["rows"]
    assert {r: v["result"] for r, v in rows.items()} == {"a": 1, "b": 3}


def test_every_suites_module_imports_and_has_its_function(monkeypatch):
    """A renamed or moved package name that a benchmark imports fails here, not in a long run."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    functions = {row["function"] for spec in run.load_suites().values() for row in spec["rows"].values()}
    for function in sorted(functions):
        assert callable(run.resolve(function)), function
