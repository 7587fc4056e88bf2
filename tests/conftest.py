"""Fixtures shared across test folders."""

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from tests import rdp_cache

MNIST = Path(__file__).resolve().parents[1] / "data" / "mnist"

# The fixtures of the services the tests start (a real PostgreSQL, moto's S3 server, the Airflow venv and its fork
# server) and of the stage tests' data and trained run, defined once for the session: a test module uses them by name
# and never imports them (a fixture imported into a module is that module's own copy: each module started its own
# server; tests/test_fixtures.py checks it).
pytest_plugins = ["tests.pg_fixtures", "tests.s3_fixtures", "tests.airflow_fixtures", "tests.stage_fixtures"]

# No MLflow usage telemetry from the tests or the processes they start, as on the platform (scripts/platform.sh):
# set before any test module imports MLflow (MLflow's own pytest check reads PYTEST_CURRENT_TEST only at its
# import, which a module imported at collection precedes).
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")

rdp_cache.install()  # in every test process, and in the forked ranks' server (it preloads this module)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Once a test process has imported MLflow's store, its new SQLite stores start from one migrated schema
    (tests/mlflow_template.py: MLflow's migrations run once per process instead of once per store)."""
    if "mlflow.store.db.utils" in sys.modules:
        from tests import mlflow_template

        mlflow_template.install()


@pytest.fixture(scope="session")
def small_mnist():
    """The first 600 bundled MNIST images: enough for a few tiny private steps (read-only: subset it, never
    modify it)."""
    from dpsynth.data import import_source

    return import_source(str(MNIST)).subset(np.arange(600))


# The quick tier's longest modules, longest first, by the wall seconds of their tests (junit: setup + call + teardown,
# summed per module) in one `make test` on a fresh clone (#53, 2026-11-30, seventh session; 1,506 passed, 874 s of
# pytest with two benchmark processes beside it, so every figure is stretched alike), re-ordered in the eighth session
# by the CPU-s of the modules its helpers changed (cgroup, one module alone: test_logged_keys 15.6 leaves the list,
# test_private_evolution_pipeline 25.4 and test_real_and_noise 24.3 join it). In `make test`
# each module pays its worker's shared costs (imports, fork servers, first stores) only once. `make test` hands whole
# modules to its two workers in collection order (--dist loadscope --no-loadscope-reorder); these go first so that
# the run does not end on one of them alone on one worker while the other has nothing left (xdist's own order, by
# number of tests, put them last).
LONGEST_FIRST = [
    "tests/pipelines/test_airflow.py",           # 100 (test_unpaused's check included)
    "tests/distributed/test_distributed.py",     # 85
    "tests/methods/test_gswgan_federated.py",    # 82 (forked ranks; one torchrun job)
    "tests/stages/test_egress.py",               # 81 (one torchrun job)
    "tests/methods/test_contract.py",            # 74
    "tests/distributed/test_train_torchrun.py",  # 73 (torchrun jobs)
    "tests/ledger/test_ledger.py",               # 65
    "tests/audit/test_empirical.py",             # 57
    "tests/stages/test_pipeline.py",             # 51
    "tests/warmup/test_warmup.py",               # 50
    "tests/audit/test_empirical_stage.py",       # 41
    "tests/mlflow_plugins/test_ledger_page.py",  # 35
    "tests/deploy/test_mlflow_hosts.py",         # 34
    "tests/stages/test_train_attempts.py",       # 32
    "tests/pipelines/test_entry_points.py",      # 25
    "tests/stages/test_private_evolution_pipeline.py",  # 25.4 CPU-s (one run shared with the egress pass)
    "tests/evaluation/test_real_and_noise.py",   # 24.3 CPU-s (one reference CNN for fid and scores)
]
# No longer in the list: tests/ledger/test_attempt.py (27 in the sixth session, 13 now: shorter killed runs).


# The slow tier's modules (`make test-slow`: `pytest -m slow`, on two workers like `make test`), longest first, by the
# wall seconds of their slow tests (--durations: setup + call + teardown) in one two-worker run of the tier on the
# 2-core machine, with other jobs beside it (#53, 2026-11-29, sixth session: 42 passed, 2,693 s wall, 2,010 CPU-s).
# test_methods.py's KFP runs (its class TestKfp, 967 s) are a unit of their own for the workers. A slow test is placed
# by this list, a quick one by LONGEST_FIRST: each tier selects one kind, so each keeps its modules together.
SLOW_LONGEST_FIRST = [
    "tests/pipelines/test_methods.py",          # 1,760 (Airflow) + 967 (KFP)
    "tests/pipelines/test_airflow.py",          # 668
    "tests/stages/test_shipped_configs.py",     # 350
    "tests/platform/test_ui.py",                # 319
    "tests/pipelines/test_block_windows.py",    # 264
    "tests/pipelines/test_kfp.py",              # 209
    "tests/methods/test_gswgan_federated.py",   # 81
    "tests/stages/test_sigterm.py",             # 62
    "tests/pipelines/test_dataset_versions.py", # 61
    "tests/distributed/test_launch.py",         # 39
    "tests/distributed/test_distributed.py",    # 37
    "tests/methods/test_contract.py",           # 29
    "tests/methods/test_dpgan.py",              # 29
    "tests/evaluation/test_accuracy.py",        # 28
    "tests/privacy/test_calibration.py",        # 17
    "tests/methods/test_dpgan_paper_scale.py",  # 11
    "tests/privacy/test_accountants.py",        # 4
    "tests/audit/test_empirical_warmup.py",     # 3
]


# Modules that use the same costly service of a test process run on one worker, as one unit of the loadscope schedule
# (each other module is a unit of its own): a second worker running any of them would start the service again. A
# module left out of its group costs only that start; its tests pass either way.
SHARED_SERVICE = {
    # tests/methods/distributed_workers.py's fork server (forked ranks and killed runs): its PRELOAD, 12 CPU-s
    "forked ranks": ["tests/distributed/test_distributed.py", "tests/methods/test_gswgan_federated.py",
                     "tests/methods/test_contract.py", "tests/distributed/test_train_torchrun.py",
                     "tests/stages/test_train_attempts.py", "tests/distributed/test_distributed_stop.py",
                     "tests/distributed/test_launch.py", "tests/ledger/test_attempt.py", "tests/stages/test_sigterm.py"],
    # airflow_env's Airflow fork server (tests/airflow_fixtures.py's in_airflow): an Airflow import, 5 CPU-s
    "airflow": ["tests/pipelines/test_airflow.py", "tests/pipelines/test_entry_points.py",
                "tests/pipelines/test_airflow_logs.py", "tests/pipelines/test_parse_cost.py",
                "tests/pipelines/test_connections.py", "tests/pipelines/test_retries.py"],
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's --dist loadscope, with each group of SHARED_SERVICE one unit (the slow tier's too)."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedServiceScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:  # else xdist's own: a module, or a class of one
            return shared_service(nodeid) or super()._split_scope(nodeid)

    return SharedServiceScheduling(config, log)


_GROUP_OF = {module: name for name, modules in SHARED_SERVICE.items() for module in modules}


def shared_service(nodeid: str) -> str | None:
    """The SHARED_SERVICE group of a test's module, or None."""
    return _GROUP_OF.get(nodeid.split("::", 1)[0])


def pytest_configure(config):
    """The session's store of RDP curves (tests/rdp_cache.py), made by its first process: the workers xdist starts
    and the ranks they fork inherit the variable."""
    if not os.environ.get(rdp_cache.VAR):
        config._rdp_store = tempfile.TemporaryDirectory(prefix="dpsynth-rdp-")
        os.environ[rdp_cache.VAR] = config._rdp_store.name


def pytest_unconfigure(config):
    store = getattr(config, "_rdp_store", None)
    if store is not None:
        os.environ.pop(rdp_cache.VAR, None)
        store.cleanup()


def pytest_collection_modifyitems(config, items):
    """Modules in LONGEST_FIRST (a slow test: SLOW_LONGEST_FIRST) before the rest (a stable sort: every module's tests
    of a tier stay together, in order)."""
    quick = {path: i for i, path in enumerate(LONGEST_FIRST)}
    slow = {path: i for i, path in enumerate(SLOW_LONGEST_FIRST)}
    root = Path(config.rootpath)

    def rank(item) -> int:
        order = slow if item.get_closest_marker("slow") else quick
        return order.get(Path(item.path).relative_to(root).as_posix(), len(order))

    items.sort(key=rank)
