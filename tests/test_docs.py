"""Every relative link in the repository's Markdown resolves inside a fresh clone.

A link ``[text](path#anchor)`` must name an existing file (relative to the Markdown file) inside
the repository, and an anchor into a Markdown file must name one of its headings.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SKIP_DIRS = {"outputs", "node_modules", "__pycache__"}  # and every hidden directory (.venv, .git, …)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def markdown_files() -> list[Path]:
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS)
        found += [Path(root) / f for f in sorted(files) if f.endswith(".md")]
    return found


def links(text: str) -> list[str]:
    """Relative link targets, and code spans that are relative paths out of the file's folder (`../x`)."""
    text = FENCE.sub("", text)
    spans = [s.strip("`") for s in INLINE_CODE.findall(text)]
    text = INLINE_CODE.sub("", text)
    return ([t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # not http:, mailto:, …
            + [s for s in spans if s.startswith("../") and " " not in s])


def anchors(markdown: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+\s+(.*?)\s*$", FENCE.sub("", markdown.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


FILES = markdown_files()


def test_the_docs_are_found():
    names = {p.relative_to(REPO).as_posix() for p in FILES}
    assert {"README.md", "docs/architecture.md", "docs/privacy.md", "docs/operations.md",
            "pipelines/README.md"} <= names


@pytest.mark.parametrize("markdown", FILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(markdown: Path):
    broken = []
    for target in links(markdown.read_text()):
        path, _, anchor = target.partition("#")
        resolved = (markdown.parent / path).resolve() if path else markdown
        if REPO not in (resolved, *resolved.parents):
            broken.append(f"{target}: outside the repository")
        elif not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.relative_to(REPO)}")
    assert not broken, broken


def test_links_are_found():
    assert links("[a](docs/x.md) ![b](img.png \"t\") [c](https://x.org) `[d](e.md)` [f](#g) `../y/z.md`") == \
        ["docs/x.md", "img.png", "#g", "../y/z.md"]
