"""The sample screen (#51 item 5): a planted noise patch is dropped, real-looking samples are kept, and the rule
reads nothing but the released samples."""

import ast
import inspect
import sys
from pathlib import Path

import numpy as np
import pytest

from dpsynth.data import ImageDataset
from dpsynth.evaluation import screen

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import datasets  # noqa: E402  (the procedural sets, drawn by code)


def released(images: np.ndarray, labels: np.ndarray, k: int) -> ImageDataset:
    return ImageDataset(record_ids=[f"synthetic:{i:07d}" for i in range(len(labels))], labels=labels, images=images,
                        splits=None, num_classes=k, source="test")


def drawn(name: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    role, draw, classes = datasets.DATASETS[name]
    rng = np.random.default_rng(7)
    labels = np.arange(n) % len(classes)
    images = np.stack([draw(rng, int(y)) for y in labels])
    return (images if images.ndim == 4 else images[..., None]), labels


@pytest.mark.parametrize("name", ["shapes", "letters-rgb", "symbols-rgb"])
def test_planted_noise_is_dropped_and_images_kept(name):
    images, labels = drawn(name, 60)
    rng = np.random.default_rng(0)
    planted = np.arange(3, 60, 7)  # one sample in seven: a patch of noise (uniform, or Gaussian about grey)
    images[planted[::2]] = rng.integers(0, 256, images[planted[::2]].shape, dtype=np.uint8)
    images[planted[1::2]] = np.clip(rng.normal(128, 60, images[planted[1::2]].shape), 0, 255).astype(np.uint8)
    kept, screened = screen.screen(released(images, labels, len(datasets.DATASETS[name][2])),
                                   min_correlation=screen.DEFAULT)
    assert screened["dropped"] == len(planted)
    assert sorted(set(range(60)) - {int(r.split(":")[1]) for r in kept.record_ids}) == planted.tolist()
    assert (kept.labels == np.delete(labels, planted)).all()


def test_flat_and_smooth_samples_are_kept_and_null_keeps_all():
    flat = np.full((2, 8, 8, 1), 90, np.uint8)
    noise = np.random.default_rng(1).integers(0, 256, (2, 8, 8, 1), dtype=np.uint8)
    ds = released(np.concatenate([flat, noise]), np.array([0, 1, 0, 1]), 2)
    assert screen.screen(ds, min_correlation=0.35)[1]["dropped"] == 2
    mostly_noise = released(np.concatenate([flat[:1], noise]), np.array([0, 1, 0]), 2)
    kept, screened = screen.screen(mostly_noise, min_correlation=0.35)  # the generator makes noise: shown, not hidden
    assert kept is mostly_noise and screened["dropped"] == 0 and screened["flagged"] == 2
    kept, screened = screen.screen(ds, min_correlation=None)
    assert kept is ds and screened["dropped"] == 0
    assert screen.neighbour_correlation(flat).tolist() == [1.0, 1.0]


def test_the_rule_reads_the_released_samples_only():
    """Its inputs are the released samples and a number; the module reads no file, no record, no statistic."""
    assert list(inspect.signature(screen.screen).parameters) == ["synthetic", "min_correlation"]
    assert list(inspect.signature(screen.neighbour_correlation).parameters) == ["images"]
    tree = ast.parse(Path(screen.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "numpy", "torch", "dpsynth.data", "dpsynth.grids"}
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not names & {"read_parquet", "storage", "open", "manifest"}


def test_the_sample_stage_screens_before_it_writes():
    """In the sample stage the screen takes the synthesized samples, and the parquet and grid are written after."""
    from dpsynth.stages import sample

    src = inspect.getsource(sample.run)
    call = src.index("screen.screen(synthetic, min_correlation=cfg.sample.screen)")
    assert call < src.index("write_parquet(") and call < src.index("grid.save(")
    assert src.index("synthesize(generator") < call
