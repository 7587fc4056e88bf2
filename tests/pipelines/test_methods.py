"""Every training method end to end through both orchestrators' test paths, on 600 real MNIST
records at toy size: the Airflow DAG (`airflow dags test dpsynth_train`, the pre-training mapped over
K = 2 shards) and the KFP pipeline (`kfp.local`, the pre-training in a ParallelFor). Each run must
pass the audit and release a generator and synthetic data.

DPGAN's runs are the fast tests in test_airflow.py / test_kfp.py (the pre-training mapped over K = 2 shards
there too). Every run here is marked slow (`make test-slow`, which CI runs after `make test`): a whole DAG
run costs a minute or more on 2 cores; GS-WGAN's real per-shard pre-training runs are also run, as an
orchestrator runs the stages (one task per shard), by tests/stages/test_egress.py's walk in `make test`.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from dpsynth import storage
from tests.airflow_fixtures import AIRFLOW_BIN, REPO
from tests.stages.helpers import manifest, release_files

COMMON = ["sample.num_samples=200", "output.log_every=0", "output.sample_every=0", "output.checkpoint_every=0",
          "evaluate.mia_records=50", "evaluate.mia_generated=200", "evaluate.feature_steps=5", "evaluate.epochs=1",
          "evaluate.curve_samples=0"]
# the platform's settings (Airflow: DPSYNTH_STAGE_CONFIG; a trigger may not give them, #55 item 5)
PLATFORM = ["partition.key=dpsynth-partition-v1", "data.num_classes=10"]
GSWGAN = ["gswgan.pretrain_iterations=2", "gswgan.batch_size=8", "gswgan.d_width=4", "gswgan.g_width=4",
          "gswgan.latent_dim=4", "train.n_d=1"]
TINY = {
    "gswgan": GSWGAN,
    "gswgan_federated": GSWGAN,
    "dpac": [*GSWGAN, "dpac.start_iteration=2", "dpac.n_f=1", "dpac.n_r=1", "dpac.c_width=4"],
    "zhang": ["train.d_width=4", "train.g_width=4", "train.latent_dim=8",
              "train.batch_size=32", "train.n_d=2", "zhang.pretrain_iterations=2", "zhang.public_batch_size=16",
              "zhang.num_groups=2"],
}
# the public data dp-GAN pre-trains on: a data.* setting, so the platform's (a trigger may give only data.uri)
PUBLIC = {"zhang": {"public_source": "sklearn:digits"}}
STEPS = {"gswgan": 4, "gswgan_federated": 3, "dpac": 4, "zhang": 6}
SLOW = pytest.mark.slow


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    from dpsynth.data import import_source, write_parquet

    path = tmp_path_factory.mktemp("source") / "mnist600.parquet"
    write_parquet(import_source(REPO / "data" / "mnist").subset(np.arange(600)), path)
    return str(path)


def budgeted(tmp_path) -> tuple:
    """A ledger of the test's own (``ledger.url``), with the budget an operator sets beforehand."""
    from dpsynth.ledger.store import Ledger

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger(url)
    ledger.set_budget("mnist600", epsilon=100.0, delta=1e-3, records=600, reason="tests/pipelines/test_methods")
    return ledger, [f"ledger.url={url}"]


def check_charged(ledger, pipeline_run_id: str) -> None:
    """The one train attempt was charged to the population, and committed within the target ε."""
    (charged,) = ledger.reservations(pipeline_run_id=pipeline_run_id)
    assert charged["population_id"] == "mnist600" and charged["stage"] == "train"
    assert charged["status"] == "committed" and 0 < charged["epsilon_spent"] <= 10


def check_release(run_dir, method: str) -> None:
    audit = json.loads(storage.read_bytes(f"{run_dir}/sensitive/audit/audit.json"))
    assert audit["decision"] == "passed", audit
    train = manifest(run_dir, "sensitive", "train")
    assert train["details"]["method"] == method
    assert {"sample/generator.pt", "sample/synthetic.parquet", "evaluate/report.json"} <= set(release_files(run_dir))
    if method in ("gswgan", "gswgan_federated", "dpac"):
        warm = manifest(run_dir, "sensitive", "pretrain")
        assert [o["shard"] for o in warm["outputs"]] == [0, 1]
        # each shard pre-trained by the orchestrator's fan-out (Airflow's mapped task, KFP's ParallelFor), none by the
        # fan-in stage, which pre-trains a missing shard itself (a fan-out of one shard passed before this check)
        assert warm["details"]["ran_here"] == 0, warm["details"]
        assert all(e["sampling"] == "without_replacement" for e in train["privacy"]["events"])


@SLOW
@pytest.mark.parametrize("method", ["gswgan", "gswgan_federated", "dpac", "zhang"])
def test_airflow(method, source, airflow_db, tmp_path):
    """One metadata database for the module's DAG runs, migrated once (``airflow_db``), as the four runs shared one
    before (an Airflow start and a migration check a run fewer)."""
    airflow = str(AIRFLOW_BIN / "airflow")
    ledger, _ = budgeted(tmp_path)
    conf = {"dataset_uri": source, "method": method, "epsilon": 10, "delta": 1e-4, "steps": STEPS[method],
            "num_shards": 2, "n_d": "2", "seed": 0, "run_root": str(tmp_path / "runs"), "config": None,
            "pipeline_run_id": f"af-{method}", "population_id": "mnist600", "overrides": [*COMMON, *TINY[method]]}
    # the tracking store and the ledger beside it are platform settings, not the form's (#34)
    env = {**airflow_db, "DPSYNTH_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
           "DPSYNTH_STAGE_CONFIG": json.dumps({"partition": {"key": "dpsynth-partition-v1"},
                                               "data": {"num_classes": 10, **PUBLIC.get(method, {})}})}
    # timeout: a hang guard, as test_airflow.py's (a run took over 600 s on 2 cores busy with other jobs)
    proc = subprocess.run([airflow, "dags", "test", "dpsynth_train", "-c", json.dumps(conf)], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "state=success" in log, log[-6000:]
    assert log.count("running task <TaskInstance: dpsynth_train.pretrain_shard") == 2
    check_release(tmp_path / "runs" / f"af-{method}", method)
    check_charged(ledger, f"af-{method}")


class TestKfp:
    """The KFP runs, in a class so that `make test-slow`'s two workers can share the module's eight runs (--dist
    loadscope hands a module's functions to one worker, and a class as a unit of its own)."""

    @SLOW
    @pytest.mark.parametrize("method", ["gswgan", "gswgan_federated", "dpac", "zhang"])
    def test_kfp(self, method, source, tmp_path, monkeypatch):
        from tests.pipelines.test_kfp import load_run_local

        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        run = tmp_path / "run"
        ledger, ledger_url = budgeted(tmp_path)
        load_run_local().run(dataset=source, run_dir=str(run),
                             extra=[*COMMON, *PLATFORM, *[f"data.{k}={v}" for k, v in PUBLIC.get(method, {}).items()],
                                    *TINY[method], "tracking.enabled=false", *ledger_url],
                             pipeline_root=str(tmp_path / "kfp"), population_id="mnist600", method=method,
                             epsilon=10.0, delta=1e-4, steps=STEPS[method], num_shards=2, n_d="2", seed=0)
        check_release(run, method)
        (job,) = {r["pipeline_run_id"] for r in ledger.history("mnist600")}  # KFP's job id
        check_charged(ledger, job)
