"""The stage images' production lock (issue #34): requirements/stage-prod.lock is stage.lock without pytest, moto,
autodp and what only they need, is in sync with stage.lock (scripts/prod_lock.py --check), and is enough: every
dpsynth and MLflow-plugin module imports, and the data import and partition stage run, with every left-out
distribution's modules made unimportable."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCKS = REPO / "requirements"


def names(lock: Path) -> set[str]:
    from packaging.utils import canonicalize_name

    return {canonicalize_name(ln.split("==")[0].split("[")[0]) for ln in lock.read_text().splitlines()
            if ln and not ln.startswith("#")}


def test_the_production_lock_is_in_sync_and_has_no_test_packages():
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "prod_lock.py"), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    prod, dev = names(LOCKS / "stage-prod.lock"), names(LOCKS / "stage.lock")
    assert prod < dev and not prod & {"pytest", "moto", "autodp", "pluggy", "iniconfig", "responses"}
    assert {"torch", "opacus", "mlflow", "kfp", "boto3", "psycopg2-binary", "pydantic", "jinja2"} <= prod
    for dockerfile in ("stage-cpu.Dockerfile", "stage-cuda.Dockerfile"):
        assert "COPY requirements/stage-prod.lock" in (REPO / "images" / dockerfile).read_text(), dockerfile


def test_the_runtime_needs_nothing_the_production_lock_leaves_out(tmp_path):
    from importlib import metadata

    from packaging.utils import canonicalize_name

    left_out = names(LOCKS / "stage.lock") - names(LOCKS / "stage-prod.lock")
    blocked = sorted({top for top, dists in metadata.packages_distributions().items()
                      if any(canonicalize_name(d) in left_out for d in dists) and not top.startswith("_")})
    assert {"pytest", "moto", "autodp"} <= set(blocked)
    source = tmp_path / "mnist300.parquet"
    code = textwrap.dedent(f"""
        import importlib, importlib.abc, pkgutil, sys
        BLOCKED = set({blocked!r})
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"{{name}}: not in the production lock")
        sys.meta_path.insert(0, Block())
        import dpsynth, dpsynth_mlflow
        for pkg in (dpsynth, dpsynth_mlflow):
            for mod in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
                if not mod.name.endswith("__main__"):
                    importlib.import_module(mod.name)
        import kfp.dsl.executor_main  # the KFP lightweight components' executor, in the stage image
        from dpsynth.cli import main
        from dpsynth.data import import_source, write_parquet
        write_parquet(import_source({str(REPO / "data" / "mnist")!r}).subset(range(300)), {str(source)!r})
        assert main(["data", "import", "--json", "--outside", "--versioned", {str(source)!r},
                     {str(tmp_path / "data" / "d.parquet")!r}]) == 0
        assert main(["partition", "--run-dir", {str(tmp_path / "run")!r}, "--set", "data.uri={source}",
                     "--set", "partition.key=k", "--set", "data.num_classes=10", "--set", "tracking.enabled=false",
                     "--set", "ledger.population_id=p"]) == 0
        print("ok", len(BLOCKED))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1].startswith("ok "), proc.stderr[-4000:]
