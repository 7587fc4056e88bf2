"""A module docstring that sends the reader to docs/privacy.md names a section that is there."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
POINTER = re.compile(r'docs/privacy\.md,\s+"([^"]+)"')


def pointers() -> list[tuple[str, str]]:
    found = []
    for path in sorted((REPO / "components").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
        found += [(path.relative_to(REPO).as_posix(), title) for title in POINTER.findall(re.sub(r"\s+", " ", doc))]
    return found


def test_every_pointer_names_a_heading_of_docs_privacy():
    headings = set(re.findall(r"^#+\s+(.*?)\s*$", (REPO / "docs" / "privacy.md").read_text(), re.M))
    found = pointers()
    assert len(found) >= 9, found  # the modules whose arguments moved there (#35)
    assert not [(module, title) for module, title in found if title not in headings]


DOC_FILE = re.compile(r"\bdocs/[\w./-]+\.md\b")


def missing_docs(roots=("components", "mlflow_plugins", "pipelines", "scripts", "benchmarks")) -> list[str]:
    """Every ``docs/….md`` that the Python sources name (in docstrings, help texts, messages) and that is not there."""
    return [f"{path.relative_to(REPO).as_posix()}: {name}"
            for root in roots for path in sorted((REPO / root).rglob("*.py"))
            for name in sorted(set(DOC_FILE.findall(path.read_text()))) if not (REPO / name).is_file()]


def test_every_docs_file_the_code_names_exists():
    assert not missing_docs()


def test_a_docs_file_that_is_not_there_is_found(tmp_path, monkeypatch):
    (tmp_path / "components").mkdir()
    (tmp_path / "components" / "m.py").write_text('"""See docs/privacy.md and docs/data_parallel.md."""\n')
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "privacy.md").write_text("# Privacy\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert missing_docs(("components",)) == ["components/m.py: docs/data_parallel.md"]
