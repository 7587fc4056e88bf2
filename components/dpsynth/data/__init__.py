"""The canonical dataset format: labelled uint8 images in one Parquet file, importers and validation."""

from dpsynth.data.dataset import ImageDataset, read_parquet, write_parquet
from dpsynth.data.importers import import_source
from dpsynth.data.validation import validate

__all__ = ["ImageDataset", "import_source", "read_parquet", "validate", "write_parquet"]
