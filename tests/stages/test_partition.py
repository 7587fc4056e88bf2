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
    assert m["inputs"][0]["content_sha256"] == mnist600.content_sha256()  # the raw hash: sensitive manifest only
    # outside the sensitive zone the dataset is named by HMAC-SHA256(key in the sensitive zone, content sha256)
    key = (run / "sensitive" / "dataset-version.key").read_bytes()
    assert len(key) == 32
    assert m["dataset_sha256"] == hmac.new(key, mnist600.content_sha256().encode(), hashlib.sha256).hexdigest()
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


def test_public_fraction_is_a_keyed_hash_band_outside_every_shard(tmp_path, source, mnist600):
    run = tmp_path / "run"
    assert stage("partition", run, source, "partition.num_shards=2", "data.public_fraction=0.2",
                 "data.public_fraction_unprotected=true") == 0
    m = manifest(run, "sensitive", "partition")
    assert sorted(o["role"] for o in m["outputs"]) == ["heldout", "public", "shard", "shard"]
    ids = {o["role"] + Path(o["uri"]).stem: set(read_parquet(o["uri"]).record_ids) for o in m["outputs"]}
    public = ids.pop("publicpublic")
    for rid in mnist600.record_ids:  # the spec: u < 0.1 held out; 0.1 <= u < 0.3 public; else shard by the next 8 bytes
        u = int.from_bytes(hmac.new(KEY.encode(), rid.encode(), hashlib.sha256).digest()[:8], "big") / 2**64
        assert (rid in public) == (0.1 <= u < 0.3)
    assert all(not (public & other) for other in ids.values())
    assert set().union(public, *ids.values()) == set(mnist600.record_ids)
    assert 80 <= len(public) <= 160  # Binomial(600, 0.2): mean 120, sd 9.8
    assert m["details"]["public_records"] == len(public)
    # declaring public data moves records out of shards only: the held-out set is unchanged
    run0 = tmp_path / "run0"
    assert stage("partition", run0, source, "partition.num_shards=2") == 0
    held0 = next(o for o in manifest(run0, "sensitive", "partition")["outputs"] if o["role"] == "heldout")
    assert set(read_parquet(held0["uri"]).record_ids) == ids["heldoutheldout"]


def test_public_split_is_taken_whole_and_never_trained_on(tmp_path, mnist600):
    splits = ["pub" if i % 10 == 0 else "train" for i in range(len(mnist600))]
    src = tmp_path / "split.parquet"
    write_parquet(dataclasses.replace(mnist600, splits=splits), src)
    run = tmp_path / "run"
    assert stage("partition", run, str(src), "data.public_split=pub", "data.heldout_fraction=0") == 0
    m = manifest(run, "sensitive", "partition")
    by_role = {o["role"]: o for o in m["outputs"]}
    assert sorted(by_role) == ["public", "shard"] and by_role["public"]["rows"] == 60 and by_role["shard"]["rows"] == 540
    assert set(read_parquet(by_role["public"]["uri"]).splits) == {"pub"}
    assert set(read_parquet(by_role["shard"]["uri"]).splits) == {"train"}


@pytest.mark.parametrize("override, field", [
    ("data.public_fraction=0.95", "data.public_fraction"),  # with the held-out 0.1, over 1
    ("data.public_split=x", "data.public_split"),  # the source has no split column
])
def test_bad_public_declarations_name_the_field(tmp_path, source, capsys, override, field):
    assert stage("partition", tmp_path / "run", source, override) == 2
    assert field in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_sensitive_slice_is_refused_as_public_without_acknowledgement(tmp_path, source, capsys):
    assert stage("partition", tmp_path / "run", source, "data.public_fraction=0.2") == 2
    err = capsys.readouterr().err
    assert "data.public_fraction" in err and "data.public_fraction_unprotected=true" in err and "sklearn:digits" in err
    assert not (tmp_path / "run").exists()


def test_sklearn_digits_is_a_separate_public_source(tmp_path, source, mnist600):
    run = tmp_path / "run"
    assert stage("partition", run, source, "data.public_source=sklearn:digits") == 0
    m = manifest(run, "sensitive", "partition")
    (public,) = [o for o in m["outputs"] if o["role"] == "public"]
    ds = read_parquet(public["uri"])
    from sklearn.datasets import load_digits

    ref = load_digits()  # scikit-learn's bundled 1,797 digits, independent of dpsynth
    assert public["rows"] == len(ds) == len(ref.target) == 1797 and ds.shape == (28, 28, 1)
    assert sorted(ds.labels.tolist()) == sorted(ref.target.tolist()) and ds.images.max() == 255
    i = ds.record_ids.index("sklearn-digits-0000")  # the first digit, a 0: dark centre, bright ring, black border
    img = ds.images[i, :, :, 0]
    assert ds.labels[i] == ref.target[0] == 0 and img[:4].max() == 0 and img[:, :4].max() == 0
    assert img[14, 14] < 100 < img[6:22, 6:22].max()
    training = sum(o["rows"] for o in m["outputs"] if o["role"] in ("shard", "heldout"))
    assert training == len(mnist600)  # no sensitive record became public
    assert stage("partition", tmp_path / "r2", source, "data.public_source=sklearn:digits",
                 "data.public_fraction=0.1", "data.public_fraction_unprotected=true") == 2


def test_public_split_cannot_be_the_training_split():
    from dpsynth.config import load_config
    from dpsynth.errors import ConfigError

    with pytest.raises(ConfigError, match="data.public_split"):
        load_config(overrides=["data.train_split=train", "data.public_split=train"])
    with pytest.raises(ConfigError, match="data.public_split"):
        load_config(overrides=["data.public_fraction=0.1", "data.public_split=pub"])
