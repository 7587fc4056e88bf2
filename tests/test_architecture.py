"""The package's import map has no circles: between its rooms (the top-level modules and packages of
``components/dpsynth``) the imports point one way, down, and no module imports another that imports it back.

Every import counts, also one inside a function (a lazy import is still a dependency). The rooms in the order
they may import each other are in docs/architecture.md ("The house"), checked here too.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "components" / "dpsynth"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(("dpsynth", *path.relative_to(PACKAGE).with_suffix("").parts))
        found[name.removesuffix(".__init__")] = path
    return found


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module → the package modules it imports (anywhere in its body)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
    return edges


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def cycles(nodes, edges) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def room_edges(edges) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for a, bs in edges.items():
        for b in bs:
            if room(a) != room(b):
                out[room(a)].add(room(b))
    return out


def documented_floors() -> list[list[str]]:
    """The floors of docs/architecture.md's house, bottom first: each a list of rooms."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## The house", 1)[1].split("\n## ", 1)[0]
    floors = []
    for line in section.splitlines():
        m = re.match(r"^\| (\d+) \| ([^|]+) \|", line)
        if m:
            floors.append((int(m.group(1)), re.findall(r"`([\w]+)/?`", m.group(2))))
    return [rooms for _, rooms in sorted(floors)]


def test_no_module_imports_one_that_imports_it_back():
    mods = modules()
    assert cycles(mods, imports(mods)) == []


def test_rooms_import_downward_only():
    mods = modules()
    assert cycles({room(m) for m in mods}, room_edges(imports(mods))) == []


def test_the_documented_floors_hold():
    """Every room is on one floor of docs/architecture.md, and imports only rooms on lower floors."""
    mods = modules()
    floors = documented_floors()
    floor_of = {r: i for i, rooms in enumerate(floors) for r in rooms}
    rooms = {room(m) for m in mods} - {"__main__", "dpsynth"}
    assert sorted(rooms - set(floor_of)) == [], "rooms missing from docs/architecture.md's house"
    up = [f"{a} (floor {floor_of[a]}) -> {b} (floor {floor_of[b]})"
          for a, bs in room_edges(imports(mods)).items() for b in bs
          if a in floor_of and b in floor_of and floor_of[b] >= floor_of[a]]
    assert up == [], "imports that do not go down a floor"


# what stages/ may hold besides the six stages: the protocol they all run through and its manifests
STAGE_PLUMBING = {"__init__", "protocol", "manifest"}


def test_the_six_stages_are_in_stages_and_nothing_else_is():
    """Each of the six stages (``protocol.STAGES``) is a module of stages/ named after it that declares it (``STAGE``),
    and stages/ holds nothing else but their plumbing (#53 item 2: the audit stage once lived in audit/, and the
    ledger's charging in stages/)."""
    folder = PACKAGE / "stages"
    names = {p.stem for p in folder.glob("*.py")}
    protocol = ast.parse((folder / "protocol.py").read_text(encoding="utf-8"))
    stages = next(ast.literal_eval(n.value) for n in protocol.body if isinstance(n, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "STAGES" for t in n.targets))
    assert sorted(stages) == sorted(("partition", "pretrain", "train", "audit", "sample", "evaluate"))
    declared = {}
    for name in names & set(stages):
        tree = ast.parse((folder / f"{name}.py").read_text(encoding="utf-8"))
        declared[name] = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                               and any(isinstance(t, ast.Name) and t.id == "STAGE" for t in n.targets)), None)
    assert declared == {s: s for s in stages}, "a stage that is not stages/<stage>.py declaring STAGE"
    assert sorted(names - set(stages) - STAGE_PLUMBING) == [], "modules in stages/ that are not stages"
