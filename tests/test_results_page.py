"""docs/results.md is what benchmarks/report.py builds from benchmarks/results/, and the build checks its figures."""

from __future__ import annotations

import importlib.util
import json
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


def test_a_figure_that_disagrees_with_its_result_file_fails_the_build(tmp_path, monkeypatch, capsys):
    results = tmp_path / "results"
    results.mkdir()
    name = "utility-summary-mnist-cpu.json"
    spec = json.loads((report.RESULTS / name).read_text())
    for row in spec["rows"]:
        for source in row.get("sources", []):
            file = source.partition("#")[0]
            (results / file).write_text((report.RESULTS / file).read_text())
    default = next(r for r in spec["rows"] if r.get("cells", [""])[0].startswith("**default recipe**"))
    default["cells"][2] = "**0.952**"  # the file says 0.9532...
    (results / name).write_text(json.dumps(spec))
    monkeypatch.setattr(report, "RESULTS", results)
    with pytest.raises(ValueError, match="cnn_gen2real"):
        report.summary_table(name)


@pytest.mark.parametrize("value, cell, shown", [
    (0.9532, "**0.953**", True), (0.9532, "0.95", True), (0.9532, "0.952", False),
    (0.75, "0.741–0.776", True), (0.8, "0.741–0.776", False), (9999.6, "10,000", True),
    (9.9047, "9.91", False), (25.112, "25 / 252", True),
])
def test_shows(value, cell, shown):
    assert report.shows(value, cell) is shown


def test_every_result_file_on_the_page_exists_and_every_generality_file_is_shown():
    page = (REPO / "docs" / "results.md").read_text()
    for path in sorted(report.RESULTS.glob("generality-*.json")):
        assert f"({report.LINK}{path.name})" in page, path.name


def test_a_result_file_named_after_an_episode_fails_the_build(tmp_path, monkeypatch):
    (tmp_path / "utility-default-mnist-cpu.json").write_text("[]")
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    assert "| utility | default-mnist | CPU |" in report.files_table()
    (tmp_path / "utility-default-rerun.json").write_text("[]")
    with pytest.raises(ValueError, match="utility-default-rerun.json: no device at the end of its name"):
        report.files_table()
    (tmp_path / "utility-default-rerun.json").unlink()
    (tmp_path / "default-after-gpu-fix.json").write_text("[]")
    with pytest.raises(ValueError, match="default-after-gpu-fix.json: not named <measure>-<subject>-<device>"):
        report.files_table()
