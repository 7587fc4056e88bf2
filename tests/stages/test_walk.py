"""The walk from the command line to a discriminator step that docs/architecture.md lists is the real one, and
at most six calls long (issue #35's goal).

A tiny ``dpsynth train --run-dir`` runs in-process; at the sanitizer's first noisy release the test records the
frames of the ``dpsynth`` package on the stack below ``cli.py:main`` (as the doc counts them) and compares them
with the doc's numbered list.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

import dpsynth
from dpsynth.mechanisms.dpsgd import GradientSanitizer
from tests.stages.helpers import stage, stages

PACKAGE = Path(dpsynth.__file__).resolve().parent
DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
SECTION = "### From the command line to a discriminator step"
ENTRY = ("cli.py", "main")
MOST = 6
STEPS = ("train.steps=2",)


def documented_walk() -> list[tuple[str, str]]:
    """The section's numbered list: ``N. `file:function```, in order."""
    text = DOC.read_text()
    assert SECTION in text, f"docs/architecture.md: no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n#", 1)[0]
    items = re.findall(r"^(\d+)\. `([\w/]+\.py):([\w.]+)`", section, re.M)
    assert [int(n) for n, _, _ in items] == list(range(1, len(items) + 1)), items
    return [(path, function) for _, path, function in items]


def calls_below_entry(frame) -> list[tuple[str, str]]:
    """(file under components/dpsynth, qualified name) of each dpsynth frame from ``frame`` up to, not including,
    ``cli.py:main``, outermost first; frames of other packages and the standard library are skipped."""
    found = []
    while frame is not None:
        path = Path(frame.f_code.co_filename).resolve()
        if PACKAGE in path.parents:
            found.append((path.relative_to(PACKAGE).as_posix(), frame.f_code.co_qualname))
        frame = frame.f_back
    found.reverse()
    assert ENTRY in found, f"no {ENTRY} on the stack: {found}"
    return found[found.index(ENTRY) + 1:]


def test_the_walk_from_dpsynth_train_to_the_noisy_release_is_the_documented_one(tmp_path, source, monkeypatch):
    run = tmp_path / "run"
    stages(run, source, "partition", "pretrain", overrides=STEPS)
    release = GradientSanitizer.finalize
    walks = []

    def finalize(self, *args, **kwargs):  # the sanitizer's own release, with the stack of its caller recorded
        if not walks:
            code = inspect.unwrap(release).__code__  # under its decorator (torch.no_grad)
            own = (Path(code.co_filename).resolve().relative_to(PACKAGE).as_posix(), code.co_qualname)
            walks.append(calls_below_entry(sys._getframe(1)) + [own])
        return release(self, *args, **kwargs)

    monkeypatch.setattr(GradientSanitizer, "finalize", finalize)
    assert stage("train", run, source, *STEPS) == 0
    (walk,) = walks
    assert len(walk) <= MOST, f"{len(walk)} calls from cli.py:main to the noisy release: {walk}"
    assert walk == documented_walk(), "docs/architecture.md lists another walk than the one the code takes"
