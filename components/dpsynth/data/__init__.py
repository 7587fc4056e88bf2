"""The canonical dataset format: labelled uint8 images in one Parquet file, importers and validation.

The names below are imported on first use (PEP 562), so ``dpsynth.data.cli`` can register its
sub-commands without loading NumPy and pyarrow.
"""

import importlib

_WHERE = {"ImageDataset": "dataset", "read_parquet": "dataset", "write_parquet": "dataset",
          "import_source": "importers", "validate": "validation"}

__all__ = ["ImageDataset", "import_source", "read_parquet", "validate", "write_parquet"]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
