"""The rules a dataset must satisfy. Each failure is a DatasetError naming the field and the check that failed —
never a value read from the data (a record id, a label, a count the data declares): these messages reach the
orchestrators' logs (:func:`dpsynth.egress.refusal`; issue #52 item 3)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpsynth.egress import refusal
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
        for split in ds.splits:
            if split is not None and (not isinstance(split, str) or not split):
                raise DatasetError(refusal("split", "a record's split is not a non-empty string or None"))
    if not isinstance(ds.source, str):
        raise DatasetError(f"source: expected a string, got {type(ds.source).__name__}")


def _check_record_ids(ids: list[str], n: int) -> None:
    if len(ids) != n:
        raise DatasetError(refusal("record_id", "not one id per image"))
    seen: dict[str, int] = {}
    for i, rid in enumerate(ids):
        if not isinstance(rid, str) or not rid:
            raise DatasetError(refusal("record_id", "a record's id is not a non-empty string"))
        if rid in seen:
            raise DatasetError(refusal("record_id", "two records share an id; ids must be unique"))
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
    if ((labels < 0) | (labels >= k)).any():
        raise DatasetError(refusal("label", f"a record's label lies outside the label set [0, {k - 1}]"))
    if declared != k:
        raise DatasetError(refusal("num_classes", f"{k} required, but the dataset declares another class count"))


def _is_positive_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1


def validate_table(table: pa.Table, *, where: str) -> tuple[int, int, int]:
    """Check a table already cast to the canonical schema; return the common ``(H, W, C)``."""
    for name in ("record_id", "label", "image", "height", "width", "channels"):
        col = table.column(name)
        if col.null_count:
            raise DatasetError(refusal(f"{name} in {where}", "a record has no value"))
    if table.num_rows == 0:
        raise DatasetError(f"dataset is empty: {where} has no rows")
    shape = []
    for name in ("height", "width", "channels"):
        values = table.column(name).to_numpy()
        if ((values != values[0]) | (values < 1)).any():
            raise DatasetError(refusal(f"{name} in {where}", f"every image must share one positive {name}"))
        shape.append(int(values[0]))
    expected = shape[0] * shape[1] * shape[2]
    lengths = pc.binary_length(table.column("image")).to_numpy()
    if (lengths != expected).any():
        raise DatasetError(refusal(f"image in {where}", f"a record's image is not height*width*channels = "
                                                        f"{expected} bytes"))
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
                          "(10 for MNIST), not from the data")
    labels = np.asarray(ds.labels)
    if labels.dtype.kind in "iu" and ((labels < 0) | (labels >= num_classes)).any():
        raise ConfigError(refusal(field, f"{num_classes} classes, but a record's label lies outside [0, "
                                         f"{num_classes - 1}] (the label-set check; the record is not named: "
                                         "messages reach the orchestrators' logs)"))
    return dataclasses.replace(ds, num_classes=num_classes)
