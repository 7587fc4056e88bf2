"""The canonical on-disk dataset: one Parquet file, one row per image.

Columns (none nullable except ``split``):

=============  =======  =====================================================
column         type     meaning
=============  =======  =====================================================
``record_id``  string   stable, unique id (e.g. ``"t10k:00017"``); shards and
                        neighbouring datasets are defined by it
``label``      int32    class index in ``[0, num_classes - 1]``
``image``      binary   uint8 pixels, row-major H×W×C, exactly H*W*C bytes
``height``     int32    H, the same for every row
``width``      int32    W, the same for every row
``channels``   int32    C (1 grey, 3 RGB, 4 RGBA), the same for every row
``split``      string   ``"train"``, ``"test"``, ``"public"``... or null
=============  =======  =====================================================

File key-value metadata (all values are UTF-8 strings):

- ``dpsynth.schema_version``: ``"1"``
- ``dpsynth.num_classes``: the number of classes, as a decimal integer
- ``dpsynth.content_sha256``: :meth:`ImageDataset.content_sha256` of the rows
- ``dpsynth.source``: free-text provenance (what was imported, from where)
"""

from __future__ import annotations

import pyarrow as pa

from dpsynth.errors import DatasetError

SCHEMA_VERSION = "1"

KEY_SCHEMA_VERSION = "dpsynth.schema_version"
KEY_NUM_CLASSES = "dpsynth.num_classes"
KEY_CONTENT_SHA256 = "dpsynth.content_sha256"
KEY_SOURCE = "dpsynth.source"

SCHEMA = pa.schema(
    [
        pa.field("record_id", pa.string(), nullable=False),
        pa.field("label", pa.int32(), nullable=False),
        pa.field("image", pa.binary(), nullable=False),
        pa.field("height", pa.int32(), nullable=False),
        pa.field("width", pa.int32(), nullable=False),
        pa.field("channels", pa.int32(), nullable=False),
        pa.field("split", pa.string(), nullable=True),
    ]
)


def make_metadata(*, num_classes: int, content_sha256: str, source: str) -> dict[str, str]:
    return {
        KEY_SCHEMA_VERSION: SCHEMA_VERSION,
        KEY_NUM_CLASSES: str(int(num_classes)),
        KEY_CONTENT_SHA256: content_sha256,
        KEY_SOURCE: source,
    }


def parse_metadata(metadata: dict[bytes, bytes] | None, *, where: str) -> tuple[int, str, str]:
    """Return ``(num_classes, content_sha256, source)`` from a file's metadata, or raise DatasetError."""
    meta = {k.decode(): v.decode() for k, v in (metadata or {}).items()}
    for key in (KEY_SCHEMA_VERSION, KEY_NUM_CLASSES, KEY_CONTENT_SHA256):
        if key not in meta:
            raise DatasetError(f"{key}: missing from the metadata of {where} (not a dpsynth dataset?)")
    if meta[KEY_SCHEMA_VERSION] != SCHEMA_VERSION:
        raise DatasetError(
            f"{KEY_SCHEMA_VERSION}: {where} has version {meta[KEY_SCHEMA_VERSION]!r}; "
            f"this dpsynth reads version {SCHEMA_VERSION!r}"
        )
    try:
        num_classes = int(meta[KEY_NUM_CLASSES])
    except ValueError:
        raise DatasetError(f"{KEY_NUM_CLASSES}: {meta[KEY_NUM_CLASSES]!r} in {where} is not an integer") from None
    return num_classes, meta[KEY_CONTENT_SHA256], meta.get(KEY_SOURCE, "")
