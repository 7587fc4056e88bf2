"""The one entry point of the benchmarks: run a suite of benchmarks/suites.toml and keep its latest rows.

    .venv/stage/bin/python benchmarks/run.py --list                 # every suite, its rows and what each measures
    .venv/stage/bin/python benchmarks/run.py SUITE --dry-run        # what SUITE would call, row by row
    .venv/stage/bin/python benchmarks/run.py SUITE [ROW-GLOB ...]   # run SUITE (or the rows matching a glob)
        [--arg NAME=VALUE ...] [--jobs N] [--timeout S] [--results DIR] [--out DIR]
    .venv/stage/bin/python benchmarks/run.py --merge OTHER/SUITE.json   # a GPU machine's rows, into benchmarks/results

A suite is data (benchmarks/suites.toml): a function of a module in benchmarks/ (``module:function``), default
arguments, and rows, each a name and the arguments it adds (a row's ``overrides`` list extends the suite's). Running a
row calls the function with them and stores what it returns in ``RESULTS/SUITE.json`` under the row's name, with
the arguments, the commit, the machine and the date: a later run of the row replaces it (its history is git's);
the file's other rows stay. A row that fails is reported and leaves the row's previous result in place.

``--jobs N`` runs the rows side by side, each in its own process (``--timeout`` seconds at most each, 1 CPU thread:
the GPU machine's way, benchmarks/device_runs.sh); the result file is locked while a row writes it. A function
that takes ``out`` gets a scratch folder, ``OUT/SUITE/ROW`` (default outputs/bench).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fcntl
import fnmatch
import importlib
import inspect
import json
import os
import platform
import subprocess
import sys
import time
import tomllib
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SUITES = HERE / "suites.toml"
RESULTS = HERE / "results"


def load_suites(path: Path = SUITES) -> dict[str, dict]:
    """The suites, each with ``about``, ``function`` and its rows' full arguments (suite defaults + row's)."""
    suites = {}
    for name, spec in tomllib.loads(path.read_text()).items():
        defaults = spec.get("args", {})
        rows = {}
        for row, args in spec.get("rows", {}).items():
            args = dict(args)
            function = args.pop("function", spec.get("function"))
            merged = {**defaults, **args}
            if "overrides" in defaults and "overrides" in args:
                merged["overrides"] = [*defaults["overrides"], *args["overrides"]]
            rows[row] = {"function": function, "args": merged}
        suites[name] = {"about": spec.get("about", ""), "function": spec.get("function"), "rows": rows}
    return suites


def resolve(function: str):
    """``module:function`` of benchmarks/ → the function."""
    module, _, name = function.partition(":")
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    return getattr(importlib.import_module(module), name)


def check(suites: dict[str, dict]) -> list[str]:
    """Every row names a function that exists, with arguments it takes (read from the source: nothing is
    imported, so a suite can be checked without torch)."""
    problems = []
    signatures: dict[str, set[str] | None] = {}
    for suite, spec in suites.items():
        for row, r in spec["rows"].items():
            fn = r["function"]
            if fn not in signatures:
                signatures[fn] = _parameters(fn)
            params = signatures[fn]
            if params is None:
                problems.append(f"{suite}/{row}: no function {fn} in benchmarks/")
            elif unknown := sorted(set(r["args"]) - params - {"out"}):
                problems.append(f"{suite}/{row}: {fn} takes no {', '.join(unknown)}")
    return problems


def _parameters(function: str) -> set[str] | None:
    module, _, name = function.partition(":")
    path = HERE / f"{module}.py"
    if not path.is_file():
        return None
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            a = node.args
            return {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
    return None


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + ("+changes" if dirty else "") if out.returncode == 0 else None
    except OSError:
        return None


def _machine() -> str:
    text = f"{platform.machine()}, {os.cpu_count()} CPU cores"
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            text = f"{torch.cuda.get_device_name(0)}, {text}"
    return text


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def store(results: Path, suite: str, about: str, row: str, record: dict) -> Path:
    """Put ``record`` in ``results/suite.json`` under ``row`` (replacing that row's earlier run)."""
    path = results / f"{suite}.json"
    with _locked(path):
        data = json.loads(path.read_text()) if path.exists() else {"suite": suite, "about": about, "rows": {}}
        data["about"] = about or data.get("about", "")
        data["rows"][row] = record
        data["rows"] = dict(sorted(data["rows"].items()))
        path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    path.with_suffix(".lock").unlink(missing_ok=True)
    return path


def run_row(suite: str, spec: dict, row: str, *, results: Path, out: Path) -> bool:
    r = spec["rows"][row]
    fn = resolve(r["function"])
    args = dict(r["args"])
    if "out" in inspect.signature(fn).parameters and "out" not in args:
        args["out"] = str(out / suite / row)
    print(f"== {suite}/{row}: {r['function']}({json.dumps(args)})", flush=True)
    started, measured = time.monotonic(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    try:
        result = fn(**args)
    except Exception:  # noqa: BLE001 - a failed row is reported; the others still run
        print(f"== {suite}/{row} FAILED (its previous result, if any, stays):\n{traceback.format_exc()}", flush=True)
        return False
    record = {"function": r["function"], "args": r["args"], "commit": _commit(), "machine": _machine(),
              "measured": measured, "seconds": round(time.monotonic() - started, 1), "result": result}
    path = store(results, suite, spec["about"], row, record)
    print(f"== {suite}/{row}: done in {record['seconds']} s → {path}", flush=True)
    return True


def _child(suite: str, row: str, a: argparse.Namespace) -> bool:
    """One row in its own process (``--jobs``), one CPU thread, cut at ``--timeout`` seconds."""
    logs = Path(a.out) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, __file__, suite, row, "--results", str(a.results), "--out", str(a.out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with open(logs / f"{suite}-{row}.log", "w") as log:
        try:
            return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                  timeout=a.timeout).returncode == 0
        except subprocess.TimeoutExpired:
            print(f"== {suite}/{row}: stopped after {a.timeout} s", flush=True)
            return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", nargs="?", help="a suite of benchmarks/suites.toml")
    ap.add_argument("rows", nargs="*", metavar="ROW-GLOB", help="only the rows whose names match (default: all)")
    ap.add_argument("--list", action="store_true", help="list the suites (or SUITE's rows) and exit")
    ap.add_argument("--dry-run", action="store_true", help="print each row's call, check it, run nothing")
    ap.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE",
                    help="override an argument of every chosen row (VALUE read as TOML: 5, 1.5, true, \"x\")")
    ap.add_argument("--jobs", type=int, default=0, help="rows side by side, each in its own process")
    ap.add_argument("--timeout", type=float, default=None, help="with --jobs: seconds a row may take")
    ap.add_argument("--results", type=Path, default=RESULTS, help="where SUITE.json is kept (benchmarks/results)")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench", help="scratch folders of the rows")
    ap.add_argument("--merge", type=Path, metavar="FILE",
                    help="store the rows of another machine's SUITE.json (run.py --results) here, each replacing its row")
    ap.add_argument("--call", nargs=2, metavar=("MODULE:FUNCTION", "JSON"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    os.chdir(ROOT)  # a row's relative paths (configs/…, outputs/…) are the repository's
    if a.call:  # a benchmark's own child process (a torchrun rank, a fresh process for a memory measurement)
        result = resolve(a.call[0])(**json.loads(a.call[1]))
        return result if isinstance(result, int) else 0
    if a.merge:
        data = json.loads(a.merge.read_text())
        for row, record in data["rows"].items():
            store(a.results, data["suite"], data.get("about", ""), row, record)
        print(f"== {data['suite']}: {len(data['rows'])} rows from {a.merge} → {a.results / (data['suite'] + '.json')}")
        return 0
    suites = load_suites()
    if a.suite is None or (a.list and a.suite is None):
        for name, spec in suites.items():
            print(f"{name:<28} {len(spec['rows']):>3} rows  {spec['about']}")
        return 0 if a.list else 2
    if a.suite not in suites:
        print(f"run: no suite {a.suite!r} in benchmarks/suites.toml (--list lists them)", file=sys.stderr)
        return 2
    spec = suites[a.suite]
    chosen = [r for r in spec["rows"] if not a.rows or any(fnmatch.fnmatchcase(r, g) for g in a.rows)]
    if not chosen:
        print(f"run: no row of {a.suite} matches {a.rows}", file=sys.stderr)
        return 2
    for item in a.arg:
        key, eq, value = item.partition("=")
        if not eq:
            print(f"run: --arg {item!r}: give NAME=VALUE", file=sys.stderr)
            return 2
        try:  # a TOML value (2000, true, "text", ["a", "b"]); a bare word is the text it spells
            value = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            pass
        for r in chosen:
            spec["rows"][r]["args"][key] = value
    if a.list or a.dry_run:
        for r in chosen:
            row = spec["rows"][r]
            print(f"{r:<28} {row['function']}({', '.join(f'{k}={v!r}' for k, v in row['args'].items())})")
        problems = check({a.suite: {**spec, "rows": {r: spec["rows"][r] for r in chosen}}})
        for p in problems:
            print(f"run: {p}", file=sys.stderr)
        return 1 if problems else 0
    if a.jobs and a.arg:
        print("run: --arg applies in this process only; with --jobs, put it in the suite", file=sys.stderr)
        return 2
    if a.jobs:
        with ThreadPoolExecutor(a.jobs) as pool:
            ok = list(pool.map(lambda r: _child(a.suite, r, a), chosen))
    else:
        ok = [run_row(a.suite, spec, r, results=a.results, out=a.out) for r in chosen]
    print(f"== {a.suite}: {sum(ok)} of {len(ok)} rows done")
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
