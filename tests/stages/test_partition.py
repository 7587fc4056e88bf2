"""dpsynth partition: keyed-hash assignment, zones, manifest, stability, re-run safety, bad input."""

import dataclasses
import hashlib
import hmac
import json
from pathlib import Path

import numpy as np
import pytest

from dpsynth.data import read_parquet, write_parquet
from tests.stages.helpers import KEY, manifest, stage


def reference_place(rid: str, *, fraction: float, shards: int):
    """The spec, computed here independently: HMAC-SHA256(key, id); 8 bytes -> held out?; next 8 -> shard."""
    h = hmac.new(KEY.encode(), rid.encode(), hashlib.sha256).digest()
    if int.from_bytes(h[:8], "big") / 2**64 < fraction:
        return "heldout"
    return int.from_bytes(h[8:16], "big") % shards


def test_shards_and_heldout_follow_the_keyed_hash(tmp_path, source, mnist600):
    run = tmp_path / "run"
    assert stage("partition", run, source, "partition.num_shards=3") == 0
    m = manifest(run, "sensitive", "partition")
    assert m["status"] == "succeeded" and m["privacy"]["epsilon"] == 0
    assert m["dataset_sha256"] == m["inputs"][0]["content_sha256"] == mnist600.content_sha256()
    assert sorted(o["role"] for o in m["outputs"]) == ["heldout", "shard", "shard", "shard"]
    ids = {}
    for o in m["outputs"]:
        assert o["zone"] == "sensitive" and o["uri"].startswith(str(run / "sensitive" / "partition"))
        assert o["sha256"] == hashlib.sha256(Path(o["uri"]).read_bytes()).hexdigest()
        ds = read_parquet(o["uri"])
        assert len(ds) == o["rows"] and ds.record_ids == sorted(ds.record_ids)
        ids[Path(o["uri"]).stem] = set(ds.record_ids)
    held = ids.pop("heldout")
    assert all(reference_place(r, fraction=0.1, shards=3) == "heldout" for r in held)
    for k, name in enumerate(sorted(ids)):
        assert name == f"shard-{k:05d}-of-00003"
        assert all(reference_place(r, fraction=0.1, shards=3) == k for r in ids[name])
        assert not ids[name] & held  # held-out records are in no training shard
    assert set().union(held, *ids.values()) == set(mnist600.record_ids)
    assert 30 <= len(held) <= 90  # Binomial(600, 0.1): mean 60, sd 7.3
    assert not (run / "release").exists()
    assert KEY not in json.dumps(m)  # the key is redacted wherever it is written


def test_adding_a_record_changes_only_its_shard(tmp_path, mnist600):
    before, after = tmp_path / "599.parquet", tmp_path / "600.parquet"
    write_parquet(mnist600.subset(np.arange(599)), before)
    write_parquet(mnist600, after)
    hashes = {}
    for src in (before, after):
        run = tmp_path / src.stem
        assert stage("partition", run, str(src), "partition.num_shards=4") == 0
        hashes[src.stem] = {Path(o["uri"]).name: o["sha256"] for o in manifest(run, "sensitive", "partition")["outputs"]}
    assert hashes["599"].keys() == hashes["600"].keys()
    changed = [name for name in hashes["600"] if hashes["600"][name] != hashes["599"][name]]
    assert len(changed) == 1
    assert mnist600.record_ids[599] in read_parquet(tmp_path / "600" / "sensitive" / "partition" / changed[0]).record_ids


def test_rerun_is_skipped_unless_forced_or_changed(tmp_path, source, capsys):
    run = tmp_path / "run"

    def partition(*args):
        flags = ["--json", *(a for a in args if a.startswith("--"))]
        capsys.readouterr()
        assert stage("partition", run, source, *(a for a in args if not a.startswith("--")), flags=flags) == 0
        return json.loads(capsys.readouterr().out)

    first = partition()
    text = (run / "sensitive" / "partition" / "manifest.json").read_bytes()
    assert first["status"] == "succeeded"
    assert partition()["status"] == "skipped"
    assert (run / "sensitive" / "partition" / "manifest.json").read_bytes() == text
    assert partition("partition.num_shards=1", "sample.seed=7")["status"] == "skipped"  # settings it ignores
    assert partition("--force")["status"] == "succeeded"
    changed = partition("partition.num_shards=2")
    assert changed["status"] == "succeeded" and len(changed["manifest"]["outputs"]) == 3


@pytest.mark.parametrize("override, field", [
    ("partition.num_shards=1000", "partition.num_shards"),  # ~540 records cannot fill 1000 shards
    ("data.heldout_fraction=1.5", "data.heldout_fraction"),
    ("partition.num_shards=0", "partition.num_shards"),
])
def test_bad_input_names_the_field_and_writes_nothing(tmp_path, source, capsys, override, field):
    assert stage("partition", tmp_path / "run", source, override) == 2
    assert field in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_run_dir_is_required(source, capsys):
    from tests.stages.helpers import dpsynth, settings

    assert dpsynth("partition", *settings(source)) == 2
    assert "pipeline.run_dir" in capsys.readouterr().err


def test_train_split_restricts_the_source(tmp_path, mnist600):
    splits = ["a" if i % 2 else "b" for i in range(len(mnist600))]
    src = tmp_path / "split.parquet"
    write_parquet(dataclasses.replace(mnist600, splits=splits), src)
    run = tmp_path / "run"
    assert stage("partition", run, str(src), "data.train_split=a", "data.heldout_fraction=0") == 0
    m = manifest(run, "sensitive", "partition")
    assert [o["rows"] for o in m["outputs"]] == [300] and m["outputs"][0]["role"] == "shard"


def test_doctests():
    import doctest

    from dpsynth.stages import partition

    assert doctest.testmod(partition).failed == 0
