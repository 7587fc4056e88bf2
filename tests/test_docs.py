"""Every relative link in the repository's Markdown resolves inside a fresh clone.

A link ``[text](path#anchor)`` must name an existing file (relative to the Markdown file) inside
the repository, and an anchor into a Markdown file must name one of its headings.
"""

from __future__ import annotations

import functools
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


# --- Cited code: a code span that names a file of the repository, a class's member or a module's function must name
# one that exists (a renamed method or a moved file otherwise lives on in the docs).
CODE_ROOTS = ("components", "mlflow_plugins", "benchmarks", "pipelines", "scripts", "tests")
REPO_DIRS = ("components/", "docs/", "benchmarks/", "configs/", "tests/", "pipelines/", "scripts/", "charts/",
             "images/", "data/", "requirements/", "mlflow_plugins/")
FILE_SPAN = re.compile(r"^(?:\.\./)*((?:%s)[\w./-]*\.(?:py|md|sh|yaml|yml|json|toml|in|txt|lock|cfg))$"
                       % "|".join(re.escape(d.rstrip("/")) + "/" for d in REPO_DIRS))
RUN_SPAN = re.compile(r"^(?:\.venv/stage/bin/python )?benchmarks/run\.py ([a-z][\w-]*)")  # a benchmark suite
MEMBER_SPAN = re.compile(r"^([A-Za-z_]\w*)\.([A-Za-z_]\w*)(?:\(.*\))?$")  # Name.attr, Name.attr(…)
NOT_MODULES = {"dpsynth", "stage", "pipeline"}  # dpsynth.* MLflow tags; stage.*, pipeline.* Helm values
EXTENSIONS = {"py", "md", "sh", "yaml", "yml", "json", "jsonl", "toml", "txt", "in", "lock", "png", "pt", "db", "parquet"}


@functools.cache
def code_index(roots=CODE_ROOTS) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """The repository's classes (name → the names defined in any class of that name, and in its bases defined in
    the repository) and the package's modules (file stem → every word of its source: its names, and the names it
    gives things in strings, such as a trace's component names). Built on first use, not at collection (parsing the
    repository costs about 1.6 CPU-s, which every pytest-xdist worker would pay)."""
    import ast

    classes: dict[str, set[str]] = {}
    bases: dict[str, set[str]] = {}
    modules: dict[str, set[str]] = {}
    for root in roots:
        for path in sorted((REPO / root).rglob("*.py")):
            try:
                tree = ast.parse(path.read_text())
            except SyntaxError:
                continue
            if root == "components" and path.name != "__init__.py":  # a module's words: its names, its strings
                modules.setdefault(path.stem, set()).update(re.findall(r"\w+", path.read_text()))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    members = classes.setdefault(node.name, set())
                    bases.setdefault(node.name, set()).update(
                        b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                        if isinstance(b, (ast.Name, ast.Attribute)))
                    for item in ast.walk(node):
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                            members.add(item.name)
                        elif isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name) \
                                and item.value.id in ("self", "cls"):
                            members.add(item.attr)
                        elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                            for t in item.targets if isinstance(item, ast.Assign) else [item.target]:
                                members |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    for name in list(classes):  # inherited members, through the bases defined here
        seen, todo = set(), list(bases.get(name, ()))
        while todo:
            base = todo.pop()
            if base in classes and base not in seen:
                seen.add(base)
                classes[name] |= classes[base]
                todo += bases.get(base, ())
    return classes, modules


def cited_code(text: str, classes: dict[str, set[str]], modules: dict[str, set[str]]) -> list[str]:
    """The code spans of ``text`` that cite what does not exist: a repository path that is not there, a member
    of a repository class that it lacks, a function of a repository module that it lacks."""
    bad = []
    for span in {s.strip("`").strip() for s in INLINE_CODE.findall(FENCE.sub("", text))}:
        if (m := RUN_SPAN.match(span)) and m.group(1) not in suites():
            bad.append(f"`{span}`: no suite {m.group(1)} in benchmarks/suites.toml")
        elif m := FILE_SPAN.match(span):
            if not any(ch in m.group(1) for ch in "*<{") and not (REPO / m.group(1)).exists():
                bad.append(f"`{span}`: no such file")
        elif m := MEMBER_SPAN.match(span):
            owner, attr = m.groups()
            if attr in EXTENSIONS:
                continue
            if owner in classes and owner[0].isupper() and attr not in classes[owner]:
                bad.append(f"`{span}`: {owner} has no {attr}")
            elif owner in modules and owner not in NOT_MODULES and attr not in modules[owner] \
                    and attr not in config_keys().get(owner, ()):
                bad.append(f"`{span}`: module {owner} has no {attr}")
    return sorted(bad)


@functools.cache
def config_keys() -> dict[str, set[str]]:
    """The configuration's sections and their keys (`train.steps` is a setting, not a function of a module)."""
    import dataclasses
    import typing

    from dpsynth.config import RunConfig

    hints = typing.get_type_hints(RunConfig)
    return {f.name: {g.name for g in dataclasses.fields(hints[f.name])} for f in dataclasses.fields(RunConfig)
            if dataclasses.is_dataclass(hints[f.name])}


@functools.cache
def suites() -> set[str]:
    """The benchmark suites' names (benchmarks/suites.toml)."""
    import tomllib

    return set(tomllib.loads((REPO / "benchmarks" / "suites.toml").read_text()))


@pytest.mark.parametrize("markdown", FILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_cited_files_and_functions_exist(markdown: Path):
    bad = cited_code(markdown.read_text(), *code_index())
    assert not bad, "\n".join(bad)


def test_a_cited_function_or_file_that_does_not_exist_fails():
    page = ("The step is `DPGANTrainer.discriminator_step`; the critic's `ZhangTrainer.critic_step`; see "
            "`docs/data_parallel.md` and `loop.no_such_function`. Fine: `DPGANTrainer.train_step`, `docs/privacy.md`, "
            "`torch.Tensor.add_`, `configs/<name>.yaml`, `x.y`, `benchmarks/run.py speed`, `benchmarks/run.py jobs`.")
    assert cited_code(page, *code_index()) == [
        "`DPGANTrainer.discriminator_step`: DPGANTrainer has no discriminator_step",
        "`ZhangTrainer.critic_step`: ZhangTrainer has no critic_step",
        "`benchmarks/run.py jobs`: no suite jobs in benchmarks/suites.toml",
        "`docs/data_parallel.md`: no such file",
        "`loop.no_such_function`: module loop has no no_such_function",
    ]
