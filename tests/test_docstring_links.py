"""A module docstring that sends the reader to docs/privacy.md names a section that is there."""

from __future__ import annotations

import ast
import re
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
