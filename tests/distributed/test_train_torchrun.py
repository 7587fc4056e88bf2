"""The pipeline's train stage under torchrun (2 gloo processes on CPU): `dpsynth train --run-dir RUN_DIR` joined by
every rank; rank 0 is the stage (one ledger attempt, one MLflow child run, the outputs and the manifest), the
other ranks train in step with it and write nothing."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from dpsynth.ledger.store import Ledger
from tests.methods import distributed_workers as workers
# the stage tests' fixtures, as in tests/stages (autouse there and here: ledger_with_budget, one_torch_thread)
from tests.stages.conftest import ledger_with_budget, one_torch_thread  # noqa: F401 (autouse fixtures)
from tests.stages.helpers import TINY, dpsynth, manifest, settings, stages

GSWGAN = ("train.method=gswgan", "partition.num_shards=3", "gswgan.d_width=4", "gswgan.g_width=4",
          "gswgan.latent_dim=8", "gswgan.batch_size=16", "gswgan.pretrain_iterations=2", "train.n_d=2",
          "train.steps=4", "privacy.epsilon=50")
ZHANG = ("train.method=zhang", "data.public_source=sklearn:digits", "zhang.public_batch_size=16",
         "zhang.pretrain_iterations=2", "zhang.num_groups=3", "train.n_d=2", "train.steps=6")


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def train_runs(tracking_uri: str) -> list:
    from mlflow import MlflowClient

    from dpsynth import tracking

    client = MlflowClient(tracking_uri)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    return [r for r in runs if r.data.tags.get(tracking.TAG_STAGE) == "train"]


# Slow tier (#53 item 5: one forked 2-rank train stage job per path in the quick tier): DPGAN's train stage on 2 forked
# ranks runs quick in tests/distributed/test_launch.py::test_trainjob_launch_end_to_end_on_a_local_stand_in[TrainJob]
# (rank 0 the stage, one charge, one event per step), the stage's rank 1 following in the test below (GS-WGAN) and
# the real torchrun job at the end; only rank 0 writing (files, MLflow, trace) in
# tests/distributed/test_distributed.py::test_only_rank_zero_writes_and_the_trace_has_one_event_per_logical_step.
@pytest.mark.slow
def test_only_rank_zero_is_the_stage(tmp_path, source):
    """Rank 0 runs the stage in RUN_DIR; rank 1 follows from a copy of the same upstream outputs with its own
    MLflow store and ledger: the copy, the store and the ledger are left exactly as they were."""
    overrides = [f"data.uri={source}", *TINY, "partition.num_shards=1", "train.steps=6"]
    run0, run1 = tmp_path / "run0", tmp_path / "run1"
    stages(run0, source, "partition", "pretrain", overrides=["partition.num_shards=1"])
    shutil.copytree(run0, run1)
    before = tree(run1)
    Ledger(f"sqlite:///{tmp_path / 'ledger0.db'}").set_budget("mnist600", epsilon=100.0, delta=1e-3, reason="test")
    workers.run_ranks(2, tmp_path, workers.train_stage, str(tmp_path), [str(run0), str(run1)], overrides)

    outcome = json.loads((tmp_path / "outcome.json").read_text())
    assert outcome["status"] == "succeeded" and outcome["manifest"]["details"]["steps"] == 6
    assert outcome["manifest"]["details"]["ranks"] == 2
    trace = json.loads((run0 / "sensitive" / "train" / "trace.json").read_text())
    assert trace["events"][-1]["count"] == 6  # one event per logical step, not one per rank
    (charged,) = Ledger(f"sqlite:///{tmp_path / 'ledger0.db'}").history("mnist600")
    assert charged["status"] == "committed" and charged["epsilon_spent"] == pytest.approx(
        outcome["manifest"]["privacy"]["epsilon"], rel=1e-6)
    assert len(train_runs(f"sqlite:///{tmp_path / 'mlflow0.db'}")) == 1
    # rank 1: no file in its run directory, no MLflow store, no ledger
    assert tree(run1) == before
    assert not (tmp_path / "mlflow1.db").exists() and not (tmp_path / "ledger1.db").exists()


def test_gswgan_ranks_read_their_own_shards_and_the_job_is_one_attempt(tmp_path, source):
    """GS-WGAN on 2 ranks through the stage (K = 3: rank 0 holds shard 0, rank 1 shards 1 and 2), both in one run
    directory as under torchrun: each rank reads only its own shards' records and pre-trained discriminators;
    rank 0 is charged once, for one trace of one event per iteration, and the audit passes."""
    overrides = [f"data.uri={source}", *TINY, *GSWGAN]
    run = tmp_path / "run"
    stages(run, source, "partition", "pretrain", overrides=GSWGAN)
    Ledger(f"sqlite:///{tmp_path / 'ledger0.db'}").set_budget("mnist600", epsilon=100.0, delta=1e-3, reason="test")
    workers.run_ranks(2, tmp_path, workers.gswgan_train_stage, str(tmp_path), [str(run), str(run)], overrides)

    outcome = json.loads((tmp_path / "outcome.json").read_text())
    assert outcome["status"] == "succeeded" and outcome["manifest"]["details"]["ranks"] == 2
    trace = json.loads((run / "sensitive" / "train" / "trace.json").read_text())
    assert trace["events"][-1]["count"] == 4  # one event per iteration, not one per rank
    (charged,) = Ledger(f"sqlite:///{tmp_path / 'ledger0.db'}").history("mnist600")
    assert charged["status"] == "committed" and charged["epsilon_spent"] == pytest.approx(
        outcome["manifest"]["privacy"]["epsilon"], rel=1e-6)
    assert not (tmp_path / "ledger1.db").exists() and not (tmp_path / "mlflow1.db").exists()
    for rank, own in ((0, [0]), (1, [1, 2])):
        reads = json.loads((tmp_path / f"reads{rank}.json").read_text())
        shards = sorted(int(Path(u).stem.split("-")[1]) for u in reads if "/partition/shard-" in u)  # shard-K-of-N
        warm = sorted(int(Path(u).parent.name.split("-")[-1]) for u in reads if u.endswith("discriminator.pt"))
        assert shards == own and warm == own, (rank, reads)
    stages(run, source, "audit", overrides=[*GSWGAN, f"ledger.url=sqlite:///{tmp_path / 'ledger0.db'}"])
    assert json.loads((run / "sensitive" / "audit" / "audit.json").read_text())["decision"] == "passed"


def test_torchrun_train_stage_end_to_end(tmp_path, source, ledger_with_budget, capfd):
    """`dpsynth train --launch torchrun --run-dir RUN` (what the local orchestrators run: `torchrun --nproc-per-node 2
    -m dpsynth train --run-dir RUN` on this machine; dp-GAN, after partition and pretrain): one JSON outcome on
    stdout, rank 0's; the manifest, one ledger attempt, one MLflow child run, a passed audit. Run again by both ranks
    (`dpsynth train --run-dir RUN` as torchrun starts it, forked from one warm interpreter: one torchrun job per test),
    the stage is skipped (rank 0 tells the other rank) and nothing more is charged."""
    run, uri = tmp_path / "run", f"sqlite:///{tmp_path / 'mlflow.db'}"
    stages(run, source, "partition", "pretrain", overrides=ZHANG)
    argv = ["train", "--run-dir", run, "--pipeline-run-id", "torchrun-e2e",
            *settings(source, *ZHANG, "tracking.enabled=true", f"tracking.uri={uri}", "train.gpus_per_node=2"), "--json"]
    capfd.readouterr()  # the launcher in this process; torchrun and its ranks in their own, writing to our stdout
    code = dpsynth(argv[0], "--launch", "torchrun", *argv[1:])
    done = capfd.readouterr()
    assert code == 0, done.err[-4000:]
    outcome = json.loads(done.out)  # rank 0 alone printed (one JSON document)
    assert outcome["status"] == "succeeded" and outcome["stage"] == "train"
    trained = manifest(run, "sensitive", "train")
    assert (trained["details"]["method"], trained["details"]["steps"], trained["details"]["ranks"]) == ("zhang", 6, 2)
    assert json.loads((run / "sensitive" / "train" / "trace.json").read_text())["events"][-1]["count"] == 6
    (charged,) = ledger_with_budget.history("mnist600")
    assert charged["status"] == "committed" and charged["epsilon_spent"] == pytest.approx(
        trained["privacy"]["epsilon"], rel=1e-6)
    (child,) = train_runs(uri)
    assert child.info.run_id == outcome["mlflow_run_id"] and child.data.metrics["epsilon"] == pytest.approx(
        trained["privacy"]["epsilon"])
    stages(run, source, "audit", overrides=ZHANG)
    assert json.loads((run / "sensitive" / "audit" / "audit.json").read_text())["decision"] == "passed"

    again = tmp_path / "again"
    again.mkdir()
    (code0, out0, err0), (code1, out1, err1) = workers.cli_ranks(2, again, argv)
    assert (code0, code1) == (0, 0), (err0[-4000:], err1[-4000:])
    assert json.loads(out0)["status"] == "skipped" and out1 == ""  # rank 0 alone printed
    assert len(ledger_with_budget.history("mnist600")) == 1  # nothing trained, nothing charged
    assert manifest(run, "sensitive", "train") == trained
