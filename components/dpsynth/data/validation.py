"""The rules a dataset must satisfy. Each failure is a DatasetError naming the field and a record."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpsynth.errors import ConfigError, DatasetError

# ``ImageDataset`` in the annotations is dpsynth.data.dataset's, which imports this module (so this one does not).


def validate(ds: ImageDataset, *, num_classes: int | None = None) -> None:
    """Raise DatasetError unless ``ds`` is a well-formed, non-empty dataset.

    ``num_classes``, when given, is enforced: the dataset must declare that many classes
    and every label must lie in ``[0, num_classes - 1]``. Otherwise the dataset's own
    ``num_classes`` is used (importers set it to ``max(label) + 1`` unless told).
    """
    images, labels, ids = ds.images, ds.labels, ds.record_ids
    if not isinstance(images, np.ndarray) or images.ndim != 4 or images.dtype != np.uint8:
        is_array = isinstance(images, np.ndarray)
        got = f"{images.dtype} array of shape {images.shape}" if is_array else type(images).__name__
        raise DatasetError(f"image: expected a 4-D uint8 array N×H×W×C, got {got}")
    n = images.shape[0]
    if n == 0 or len(ids) == 0:
        raise DatasetError("dataset is empty: no records")
    if min(images.shape[1:]) < 1:
        raise DatasetError(f"image: every dimension of H×W×C must be positive, got {images.shape[1:]}")
    _check_record_ids(ids, n)
    _check_labels(labels, ids, n, ds.num_classes, num_classes)
    if ds.splits is not None:
        if len(ds.splits) != n:
            raise DatasetError(f"split: {len(ds.splits)} entries but {n} images")
        for rid, split in zip(ids, ds.splits):
            if split is not None and (not isinstance(split, str) or not split):
                raise DatasetError(f"split: {split!r} is not a non-empty string or None at record_id {rid!r}")
    if not isinstance(ds.source, str):
        raise DatasetError(f"source: expected a string, got {type(ds.source).__name__}")


def _check_record_ids(ids: list[str], n: int) -> None:
    if len(ids) != n:
        raise DatasetError(f"record_id: {len(ids)} ids but {n} images")
    seen: dict[str, int] = {}
    for i, rid in enumerate(ids):
        if not isinstance(rid, str) or not rid:
            raise DatasetError(f"record_id: {rid!r} at index {i} is not a non-empty string")
        if rid in seen:
            raise DatasetError(f"record_id: duplicate {rid!r} at indices {seen[rid]} and {i}")
        seen[rid] = i


def _check_labels(labels: np.ndarray, ids: list[str], n: int, declared: int, required: int | None) -> None:
    if not _is_positive_int(declared):
        raise DatasetError(f"num_classes: the dataset declares {declared!r}; expected a positive integer")
    if required is not None and not _is_positive_int(required):
        raise DatasetError(f"num_classes: {required!r} was required; expected a positive integer")
    k = declared if required is None else required
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu":
        raise DatasetError(f"label: dtype {labels.dtype} is not an integer type; labels must be class indices")
    if labels.shape != (n,):
        raise DatasetError(f"label: expected shape ({n},), got {labels.shape}")
    bad = np.flatnonzero((labels < 0) | (labels >= k))
    if bad.size:
        i = int(bad[0])
        raise DatasetError(f"label: values out of range [0, {k - 1}]: found {labels[i]} at record_id {ids[i]!r}")
    if declared != k:
        raise DatasetError(f"num_classes: {k} required but the dataset declares {declared}")


def _is_positive_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1


def validate_table(table: pa.Table, *, where: str) -> tuple[int, int, int]:
    """Check a table already cast to the canonical schema; return the common ``(H, W, C)``."""
    ids = table.column("record_id")
    for name in ("record_id", "label", "image", "height", "width", "channels"):
        col = table.column(name)
        if col.null_count:
            i = int(np.flatnonzero(pc.is_null(col).to_numpy(zero_copy_only=False))[0])
            raise DatasetError(f"{name}: null at row {i} (record_id {ids[i].as_py()!r}) in {where}")
    if table.num_rows == 0:
        raise DatasetError(f"dataset is empty: {where} has no rows")
    shape = []
    for name in ("height", "width", "channels"):
        values = table.column(name).to_numpy()
        odd = np.flatnonzero((values != values[0]) | (values < 1))
        if odd.size or values[0] < 1:
            i = int(odd[0]) if odd.size else 0
            raise DatasetError(
                f"{name}: {values[i]} at record_id {ids[i].as_py()!r} in {where}, "
                f"but every image must share one positive {name} (first row has {values[0]})"
            )
        shape.append(int(values[0]))
    expected = shape[0] * shape[1] * shape[2]
    lengths = pc.binary_length(table.column("image")).to_numpy()
    wrong = np.flatnonzero(lengths != expected)
    if wrong.size:
        i = int(wrong[0])
        raise DatasetError(
            f"image: {lengths[i]} bytes but height*width*channels = {expected} "
            f"at record_id {ids[i].as_py()!r} in {where}"
        )
    return shape[0], shape[1], shape[2]


def with_public_classes(ds: ImageDataset, num_classes: int | None, *, field: str = "data.num_classes") -> ImageDataset:
    """``ds`` declaring the public label set ``num_classes`` (``field`` of the config), never the one its labels
    suggest: an importer's max(label) + 1 changes when the only record of the top class is removed, and with it
    the generator's class embedding and the warm-up's per-class releases. ConfigError naming ``field`` when it is
    unset or a label lies outside [0, num_classes - 1]."""
    import dataclasses

    if num_classes is None:
        raise ConfigError(f"{field}: not set. The label set shapes the release (the generator's class embedding, the "
                          "warm-up's per-class releases) and is public: set it from what is known of the population "
                          f"(10 for MNIST), not from the data (this dataset declares {ds.num_classes})")
    labels = np.asarray(ds.labels)
    bad = np.flatnonzero((labels < 0) | (labels >= num_classes)) if labels.dtype.kind in "iu" else []
    if len(bad):
        i = int(bad[0])
        raise ConfigError(f"{field}: {num_classes} classes, but record_id {ds.record_ids[i]!r} has label {labels[i]} "
                          f"(labels must lie in [0, {num_classes - 1}])")
    return dataclasses.replace(ds, num_classes=num_classes)
