"""The canonical dataset format: labelled uint8 images in one Parquet file, importers and validation.

The names below are imported on first use (PEP 562), so ``dpsynth.data.cli`` can register its
sub-commands without loading NumPy and pyarrow.
"""

from dpsynth.lazy import attributes

_WHERE = {"ImageDataset": "dataset", "read_parquet": "dataset", "write_parquet": "dataset",
          "import_source": "importers", "validate": "validation"}

__all__ = ["ImageDataset", "import_source", "read_parquet", "validate", "write_parquet"]


__getattr__ = attributes(__name__, _WHERE)
