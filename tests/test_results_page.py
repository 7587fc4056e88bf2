"""docs/results.md is what benchmarks/report.py builds from benchmarks/results/, and the build checks its figures."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _report():
    spec = importlib.util.spec_from_file_location("report", REPO / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report = _report()


def test_the_committed_page_is_the_generated_one():
    assert (REPO / "docs" / "results.md").read_text() == report.render(), \
        "docs/results.md differs from what benchmarks/report.py builds: run `make results`"


def test_check_mode_fails_on_a_stale_page(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "results.md"
    stale.write_text(report.render().replace("0.953", "0.954", 1))
    monkeypatch.setattr(report, "PAGE", stale)
    assert report.main(["--check"]) == 1
    assert "make results" in capsys.readouterr().err


def test_a_figure_that_disagrees_with_its_result_file_fails_the_build(tmp_path, monkeypatch):
    name = "utility-summary-mnist-cpu.json"
    spec = json.loads((report.TABLES / name).read_text())
    default = next(r for r in spec["rows"] if r.get("cells", [""])[0].startswith("**default recipe**"))
    assert default["sources"] == ["utility.json:contrast-layer-mnist-cpu#2"]
    default["cells"][2] = "**0.952**"  # the result says 0.9532...
    (tmp_path / name).write_text(json.dumps(spec))
    monkeypatch.setattr(report, "TABLES", tmp_path)
    with pytest.raises(ValueError, match="cnn_gen2real"):
        report.summary_table(name)


@pytest.mark.parametrize("value, cell, shown", [
    (0.9532, "**0.953**", True), (0.9532, "0.95", True), (0.9532, "0.952", False),
    (0.75, "0.741–0.776", True), (0.8, "0.741–0.776", False), (9999.6, "10,000", True),
    (9.9047, "9.91", False), (25.112, "25 / 252", True),
])
def test_shows(value, cell, shown):
    assert report.shows(value, cell) is shown


def test_every_generality_run_is_on_the_page_with_its_file_and_row():
    page = (REPO / "docs" / "results.md").read_text()
    for suite in report.GENERALITY_SUITES:
        rows = json.loads((report.RESULTS / f"{suite}.json").read_text())["rows"]
        for row in rows:
            assert report._cite(f"{suite}.json:{row}") in page, (suite, row)


def test_every_result_file_is_a_suites_and_the_page_lists_it(tmp_path, monkeypatch):
    page = (REPO / "docs" / "results.md").read_text()
    for path in report.RESULTS.iterdir():
        assert f"({report.LINK}{path.name})" in page, path.name
    (tmp_path / "speed.json").write_text(json.dumps({"suite": "speed", "rows": {}}))
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    assert "| speed |" in report.files_table()
    (tmp_path / "speed-after-gpu-fix.json").write_text("{}")  # an episode's file, not a suite's
    with pytest.raises(ValueError, match="speed-after-gpu-fix.json: not the result file of a suite"):
        report.files_table()
