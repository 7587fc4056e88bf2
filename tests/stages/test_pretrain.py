"""dpsynth pretrain: a recorded no-op for DPGAN; for GS-WGAN one task per shard (`--shard K`) and a fan-in."""

import dataclasses
import hashlib
import json
from pathlib import Path

from tests.stages.helpers import KEY, manifest, stage, stages


def test_dpgan_pretrain_is_a_recorded_noop(tmp_path, source):
    run = tmp_path / "run"
    stages(run, source, "partition", "pretrain")
    m = manifest(run, "sensitive", "pretrain")
    assert m["status"] == "succeeded" and m["outputs"] == []
    assert m["details"] == {"performed": False, "reason": "method 'dpgan' does not pre-training"}
    assert m["privacy"]["epsilon"] == 0 and m["privacy"]["accountant"] == "none"
    (entry,) = m["inputs"]
    assert entry["role"] == "partition_manifest"
    assert entry["sha256"] == hashlib.sha256(Path(entry["uri"]).read_bytes()).hexdigest()
    assert sorted(p.name for p in (run / "sensitive" / "pretrain").iterdir()) == ["manifest.json"]


def test_needs_a_partition(tmp_path, source, capsys):
    assert stage("pretrain", tmp_path / "run", source) == 2
    assert "no manifest" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


GSWGAN = ("train.method=gswgan", "partition.num_shards=2", "gswgan.pretrain_iterations=2", "gswgan.batch_size=8",
          "gswgan.d_width=4", "gswgan.g_width=4", "gswgan.latent_dim=4", "train.n_d=1")


def shard_files(run) -> dict[str, str]:
    root = run / "sensitive" / "pretrain"
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*.pt"))}


def test_one_shard_task_then_the_fan_in(tmp_path, source, capsys):
    """`--shard 1` (one mapped task) pre-trains shard 1 alone and writes no manifest; the fan-in
    runs only the missing shard 0 and lists one discriminator per shard."""
    run = tmp_path / "run"
    stages(run, source, "partition", overrides=GSWGAN)
    capsys.readouterr()
    assert stage("pretrain", run, source, *GSWGAN, flags=("--shard", "1", "--json")) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["status"] == "succeeded" and record["shard"] == 1
    assert list(shard_files(run)) == ["shard-00001/discriminator.pt"]
    assert not (run / "sensitive" / "pretrain" / "manifest.json").exists()
    assert stage("pretrain", run, source, *GSWGAN, flags=("--shard", "1", "--json")) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "skipped"  # a retried task redoes nothing
    shard1 = shard_files(run)["shard-00001/discriminator.pt"]

    stages(run, source, "pretrain", overrides=GSWGAN)
    m = manifest(run, "sensitive", "pretrain")
    assert m["details"]["ran_here"] == 1 and m["details"]["shards"] == 2
    assert [(o["role"], o["shard"], o["zone"]) for o in m["outputs"]] == [
        ("discriminator", 0, "sensitive"), ("discriminator", 1, "sensitive")]
    assert shard_files(run)["shard-00001/discriminator.pt"] == shard1
    assert m["privacy"]["epsilon"] == 0


def test_bad_shard_index_names_the_range(tmp_path, source, capsys):
    run = tmp_path / "run"
    stages(run, source, "partition", overrides=GSWGAN)
    assert stage("pretrain", run, source, *GSWGAN, flags=("--shard", "2")) == 2
    assert "has 2 shards (0..1)" in capsys.readouterr().err
    assert shard_files(run) == {}


def test_a_shards_discriminator_depends_on_that_shard_alone(tmp_path, source, mnist600):
    """Change shard 0's records: only shard 0's pre-training is redone, and the other shard's
    discriminator file is byte-identical; two local worker processes produce the same files as one."""
    import numpy as np

    from dpsynth.data import write_parquet
    from dpsynth.stages.partition import assign

    run, versioned = tmp_path / "run", str(tmp_path / "dataset.parquet")  # a new version lands at the same URI
    write_parquet(mnist600, versioned)
    stages(run, versioned, "partition", "pretrain", overrides=GSWGAN)
    before = shard_files(run)

    where = assign(mnist600.record_ids, key=KEY, heldout_fraction=0.1, num_shards=2)
    images = mnist600.images.copy()
    images[where == 0] = 255 - images[where == 0]
    write_parquet(dataclasses.replace(mnist600, images=images), versioned)
    stages(run, versioned, "partition", overrides=GSWGAN)
    stages(run, versioned, "pretrain", overrides=(*GSWGAN, "pretrain.workers=2"))
    after = shard_files(run)
    assert after["shard-00001/discriminator.pt"] == before["shard-00001/discriminator.pt"]
    assert after["shard-00000/discriminator.pt"] != before["shard-00000/discriminator.pt"]
    assert manifest(run, "sensitive", "pretrain")["details"]["ran_here"] == 1

    fresh = tmp_path / "fresh"
    stages(fresh, versioned, "partition", "pretrain", overrides=(*GSWGAN, "pretrain.workers=2"))
    assert manifest(fresh, "sensitive", "pretrain")["details"]["ran_here"] == 2
    assert shard_files(fresh) == after
