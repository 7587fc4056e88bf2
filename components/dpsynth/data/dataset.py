"""An in-memory labelled image dataset and its canonical Parquet form (see ``schema``).

>>> import numpy as np
>>> ds = ImageDataset(record_ids=["b", "a"], labels=np.array([1, 0]),
...                   images=np.zeros((2, 2, 2, 1), np.uint8), splits=None, num_classes=2, source="doc")
>>> ds.subset([1, 0]).content_sha256() == ds.content_sha256()
True
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dpsynth import storage
from dpsynth.data import schema
from dpsynth.data.validation import validate, validate_table
from dpsynth.errors import DatasetError

_HASH_DOMAIN = b"dpsynth.content.v1\0"
# Rows per Arrow chunk are chosen so one chunk's pixel bytes stay well below binary()'s 2 GiB offset limit.
_CHUNK_BYTES = 1 << 28


@dataclass(frozen=True, eq=False)
class ImageDataset:
    """N labelled images of one shape.

    ``images`` is uint8 N×H×W×C; ``labels`` int64 of shape (N,); ``splits`` is None when
    no record belongs to a split. ``source`` is free-text provenance.
    """

    record_ids: list[str]
    labels: np.ndarray
    images: np.ndarray
    splits: list[str | None] | None
    num_classes: int
    source: str

    def __len__(self) -> int:
        return len(self.record_ids)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(H, W, C) of every image."""
        return tuple(int(d) for d in self.images.shape[1:])

    def content_sha256(self) -> str:
        """sha256 of the rows in record_id order: ids, labels, shapes, pixels and splits.

        Row order, ``num_classes`` and ``source`` do not enter the hash.
        """
        h = hashlib.sha256(_HASH_DOMAIN)
        images = np.ascontiguousarray(self.images)
        height, width, channels = images.shape[1:]
        splits = self.splits or [None] * len(self)
        for i in sorted(range(len(self)), key=self.record_ids.__getitem__):
            rid = self.record_ids[i].encode()
            h.update(struct.pack(">I", len(rid)) + rid)
            h.update(struct.pack(">qIII", int(self.labels[i]), height, width, channels))
            h.update(images[i])
            if splits[i] is None:
                h.update(b"\0")
            else:
                name = splits[i].encode()
                h.update(b"\1" + struct.pack(">I", len(name)) + name)
        return h.hexdigest()

    def subset(self, mask_or_indices) -> ImageDataset:
        """The records selected by a boolean mask of length N or by integer indices (in that order)."""
        index = np.asarray(mask_or_indices)
        if index.dtype == bool:
            if index.shape != (len(self),):
                raise DatasetError(f"subset: mask has shape {index.shape}, expected ({len(self)},)")
            index = np.flatnonzero(index)
        elif index.size == 0:
            index = index.astype(np.int64)
        elif index.dtype.kind not in "iu":
            raise DatasetError(f"subset: expected a boolean mask or integer indices, got dtype {index.dtype}")
        return dataclasses.replace(
            self,
            record_ids=[self.record_ids[i] for i in index],
            labels=self.labels[index],
            images=self.images[index],
            splits=None if self.splits is None else [self.splits[i] for i in index],
        )

    def to_tensors(self):
        """``(images, labels)`` as torch tensors: float32 N×C×H×W in [-1, 1], and int64 (N,)."""
        import torch

        x = np.ascontiguousarray(self.images.transpose(0, 3, 1, 2), dtype=np.float32)
        x /= 127.5
        x -= 1.0
        return torch.from_numpy(x), torch.from_numpy(np.asarray(self.labels, dtype=np.int64).copy())


def write_parquet(ds: ImageDataset, uri: str | os.PathLike) -> None:
    """Validate ``ds`` and write it atomically as canonical Parquet to ``uri``."""
    validate(ds)
    n = len(ds)
    height, width, channels = ds.shape

    def constant(value: int) -> pa.Array:
        return pa.array(np.full(n, value, np.int32))

    table = pa.Table.from_arrays(
        [
            pa.array(ds.record_ids, pa.string()),
            pa.array(np.asarray(ds.labels, np.int32)),
            _image_column(ds.images),
            constant(height),
            constant(width),
            constant(channels),
            pa.array(ds.splits if ds.splits is not None else [None] * n, pa.string()),
        ],
        schema=schema.SCHEMA,
    )
    metadata = schema.make_metadata(
        num_classes=ds.num_classes, content_sha256=ds.content_sha256(), source=ds.source
    )
    table = table.replace_schema_metadata(metadata)
    with storage.atomic_write(uri, "wb") as fh:
        pq.write_table(table, fh)


def read_parquet(uri: str | os.PathLike) -> ImageDataset:
    """Read and validate a canonical Parquet dataset; any problem is a DatasetError naming the file."""
    where = str(uri)
    if not storage.exists(uri):
        raise DatasetError(f"file {where}: does not exist")
    try:
        with storage.open_input(uri) as fh:
            table = pq.read_table(fh)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"file {where}: cannot be read as Parquet ({exc})") from None
    num_classes, stored_sha, source = schema.parse_metadata(table.schema.metadata, where=where)
    table = _cast_to_schema(table, where=where)
    shape = validate_table(table, where=where)
    splits = table.column("split").to_pylist()
    ds = ImageDataset(
        record_ids=table.column("record_id").to_pylist(),
        labels=table.column("label").to_numpy().astype(np.int64),
        images=_decode_images(table.column("image"), shape),
        splits=None if all(s is None for s in splits) else splits,
        num_classes=num_classes,
        source=source,
    )
    validate(ds, num_classes=num_classes)
    actual_sha = ds.content_sha256()
    if actual_sha != stored_sha:
        raise DatasetError(
            f"{schema.KEY_CONTENT_SHA256}: {where} stores {stored_sha} but its rows hash to {actual_sha}"
        )
    return ds


def _cast_to_schema(table: pa.Table, *, where: str) -> pa.Table:
    columns = []
    for field in schema.SCHEMA:
        if field.name not in table.column_names:
            raise DatasetError(f"{field.name}: column missing from {where}")
        col = table.column(field.name)
        try:
            columns.append(col.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise DatasetError(
                f"{field.name}: column of type {col.type} in {where} cannot be read as {field.type} ({exc})"
            ) from None
    return pa.Table.from_arrays(columns, names=schema.SCHEMA.names)


def _image_column(images: np.ndarray) -> pa.ChunkedArray:
    n = len(images)
    flat = images.reshape(n, -1)
    row_bytes = flat.shape[1]
    rows_per_chunk = max(1, _CHUNK_BYTES // row_bytes)
    chunks = []
    for start in range(0, n, rows_per_chunk):
        block = np.ascontiguousarray(flat[start : start + rows_per_chunk])
        offsets = np.arange(len(block) + 1, dtype=np.int32) * row_bytes
        buffers = [None, pa.py_buffer(offsets), pa.py_buffer(block)]
        chunks.append(pa.Array.from_buffers(pa.binary(), len(block), buffers))
    return pa.chunked_array(chunks, pa.binary())


def _decode_images(column: pa.ChunkedArray, shape: tuple[int, int, int]) -> np.ndarray:
    """Pixels of a validated image column (every value exactly H*W*C bytes) as N×H×W×C uint8."""
    out = np.empty((len(column), *shape), np.uint8)
    flat = out.reshape(len(column), -1)
    row = 0
    for chunk in column.chunks:
        if len(chunk) == 0:
            continue
        _, offsets_buf, data_buf = chunk.buffers()
        offsets = np.frombuffer(offsets_buf, np.int32)[chunk.offset : chunk.offset + len(chunk) + 1]
        data = np.frombuffer(data_buf, np.uint8)[offsets[0] : offsets[-1]]
        flat[row : row + len(chunk)] = data.reshape(len(chunk), -1)
        row += len(chunk)
    return out
