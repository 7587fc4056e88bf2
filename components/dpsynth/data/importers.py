"""Turn raw sources (IDX, NPZ, image folders, Parquet) into a validated ImageDataset."""

from __future__ import annotations

import dataclasses
import gzip
import os
import re
import zipfile
import zlib
from pathlib import Path

import numpy as np

from dpsynth import storage
from dpsynth.data.dataset import ImageDataset, read_parquet
from dpsynth.data.validation import validate
from dpsynth.egress import refusal
from dpsynth.errors import DatasetError

IDX_IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions (N, H, W)
IDX_LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dimension (N)
_IDX_IMAGES_NAME = re.compile(r"^(?P<stem>.+)-images[-.]idx3-ubyte(?:\.gz)?$")
_IDX_SPLITS = {"train": "train", "t10k": "test", "test": "test"}
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg"}
_MODE_CHANNELS = {"L": 1, "RGB": 3, "RGBA": 4}


def import_source(src: str | os.PathLike, *, num_classes: int | None = None, split: str | None = None) -> ImageDataset:
    """Import ``src``, whichever of these it is:

    - a directory of IDX pairs ``STEM-images-idx3-ubyte[.gz]`` + ``STEM-labels-idx1-ubyte[.gz]``
      (several pairs, e.g. MNIST's train and t10k, are imported together with splits
      ``"train"``/``"test"``; record ids start with the stem, so they stay unique);
    - an ``.npz`` file (see :func:`import_npz`);
    - a directory of class subfolders of PNG/JPEG images (see :func:`import_image_folder`);
    - a canonical ``.parquet`` file.

    ``src`` is a local path or an object-store URI (``s3://``, ``gs://``, ``abfs://``): a file, or a
    prefix standing for a directory.

    ``num_classes`` overrides (and is checked against) the labels; ``split`` sets every
    record's split, replacing any the source implies.
    """
    with storage.local_input(src) as path:  # an object store's file or prefix: a temporary local copy
        ds = _import_path(path, src)
        if storage.is_remote(src):
            ds = dataclasses.replace(ds, source=ds.source.replace(str(path.resolve()), str(src).rstrip("/")))
    if num_classes is not None:
        ds = dataclasses.replace(ds, num_classes=num_classes)
    if split is not None:
        ds = dataclasses.replace(ds, splits=[split] * len(ds))
    validate(ds, num_classes=num_classes)
    return ds


def _import_path(path: Path, src: str | os.PathLike) -> ImageDataset:
    if path.is_dir():
        return import_idx_dir(path) if _idx_image_files(path) else import_image_folder(path)
    if path.is_file() and path.suffix.lower() == ".npz":
        return import_npz(path)
    if path.is_file() and path.suffix.lower() == ".parquet":
        return read_parquet(path)
    if not path.exists():
        raise DatasetError(f"source: {src} does not exist")
    raise DatasetError(f"source: {src} is not an IDX directory, an .npz file, an image folder or a .parquet file")


# --- IDX (MNIST / Fashion-MNIST) ------------------------------------------------------------


def import_idx(images_path: str | os.PathLike, labels_path: str | os.PathLike) -> ImageDataset:
    """One IDX pair, gzipped or not; record ids are ``"{stem}:{index:05d}"`` (e.g. ``t10k:00017``)."""
    images_path, labels_path = Path(images_path), Path(labels_path)
    images = _read_idx(images_path, magic=IDX_IMAGES_MAGIC, what="image")
    labels = _read_idx(labels_path, magic=IDX_LABELS_MAGIC, what="label")
    if len(labels) != len(images):
        raise DatasetError(
            f"label: {labels_path.name} holds {len(labels)} labels but {images_path.name} holds {len(images)} images"
        )
    stem = idx_stem(images_path)
    labels = labels.astype(np.int64)
    ds = ImageDataset(
        record_ids=[f"{stem}:{i:05d}" for i in range(len(images))],
        labels=labels,
        images=images[..., np.newaxis],
        splits=None,
        num_classes=int(labels.max()) + 1 if len(labels) else 1,
        source=f"IDX {images_path.resolve()} + {labels_path.name}",
    )
    validate(ds)
    return ds


def import_idx_dir(path: str | os.PathLike) -> ImageDataset:
    """Every IDX pair in a directory; with several pairs, each record's split is named by its stem."""
    path = Path(path)
    pairs = [(image_file, _idx_labels_file(image_file)) for image_file in _idx_image_files(path)]
    if not pairs:
        raise DatasetError(f"source: no *-images-idx3-ubyte[.gz] files in {path}")
    parts = [import_idx(images, labels) for images, labels in pairs]
    if len(parts) > 1:
        parts = [
            dataclasses.replace(part, splits=[_IDX_SPLITS.get(idx_stem(images), idx_stem(images))] * len(part))
            for part, (images, _) in zip(parts, pairs)
        ]
    files = ", ".join(f"{images.name} + {labels.name}" for images, labels in pairs)
    ds = _concat(parts, source=f"IDX directory {path.resolve()}: {files}")
    validate(ds)
    return ds


def idx_stem(images_path: str | os.PathLike) -> str:
    """``t10k`` for ``t10k-images-idx3-ubyte.gz``; the name up to its first dot otherwise."""
    name = Path(images_path).name
    match = _IDX_IMAGES_NAME.match(name)
    return match["stem"] if match else name.split(".")[0]


def _idx_image_files(path: Path) -> list[Path]:
    files = sorted(p for p in path.iterdir() if p.is_file() and _IDX_IMAGES_NAME.match(p.name))
    stems = [idx_stem(p) for p in files]
    for stem in stems:
        if stems.count(stem) > 1:
            clash = [p.name for p in files if idx_stem(p) == stem]
            raise DatasetError(f"source: {path} holds several image files for {stem!r}: {clash}")
    return files


def _idx_labels_file(images_path: Path) -> Path:
    stem = idx_stem(images_path)
    names = [f"{stem}-labels{sep}idx1-ubyte{gz}" for sep in ("-", ".") for gz in ("", ".gz")]
    found = [images_path.with_name(n) for n in names if images_path.with_name(n).is_file()]
    if len(found) != 1:
        problem = "no" if not found else "several"
        raise DatasetError(
            f"label: {problem} labels file for {images_path.name} (looked for {stem}-labels-idx1-ubyte[.gz])"
        )
    return found[0]


def _read_idx(path: Path, *, magic: int, what: str) -> np.ndarray:
    """The uint8 array of an IDX file; ``what`` names the field in error messages."""
    try:
        data = storage.read_bytes(path)
    except OSError as exc:
        raise DatasetError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise DatasetError(f"{what}: {path.name} is a truncated or corrupt gzip file ({exc})") from None
    if len(data) < 4:
        raise DatasetError(f"{what}: {path.name} is truncated: {len(data)} bytes, too short for an IDX header")
    found = int.from_bytes(data[:4], "big")
    if found != magic:
        raise DatasetError(f"{what}: {path.name} has magic number 0x{found:08x}, expected 0x{magic:08x}")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DatasetError(f"{what}: {path.name} is truncated inside its header ({len(data)} of {header} bytes)")
    dims = [int.from_bytes(data[4 + 4 * k : 8 + 4 * k], "big") for k in range(ndim)]
    size = int(np.prod(dims))
    if len(data) - header != size:
        state = "truncated" if len(data) - header < size else "longer than its header says"
        raise DatasetError(
            f"{what}: {path.name} is {state}: dimensions {dims} need {size} bytes of data, found {len(data) - header}"
        )
    return np.frombuffer(data, np.uint8, count=size, offset=header).reshape(dims)


def _concat(parts: list[ImageDataset], *, source: str) -> ImageDataset:
    if len(parts) == 1:
        return dataclasses.replace(parts[0], source=source)
    shapes = {part.shape for part in parts}
    if len(shapes) > 1:
        raise DatasetError(f"image: the parts of {source} have different shapes {sorted(shapes)}")
    has_splits = any(part.splits is not None for part in parts)
    return ImageDataset(
        record_ids=[rid for part in parts for rid in part.record_ids],
        labels=np.concatenate([part.labels for part in parts]),
        images=np.concatenate([part.images for part in parts]),
        splits=[s for part in parts for s in (part.splits or [None] * len(part))] if has_splits else None,
        num_classes=max(part.num_classes for part in parts),
        source=source,
    )


# --- NPZ ------------------------------------------------------------------------------------


def import_npz(path: str | os.PathLike) -> ImageDataset:
    """An ``.npz`` with images under ``x`` or ``images``, labels under ``y`` or ``labels`` and,
    optionally, string ids under ``ids`` or ``record_ids`` (default ``"{stem}:{index:05d}"``).

    Images are N×H×W or N×H×W×C, either uint8 (or another integer type within [0, 255])
    or float within [0, 1] (scaled by 255) or [0, 255]; floats are rounded to the nearest integer.
    """
    path = Path(path)
    try:
        with np.load(storage.local_path(path), allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"file {path}: cannot be read as .npz ({exc})") from None
    images = _pick(arrays, ("x", "images"), path, field="image")
    labels = _pick(arrays, ("y", "labels"), path, field="label")
    ids = _pick(arrays, ("ids", "record_ids"), path, field="record_id", required=False)

    if images.ndim == 3:
        images = images[..., np.newaxis]
    if images.ndim != 4 or images.shape[-1] not in _MODE_CHANNELS.values():
        raise DatasetError(
            f"image: array in {path.name} has shape {images.shape}; expected N×H×W or N×H×W×C with C in 1, 3, 4"
        )
    n = len(images)
    if ids is None:
        record_ids = [f"{path.stem}:{i:05d}" for i in range(n)]
    elif ids.shape != (n,) or ids.dtype.kind not in "US":
        raise DatasetError(
            f"record_id: ids in {path.name} must be {n} strings, got {ids.dtype} array of shape {ids.shape}"
        )
    else:
        record_ids = [s.decode() if isinstance(s, bytes) else str(s) for s in ids.tolist()]
    if labels.shape != (n,):
        raise DatasetError(f"label: {path.name} has labels of shape {labels.shape} for {n} images; expected ({n},)")
    labels = _integer_labels(labels, record_ids)
    ds = ImageDataset(
        record_ids=record_ids,
        labels=labels,
        images=_uint8_images(images, record_ids),
        splits=None,
        num_classes=max(int(labels.max()) + 1, 1) if n else 1,
        source=f"NPZ {path.resolve()}",
    )
    validate(ds)
    return ds


def _pick(arrays: dict, keys: tuple[str, ...], path: Path, *, field: str, required: bool = True):
    present = [key for key in keys if key in arrays]
    if len(present) > 1:
        raise DatasetError(f"{field}: {path.name} has both {present[0]!r} and {present[1]!r}; keep one")
    if not present:
        if required:
            raise DatasetError(f"{field}: {path.name} has none of the keys {list(keys)} (found {sorted(arrays)})")
        return None
    return arrays[present[0]]


def _uint8_images(images: np.ndarray, ids: list[str]) -> np.ndarray:
    kind = images.dtype.kind
    if images.dtype == np.uint8:
        return images
    if kind not in "iuf":
        raise DatasetError(f"image: dtype {images.dtype} is not an integer or float type")
    per_record = images.reshape(len(images), -1)
    if kind == "f":
        finite = np.isfinite(per_record).all(axis=1)
        if not finite.all():
            raise DatasetError(refusal("image", "a record has a NaN or infinite pixel"))
    low, high = images.min(), images.max()
    if low < 0 or high > 255:
        raise DatasetError(refusal("image", "pixel values must lie in [0, 1] or [0, 255]; a record's do not"))
    if kind == "f":
        scale = 255.0 if high <= 1.0 else 1.0
        images = np.rint(images.astype(np.float64) * scale)
    return images.astype(np.uint8)


def _integer_labels(labels: np.ndarray, ids: list[str]) -> np.ndarray:
    """int64 labels; float labels are accepted only when every value is a whole number."""
    if labels.dtype.kind in "iu":
        return labels.astype(np.int64)
    if labels.dtype.kind != "f":
        raise DatasetError(f"label: dtype {labels.dtype} is not an integer type; labels must be class indices")
    whole = np.isfinite(labels) & (labels == np.round(labels))
    if not whole.all():
        raise DatasetError(refusal("label", "a record's label is not a whole number; labels must be class indices"))
    return labels.astype(np.int64)


# --- image folders ------------------------------------------------------------------------


def import_image_folder(path: str | os.PathLike) -> ImageDataset:
    """``path/CLASS/**/*.png|jpg|jpeg``: class names sorted give the label index; the record id
    is the file's path relative to ``path``. Every image must have one size and mode (L, RGB or RGBA).
    """
    from PIL import Image, UnidentifiedImageError

    root = Path(path)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DatasetError(f"source: {root} has no class subfolders (and no IDX files)")
    record_ids, labels, pixels = [], [], []
    first: tuple[str, tuple[int, int], str] | None = None
    for label, name in enumerate(classes):
        files = sorted(
            p for p in (root / name).rglob("*")
            if p.is_file() and p.suffix.lower() in _IMAGE_SUFFIXES and not p.name.startswith(".")
        )
        for file in files:
            rid = file.relative_to(root).as_posix()
            try:
                with Image.open(file) as img:
                    img.load()
                    size, mode = img.size, img.mode
                    array = np.asarray(img)
            except (UnidentifiedImageError, OSError) as exc:
                raise DatasetError(f"image: cannot decode file {rid!r} in {root} ({exc})") from None
            if mode not in _MODE_CHANNELS:
                raise DatasetError(f"image: file {rid!r} has mode {mode!r}; supported modes are L, RGB, RGBA")
            if first is None:
                first = (rid, size, mode)
            elif (size, mode) != first[1:]:
                raise DatasetError(
                    f"image: file {rid!r} is {size[0]}×{size[1]} {mode} but {first[0]!r} is "
                    f"{first[1][0]}×{first[1][1]} {first[2]}; every image must have one size and mode"
                )
            record_ids.append(rid)
            labels.append(label)
            pixels.append(array.reshape(size[1], size[0], _MODE_CHANNELS[mode]))
    if not pixels:
        raise DatasetError(f"dataset is empty: no .png/.jpg/.jpeg files under the class folders of {root}")
    ds = ImageDataset(
        record_ids=record_ids,
        labels=np.asarray(labels, np.int64),
        images=np.stack(pixels),
        splits=None,
        num_classes=len(classes),
        source=f"image folder {root.resolve()}; classes " + ", ".join(f"{i}={c}" for i, c in enumerate(classes)),
    )
    validate(ds)
    return ds
