"""``dpsynth data import`` from object storage (#55): every source kind read from s3:// on a real moto_server."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dpsynth import storage
from dpsynth.data import import_source, read_parquet
from dpsynth.errors import DatasetError

from .conftest import MNIST_DIR

REPO = Path(__file__).resolve().parents[2]


def _upload_tree(local: Path, uri: str) -> None:
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        storage.copy(path, storage.join(uri, path.relative_to(local).as_posix()))


def test_the_cli_imports_an_idx_prefix_from_s3_and_writes_to_s3(s3_bucket, mnist):
    """The command an import DAG runs, as a subprocess: exit 0, the Parquet on S3 equals the local import."""
    raw, dst = f"s3://{s3_bucket}/raw/mnist", f"s3://{s3_bucket}/data/mnist.parquet"
    _upload_tree(MNIST_DIR, raw)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "components"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "dpsynth", "data", "import", raw + "/", dst, "--outside", "--json"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"uri": dst, "shape": [28, 28, 1]}
    imported = read_parquet(dst)
    assert imported.content_sha256() == mnist.content_sha256()
    assert imported.record_ids[:2] == ["t10k:00000", "t10k:00001"]


def test_npz_parquet_and_image_folder_objects(s3_bucket, tmp_path, tiny):
    np.savez(tmp_path / "set.npz", x=np.zeros((3, 4, 4), np.uint8), y=np.array([0, 1, 1]))
    storage.copy(tmp_path / "set.npz", f"s3://{s3_bucket}/in/set.npz")
    ds = import_source(f"s3://{s3_bucket}/in/set.npz")
    assert len(ds) == 3 and ds.record_ids[0] == "set:00000" and ds.source == f"NPZ s3://{s3_bucket}/in/set.npz"

    from dpsynth.data import write_parquet

    write_parquet(tiny, f"s3://{s3_bucket}/in/tiny.parquet")
    assert import_source(f"s3://{s3_bucket}/in/tiny.parquet").content_sha256() == tiny.content_sha256()

    for label, name in enumerate(("cat", "dog")):
        (tmp_path / "folder" / name).mkdir(parents=True)
        Image.fromarray(np.full((5, 5), 40 * label, np.uint8), "L").save(tmp_path / "folder" / name / "a.png")
    _upload_tree(tmp_path / "folder", f"s3://{s3_bucket}/in/folder")
    ds = import_source(f"s3://{s3_bucket}/in/folder")
    assert ds.record_ids == ["cat/a.png", "dog/a.png"] and ds.num_classes == 2
    assert f"s3://{s3_bucket}/in/folder" in ds.source and "/tmp" not in ds.source


def test_a_missing_source_is_a_dataset_error_naming_it(s3_bucket):
    with pytest.raises(DatasetError, match=f"source: s3://{s3_bucket}/nothing/here does not exist"):
        import_source(f"s3://{s3_bucket}/nothing/here")
