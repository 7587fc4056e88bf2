"""GS-WGAN and DPAC end to end through the stages: partition → pretrain → train → audit → sample."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpsynth import storage
from dpsynth.data import import_source, read_parquet, write_parquet
from dpsynth.stages.audit import mechanism_check
from dpsynth.privacy import MechanismTrace
from tests.ledger_fixtures import assert_charged_once
from tests.stages.helpers import MNIST, manifest, stage
from tests.stages.helpers import TINY as STAGE_SETTINGS
from tests.torch_threads import one_torch_thread  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha:UserWarning")

TINY = ("partition.num_shards=3", "gswgan.d_width=4", "gswgan.g_width=4", "gswgan.latent_dim=8",
        "gswgan.batch_size=16", "train.n_d=2", "gswgan.pretrain_iterations=2", "train.steps=6",
        "dpac.start_iteration=2", "dpac.n_f=2", "dpac.n_r=2", "dpac.c_width=4")


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("source") / "mnist600.parquet"
    write_parquet(import_source(MNIST).subset(np.arange(600)), path)
    return str(path)



# One run per path in the quick tier (#53 item 5): DPAC's, whose stages, pre-training and mechanism are GS-WGAN's
# (its trainer a subclass adding the classifier); GS-WGAN's own in the slow tier, and its partition → pretrain →
# train → audit quick in tests/distributed/test_train_torchrun.py::test_gswgan_ranks_read_their_own_shards_and_the_job_is_one_attempt.
@pytest.mark.parametrize("method", [pytest.param("gswgan", marks=pytest.mark.slow), "dpac"])
def test_pipeline_stages(tmp_path, source, method, stage_ledger):
    run = tmp_path / "run"
    overrides = (f"train.method={method}", *TINY)
    for name in ("partition", "pretrain", "train", "audit", "sample"):
        assert stage(name, run, source, *overrides) == 0, name
    warm = manifest(run, "sensitive", "pretrain")
    discriminators = [o for o in warm["outputs"] if o["role"] == "discriminator"]
    assert sorted(o["shard"] for o in discriminators) == [0, 1, 2]
    trained = manifest(run, "sensitive", "train")
    assert trained["privacy"]["accountant"] == "wor" and trained["details"]["steps"] == 6
    assert 0 < trained["privacy"]["epsilon"] <= 10  # the default budget
    assert all(e["sample_rate"] == pytest.approx(1 / 3) for e in trained["privacy"]["events"])
    assert_charged_once(stage_ledger, trained)
    from dpsynth.config import load_config

    cfg = load_config(overrides=[*STAGE_SETTINGS, *overrides])  # what the stages ran with
    trace = MechanismTrace.from_dict({"format": "dpsynth.mechanism_trace/1", "events": trained["privacy"]["events"]})
    n = trained["details"]["training_records"]
    assert mechanism_check(cfg, trace, n=n)["passed"]
    audit = manifest(run, "sensitive", "audit")
    report = json.loads(storage.read_bytes([o["uri"] for o in audit["outputs"] if o["uri"].endswith(".json")][0]))
    assert [c["name"] for c in report["checks"] if not c["passed"]] == []
    assert {c["name"] for c in report["checks"]} >= {"plan", "accounting"}
    sampled = manifest(run, "release", "sample")
    synthetic = [o for o in sampled["outputs"] if o["uri"].endswith(".parquet")]
    ds = read_parquet(synthetic[0]["uri"])
    assert len(ds) == 200 and ds.shape == (28, 28, 1)
    assert storage.exists(str(run / "release" / "sample" / "generator.pt"))
