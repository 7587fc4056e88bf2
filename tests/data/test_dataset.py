import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpsynth.data import read_parquet, write_parquet
from dpsynth.errors import DatasetError


def _assert_same(a, b):
    assert a.record_ids == b.record_ids
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_array_equal(a.images, b.images)
    assert (a.splits, a.num_classes, a.source) == (b.splits, b.num_classes, b.source)
    assert a.labels.dtype == b.labels.dtype == np.int64 and a.images.dtype == b.images.dtype == np.uint8


def test_parquet_round_trip_preserves_mnist(mnist, tmp_path):
    write_parquet(mnist, tmp_path / "m.parquet")
    back = read_parquet(tmp_path / "m.parquet")
    _assert_same(back, mnist)
    assert back.content_sha256() == mnist.content_sha256()


def test_parquet_round_trip_preserves_splits_and_rgb(tiny, tmp_path):
    write_parquet(tiny, tmp_path / "t.parquet")
    _assert_same(read_parquet(tmp_path / "t.parquet"), tiny)


def test_parquet_file_follows_the_schema(tiny, tmp_path):
    write_parquet(tiny, tmp_path / "t.parquet")
    file_schema = pq.read_schema(tmp_path / "t.parquet")
    assert [(f.name, str(f.type), f.nullable) for f in file_schema] == [
        ("record_id", "string", False),
        ("label", "int32", False),
        ("image", "binary", False),
        ("height", "int32", False),
        ("width", "int32", False),
        ("channels", "int32", False),
        ("split", "string", True),
    ]
    meta = {k.decode(): v.decode() for k, v in file_schema.metadata.items()}
    assert meta["dpsynth.schema_version"] == "1"
    assert meta["dpsynth.num_classes"] == "3"
    assert meta["dpsynth.content_sha256"] == tiny.content_sha256()
    assert meta["dpsynth.source"] == "tiny test fixture"
    rows = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert rows[1]["record_id"] == "a" and rows[1]["image"] == tiny.images[1].tobytes()
    assert (rows[1]["height"], rows[1]["width"], rows[1]["channels"]) == (2, 3, 3)


def test_sha256_ignores_row_order(mnist):
    shuffled = mnist.subset(np.random.default_rng(0).permutation(len(mnist)))
    assert shuffled.record_ids != mnist.record_ids
    assert shuffled.content_sha256() == mnist.content_sha256()


def test_sha256_changes_with_any_content(tiny):
    pixels = tiny.images.copy()
    pixels[2, 1, 1, 0] ^= 1
    changed = [
        dataclasses.replace(tiny, images=pixels),
        dataclasses.replace(tiny, labels=np.array([0, 2, 1, 1])),
        dataclasses.replace(tiny, splits=["train", "test", None, None]),
        dataclasses.replace(tiny, record_ids=["d", "a", "c", "e"]),
        dataclasses.replace(tiny, images=tiny.images.reshape(4, 3, 2, 3)),
    ]
    hashes = {tiny.content_sha256()} | {ds.content_sha256() for ds in changed}
    assert len(hashes) == 1 + len(changed)
    assert dataclasses.replace(tiny, source="elsewhere", num_classes=7).content_sha256() == tiny.content_sha256()


def test_sha256_changes_when_one_mnist_pixel_changes(mnist):
    pixels = mnist.images.copy()
    pixels[1234, 5, 6, 0] += 1
    assert dataclasses.replace(mnist, images=pixels).content_sha256() != mnist.content_sha256()


def test_subset_by_mask_and_by_indices(tiny):
    by_mask = tiny.subset(np.array([True, False, True, False]))
    assert by_mask.record_ids == ["d", "c"] and by_mask.splits == ["train", None]
    by_index = tiny.subset([3, 0])
    assert by_index.record_ids == ["b", "d"] and by_index.labels.tolist() == [2, 0]
    np.testing.assert_array_equal(by_index.images[0], tiny.images[3])
    with pytest.raises(DatasetError, match="subset: mask has shape"):
        tiny.subset([True, False])


def test_to_tensors_is_nchw_in_minus_one_to_one(tiny):
    images, labels = tiny.to_tensors()
    assert tuple(images.shape) == (4, 3, 2, 3) and str(images.dtype) == "torch.float32"
    assert labels.tolist() == [0, 2, 1, 2] and str(labels.dtype) == "torch.int64"
    # channel c, row h, column w of record i is pixel (i, h, w, c)
    assert images[1, 2, 0, 1].item() == pytest.approx(tiny.images[1, 0, 1, 2] / 127.5 - 1)
    black, white = np.zeros((2, 3, 3), np.uint8), np.full((2, 3, 3), 255, np.uint8)
    extremes = dataclasses.replace(tiny, images=np.stack([black, white, black, white]))
    x, _ = extremes.to_tensors()
    assert x.min().item() == -1.0 and x.max().item() == 1.0


def test_corrupt_or_missing_parquet_names_the_file(mnist, tmp_path):
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"this is not parquet" * 10)
    with pytest.raises(DatasetError, match=r"garbage\.parquet"):
        read_parquet(garbage)
    write_parquet(mnist, tmp_path / "whole.parquet")
    cut = tmp_path / "cut.parquet"
    cut.write_bytes((tmp_path / "whole.parquet").read_bytes()[: 1 << 20])
    with pytest.raises(DatasetError, match=r"cut\.parquet"):
        read_parquet(cut)
    with pytest.raises(DatasetError, match=r"absent\.parquet"):
        read_parquet(tmp_path / "absent.parquet")


def _write_raw(path, rows, *, metadata):
    table = pa.Table.from_pylist(rows).replace_schema_metadata(metadata)
    pq.write_table(table, path)


def _row(rid, image, h=1, w=2, c=1):
    return {"record_id": rid, "label": 0, "image": image, "height": h, "width": w, "channels": c, "split": None}


GOOD_META = {"dpsynth.schema_version": "1", "dpsynth.num_classes": "1", "dpsynth.content_sha256": "0" * 64}


def test_image_bytes_must_match_height_width_channels(tmp_path):
    _write_raw(tmp_path / "s.parquet", [_row("ok", b"\0\0"), _row("short", b"\0")], metadata=GOOD_META)
    with pytest.raises(DatasetError, match=r"image in .*s.parquet: a record's image is not height\*width\*channels = 2 bytes$"):
        read_parquet(tmp_path / "s.parquet")


def test_missing_metadata_or_column_is_rejected(tmp_path):
    _write_raw(tmp_path / "m.parquet", [_row("a", b"\0\0")], metadata={})
    with pytest.raises(DatasetError, match=r"dpsynth.schema_version: missing .*m\.parquet"):
        read_parquet(tmp_path / "m.parquet")
    rows = [{k: v for k, v in _row("a", b"\0\0").items() if k != "width"}]
    _write_raw(tmp_path / "c.parquet", rows, metadata=GOOD_META)
    with pytest.raises(DatasetError, match=r"width: column missing"):
        read_parquet(tmp_path / "c.parquet")


def test_tampered_content_fails_the_stored_sha256(tiny, tmp_path):
    write_parquet(tiny, tmp_path / "t.parquet")
    table = pq.read_table(tmp_path / "t.parquet")
    labels = pa.array([1, 2, 1, 2], pa.int32())
    tampered = table.set_column(1, table.schema.field("label"), labels)
    pq.write_table(tampered, tmp_path / "t.parquet")
    with pytest.raises(DatasetError, match=r"dpsynth.content_sha256: .*t\.parquet stores"):
        read_parquet(tmp_path / "t.parquet")


def test_a_failed_write_leaves_nothing_behind(tiny, tmp_path, monkeypatch):
    def half_write(table, where, **kwargs):
        where.write(b"PAR1 partial")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", half_write)
    with pytest.raises(OSError, match="disk full"):
        write_parquet(tiny, tmp_path / "t.parquet")
    assert list(tmp_path.iterdir()) == []


def test_an_invalid_dataset_is_not_written(tiny, tmp_path):
    with pytest.raises(DatasetError, match="label"):
        write_parquet(dataclasses.replace(tiny, labels=np.array([0, 1, 2, 3])), tmp_path / "t.parquet")
    assert list(tmp_path.iterdir()) == []
