"""The generality benchmark's image sets (benchmarks/datasets.py, #32): every set draws the same pixels from the
same seed, in its declared mode and size, one folder per class, and says its role."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

_spec = importlib.util.spec_from_file_location(
    "generality_datasets", Path(__file__).resolve().parents[1] / "benchmarks" / "datasets.py")
datasets = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(datasets)

SHAPES = {"letters": (28, 28), "shapes": (32, 32), "shapes-rgb": (32, 32, 3), "letters-rgb": (32, 32, 3),
          "symbols-rgb": (32, 32, 3), "symbols": (32, 32), "greek": (28, 28), "mnist-photo": (32, 32, 3), "letters-texture": (32, 32, 3)}


def test_every_set_is_listed_with_its_size_and_at_least_one_of_each_role():
    assert set(datasets.DATASETS) == set(SHAPES)
    roles = {role for role, _, _ in datasets.DATASETS.values()}
    assert roles == {datasets.DEVELOPMENT, datasets.CONFIRMATION}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_a_set_draws_the_same_pixels_from_the_same_seed_in_its_declared_shape(tmp_path, name):
    a = datasets.write_folder(name, tmp_path / "a", n=24, seed=3)
    b = datasets.write_folder(name, tmp_path / "b", n=24, seed=3)
    c = datasets.write_folder(name, tmp_path / "c", n=24, seed=4)
    assert a["pixels_sha256"] == b["pixels_sha256"] != c["pixels_sha256"]
    assert tuple(a["shape"]) == SHAPES[name] and a["role"] == datasets.DATASETS[name][0]
    folders = sorted((tmp_path / "a").iterdir())
    assert len(folders) == len(a["classes"]) and sum(len(list(f.glob("*.png"))) for f in folders) == 24
    img = np.asarray(Image.open(next(folders[0].glob("*.png"))))
    assert img.shape == SHAPES[name] and img.std() > 5  # not blank
