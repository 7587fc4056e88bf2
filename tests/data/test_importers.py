import gzip
import struct

import numpy as np
import pytest
from PIL import Image

from dpsynth.data import import_source, write_parquet
from dpsynth.data.importers import import_idx, import_image_folder, import_npz
from dpsynth.errors import DatasetError

from .conftest import MNIST_DIR

IMAGES_GZ = MNIST_DIR / "t10k-images-idx3-ubyte.gz"
LABELS_GZ = MNIST_DIR / "t10k-labels-idx1-ubyte.gz"
# Per-class counts of the MNIST test set, as published with the data set.
MNIST_T10K_CLASS_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def _raw(path):
    with gzip.open(path, "rb") as fh:
        return fh.read()


def _idx_bytes(magic, array):
    return struct.pack(f">I{array.ndim}I", magic, *array.shape) + array.astype(np.uint8).tobytes()


# --- IDX -----------------------------------------------------------------------------------


def test_mnist_test_set_has_10000_28x28x1_records_in_10_classes(mnist):
    assert len(mnist) == 10_000
    assert mnist.images.shape == (10_000, 28, 28, 1) and mnist.images.dtype == np.uint8
    assert mnist.labels.dtype == np.int64
    assert mnist.num_classes == 10
    assert np.bincount(mnist.labels).tolist() == MNIST_T10K_CLASS_COUNTS
    assert mnist.record_ids[17] == "t10k:00017"
    assert mnist.splits is None


def test_mnist_pixels_and_labels_match_an_independent_reader(mnist):
    images, labels = _raw(IMAGES_GZ), _raw(LABELS_GZ)
    assert struct.unpack_from(">IIII", images) == (0x803, 10_000, 28, 28)
    assert struct.unpack_from(">II", labels) == (0x801, 10_000)
    # A known label and pixel: record 17, row 14, column 14.
    (label_17,) = struct.unpack_from(">B", labels, 8 + 17)
    (pixel,) = struct.unpack_from(">B", images, 16 + 17 * 784 + 14 * 28 + 14)
    assert mnist.labels[17] == label_17
    assert mnist.images[17, 14, 14, 0] == pixel
    assert mnist.labels[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    np.testing.assert_array_equal(mnist.labels, np.frombuffer(labels, np.uint8, offset=8))
    np.testing.assert_array_equal(mnist.images[..., 0], np.frombuffer(images, np.uint8, offset=16).reshape(-1, 28, 28))


def test_ungzipped_idx_gives_the_same_dataset(mnist, tmp_path):
    # Named .gz although not gzipped: compression is detected by magic bytes, not the extension.
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(_raw(IMAGES_GZ))
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(_raw(LABELS_GZ))
    plain = import_source(tmp_path)
    assert plain.record_ids == mnist.record_ids
    np.testing.assert_array_equal(plain.images, mnist.images)
    assert plain.content_sha256() == mnist.content_sha256()


def test_train_and_t10k_pairs_import_together_with_splits(tmp_path):
    rng = np.random.default_rng(0)
    for stem, n in (("train", 6), ("t10k", 4)):
        (tmp_path / f"{stem}-images-idx3-ubyte").write_bytes(_idx_bytes(0x803, rng.integers(0, 256, (n, 5, 5))))
        (tmp_path / f"{stem}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(_idx_bytes(0x801, np.arange(n) % 3)))
    ds = import_source(tmp_path)
    assert len(ds) == 10 and len(set(ds.record_ids)) == 10
    assert sorted(ds.splits) == ["test"] * 4 + ["train"] * 6
    assert {rid.split(":")[0] for rid, s in zip(ds.record_ids, ds.splits) if s == "test"} == {"t10k"}
    assert ds.num_classes == 3


def test_truncated_idx_is_rejected(tmp_path):
    images = tmp_path / "t10k-images-idx3-ubyte"
    images.write_bytes(_raw(IMAGES_GZ)[:-100])
    with pytest.raises(DatasetError, match=r"image: .*truncated"):
        import_idx(images, LABELS_GZ)
    cut_gzip = tmp_path / "cut-images-idx3-ubyte.gz"
    cut_gzip.write_bytes(IMAGES_GZ.read_bytes()[:5000])
    with pytest.raises(DatasetError, match=r"image: .*truncated or corrupt gzip"):
        import_idx(cut_gzip, LABELS_GZ)


def test_wrong_magic_is_rejected():
    with pytest.raises(DatasetError, match=r"image: .*magic number 0x00000801, expected 0x00000803"):
        import_idx(LABELS_GZ, LABELS_GZ)


def test_label_count_mismatch_is_rejected(tmp_path):
    labels = tmp_path / "t10k-labels-idx1-ubyte"
    labels.write_bytes(_idx_bytes(0x801, np.frombuffer(_raw(LABELS_GZ), np.uint8, offset=8)[:9_999]))
    with pytest.raises(DatasetError, match=r"label: .*9999 labels .*10000 images"):
        import_idx(IMAGES_GZ, labels)


def test_idx_directory_without_labels_file_is_rejected(tmp_path):
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(IMAGES_GZ.read_bytes())
    with pytest.raises(DatasetError, match=r"label: no labels file"):
        import_source(tmp_path)


# --- NPZ -----------------------------------------------------------------------------------


def test_npz_uint8_nhw(tmp_path):
    x = np.random.default_rng(1).integers(0, 256, (5, 4, 3), dtype=np.uint8)
    np.savez(tmp_path / "d.npz", x=x, y=np.array([0, 1, 2, 1, 0]))
    ds = import_source(tmp_path / "d.npz")
    assert ds.images.shape == (5, 4, 3, 1)
    np.testing.assert_array_equal(ds.images[..., 0], x)
    assert ds.record_ids[3] == "d:00003" and ds.num_classes == 3


def test_npz_float_in_unit_interval_is_scaled_to_255(tmp_path):
    x = np.zeros((2, 2, 2, 3), np.float32)
    x[0, 0, 0] = [1.0, 0.5, 0.0]
    ids = np.array(["first", "second"])
    np.savez(tmp_path / "f.npz", images=x, labels=np.array([1.0, 0.0]), record_ids=ids)
    ds = import_npz(tmp_path / "f.npz")
    assert ds.images[0, 0, 0].tolist() == [255, 128, 0]
    assert ds.labels.tolist() == [1, 0] and ds.labels.dtype == np.int64
    assert ds.record_ids == ["first", "second"]


def test_npz_float_in_0_255_is_kept(tmp_path):
    np.savez(tmp_path / "f.npz", x=np.array([[[3.0, 254.6]]]), y=np.array([0]))
    assert import_npz(tmp_path / "f.npz").images[0, 0, :, 0].tolist() == [3, 255]


def test_npz_nan_images_are_rejected(tmp_path):
    x = np.zeros((3, 2, 2), np.float64)
    x[1, 1, 0] = np.nan
    np.savez(tmp_path / "n.npz", x=x, y=np.zeros(3, np.int64))
    with pytest.raises(DatasetError, match=r"image: a record has a NaN or infinite pixel$"):
        import_npz(tmp_path / "n.npz")


def test_npz_fractional_labels_are_rejected(tmp_path):
    np.savez(tmp_path / "l.npz", x=np.zeros((2, 2, 2), np.uint8), y=np.array([0.0, 0.5]))
    with pytest.raises(DatasetError, match=r"label: a record's label is not a whole number"):
        import_npz(tmp_path / "l.npz")


def test_npz_missing_key_is_rejected(tmp_path):
    np.savez(tmp_path / "k.npz", pixels=np.zeros((2, 2, 2), np.uint8), y=np.zeros(2, np.int64))
    with pytest.raises(DatasetError, match=r"image: .*none of the keys \['x', 'images'\]"):
        import_npz(tmp_path / "k.npz")


# --- image folders ----------------------------------------------------------------------------


def _png(path, array, mode):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array, mode=mode).save(path)


def test_image_folder_labels_follow_sorted_class_names(tmp_path):
    rng = np.random.default_rng(2)
    pixels = {f"{c}/{i}.png": rng.integers(0, 256, (3, 4, 3), dtype=np.uint8) for c in ("dog", "cat") for i in (0, 1)}
    for rid, array in pixels.items():
        _png(tmp_path / rid, array, "RGB")
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    ds = import_source(tmp_path)
    assert ds.num_classes == 2 and ds.images.shape == (4, 3, 4, 3)
    expected = {"cat/0.png": 0, "cat/1.png": 0, "dog/0.png": 1, "dog/1.png": 1}
    assert dict(zip(ds.record_ids, ds.labels.tolist())) == expected
    for i, rid in enumerate(ds.record_ids):
        np.testing.assert_array_equal(ds.images[i], pixels[rid])


def test_image_folder_with_mixed_sizes_names_the_offending_file(tmp_path):
    _png(tmp_path / "a" / "0.png", np.zeros((4, 4), np.uint8), "L")
    _png(tmp_path / "b" / "0.png", np.zeros((4, 5), np.uint8), "L")
    with pytest.raises(DatasetError, match=r"image: file 'b/0.png' is 5×4 L but 'a/0.png' is 4×4 L"):
        import_image_folder(tmp_path)


def test_image_folder_with_mixed_modes_is_rejected(tmp_path):
    _png(tmp_path / "a" / "0.png", np.zeros((4, 4), np.uint8), "L")
    _png(tmp_path / "a" / "1.png", np.zeros((4, 4, 3), np.uint8), "RGB")
    with pytest.raises(DatasetError, match=r"image: file 'a/1.png' is 4×4 RGB"):
        import_image_folder(tmp_path)


# --- dispatch ------------------------------------------------------------------------------


def test_parquet_source_is_read_back(tiny, tmp_path):
    write_parquet(tiny, tmp_path / "t.parquet")
    assert import_source(tmp_path / "t.parquet").content_sha256() == tiny.content_sha256()


def test_source_options_set_split_and_enforce_num_classes(mnist):
    ds = import_source(MNIST_DIR, split="public", num_classes=12)
    assert set(ds.splits) == {"public"} and ds.num_classes == 12
    with pytest.raises(DatasetError, match=r"label: a record's label lies outside the label set \[0, 4\]$"):
        import_source(MNIST_DIR, num_classes=5)


def test_unknown_or_missing_sources_are_rejected(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match="source: .*x.csv is not"):
        import_source(tmp_path / "x.csv")
    with pytest.raises(DatasetError, match="source: .*does not exist"):
        import_source(tmp_path / "nope")
    with pytest.raises(DatasetError, match="source: .*no class subfolders"):
        import_source(tmp_path)
