"""dpsynth train --run-dir: the DPGAN trainer on the training shards only, with a manifest."""

import json

import pytest
import torch
from opacus.accountants import RDPAccountant

from tests.stages.helpers import KEY, dpsynth, manifest, settings, stage, stages


def test_trains_on_the_shards_only(tmp_path, source):
    run = tmp_path / "run"
    stages(run, source, "partition", "pretrain", "train", overrides=["partition.num_shards=2"])
    part, m = manifest(run, "sensitive", "partition"), manifest(run, "sensitive", "train")
    n_train = sum(o["rows"] for o in part["outputs"] if o["role"] == "shard")
    n_heldout = sum(o["rows"] for o in part["outputs"] if o["role"] == "heldout")
    assert n_train + n_heldout == 600 and n_heldout > 0
    assert m["status"] == "succeeded" and m["details"]["training_records"] == n_train
    assert {o["role"] for o in m["outputs"]} == {"generator", "trace", "result", "grid", "config"}
    assert all(o["zone"] == "sensitive" and "/sensitive/train/" in o["uri"] for o in m["outputs"])
    assert [i["role"] for i in m["inputs"]] == ["partition_manifest", "pretrain_manifest", "shard", "shard"]
    (event,) = json.loads((run / "sensitive" / "train" / "trace.json").read_text())["events"]
    assert event["sample_rate"] == pytest.approx(32 / n_train, rel=1e-12)  # q = B/n over the shards alone
    assert event["count"] == 12 and m["privacy"]["events"] == [event]
    ref = RDPAccountant()  # Opacus' own accountant, not ours
    ref.history = [(event["noise_multiplier"], event["sample_rate"], event["count"])]
    assert m["privacy"]["epsilon"] == pytest.approx(ref.get_epsilon(1e-4), rel=1e-6)
    assert m["privacy"]["epsilon"] <= 10
    assert KEY not in (run / "sensitive" / "train" / "config.yaml").read_text()
    assert not (run / "release").exists()


def test_needs_pretrain_and_resumes_only_its_own_checkpoints(tmp_path, source, capsys):
    run = tmp_path / "run"
    stages(run, source, "partition")
    assert stage("train", run, source) == 2
    assert "pretrain" in capsys.readouterr().err
    assert not (run / "sensitive" / "train").exists()
    stages(run, source, "pretrain")
    last = run / "sensitive" / "train" / "checkpoints" / "last.pt"
    last.parent.mkdir(parents=True)
    last.write_bytes(b"a checkpoint of other settings or other data")
    assert stage("train", run, source, "output.checkpoint_every=5") == 0  # discarded, not resumed
    assert torch.load(last, weights_only=False)["step"] == 10  # this run's own checkpoint
    assert manifest(run, "sensitive", "train")["details"]["steps"] == 12


def test_without_run_dir_train_is_the_plain_trainer(tmp_path, source):
    assert dpsynth("train", *settings(source, f"output.dir={tmp_path / 'out'}")) == 0
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"generator.pt", "trace.json", "result.json"} <= names and "manifest.json" not in names
    assert not (tmp_path / "sensitive").exists()


def test_checkpoints_leave_generator_snapshots_for_the_epsilon_curve(tmp_path, source):
    """At every checkpoint DPGAN keeps the generator with the ε spent so far; the train manifest lists
    them (sensitive zone) and evaluate draws its ε-vs-metric curve from them."""
    import io

    from dpsynth import storage

    run = tmp_path / "run"
    stages(run, source, "partition", "pretrain", "train", "audit", "sample", "evaluate",
           overrides=("output.checkpoint_every=4", "evaluate.curve_samples=100", "evaluate.mia=false"))
    m = manifest(run, "sensitive", "train")
    snaps = [o for o in m["outputs"] if o["role"] == "generator_snapshot"]
    assert [o["uri"].rsplit("/", 1)[1] for o in snaps] == ["generator-0000004.pt", "generator-0000008.pt",
                                                           "generator-0000012.pt"]
    assert all(o["zone"] == "sensitive" for o in snaps)
    eps = [torch.load(io.BytesIO(storage.read_bytes(o["uri"])), weights_only=True)["privacy"]["epsilon"] for o in snaps]
    assert 0 < eps[0] < eps[1] < eps[2] == pytest.approx(m["privacy"]["epsilon"])
    report = json.loads((run / "release" / "evaluate" / "report.json").read_text())
    assert [round(p["epsilon"], 9) for p in report["epsilon_curve"]] == [round(e, 9) for e in eps]
