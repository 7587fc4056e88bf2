"""The noiseless probe of Private Evolution's feature (#51, docs/prior.md "A public segmenter"), development sets only.

Each of ``n`` records of a development set (``letters-texture`` or ``letters-rgb``, drawn as
``datasets.write_folder`` draws them, without writing) is mapped by a feature and labelled by its nearest (cosine)
candidate among the prior's masks of the set's ten capital letters, upright and centred, in the eight DejaVu fonts
(80 candidates, :func:`dpsynth.mechanisms.private_evolution.mask_features`); the probe is the share labelled
right. Features: ``plane`` (:func:`~dpsynth.mechanisms.private_evolution.figure_map`, the border-plane distance) and
``segmenter`` (:func:`~dpsynth.mechanisms.private_evolution.segmenter_map`, the public segmenter's predicted mask).

    OMP_NUM_THREADS=1 nice .venv/stage/bin/python benchmarks/segmenter_probe.py letters-texture letters-rgb
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import datasets  # noqa: E402

from dpsynth.mechanisms import private_evolution as pe  # noqa: E402
from dpsynth.prior.figures import FONTS, Part  # noqa: E402


def draw(name: str, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` records of ``datasets.write_folder(name, …, n=n, seed=seed)``, in memory."""
    role, fn, classes = datasets.DATASETS[name]
    assert role == datasets.DEVELOPMENT, f"{name}: the probe runs on development sets only"
    rng = np.random.default_rng([seed, int.from_bytes(name.encode(), "little") % 2**32])
    labels = rng.permutation(np.arange(n) % len(classes))
    images = np.stack([fn(rng, int(y)) for y in labels])
    return (images if images.ndim == 4 else images[..., None]), labels


def candidates(size: int = 32, scale: float = 0.75) -> tuple[np.ndarray, np.ndarray]:
    """The mask features of the ten letters in every DejaVu font of the prior, and their classes."""
    figs, classes = [], []
    for c, letter in enumerate(datasets.LETTERS):
        for f in range(len(FONTS)):
            figs.append((Part("glyph", (0.5, 0.5, scale, 0.0), glyph=letter, font=f),))
            classes.append(c)
    return pe.mask_features(figs, size), np.array(classes)


def probe(images: np.ndarray, labels: np.ndarray, feature: str) -> float:
    feats = pe.FEATURES[feature](images)
    cand, classes = candidates(images.shape[1])
    return float((classes[(feats @ cand.T).argmax(1)] == labels).mean())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sets", nargs="+")
    ap.add_argument("--n", type=int, default=1500)
    ap.add_argument("--features", nargs="+", default=["plane", "segmenter"])
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    for name in args.sets:
        images, labels = draw(name, args.n)
        for feature in args.features:
            print(f"{name} {feature}: 1-NN accuracy {probe(images, labels, feature):.3f} ({len(labels)} records)",
                  flush=True)


if __name__ == "__main__":
    main()
