"""What would an RGB release have to look like to be useful? A diagnostic on the development set letters-rgb (#32).

No privacy and no pipeline: the benchmark's own drawing code (``datasets.py``) makes training sets of *ideal*
synthetic records, each variant keeping or dropping one property of the real ones, and the evaluate stage's CNN
(``accuracy.evaluate("cnn")``, the DPImageBench protocol: trained on the variant, epoch chosen on held-out records
of the variant) is tested on real letters-rgb records drawn from another seed. The variants, all 32×32 RGB and
drawn from the same letter masks (``_glyph_mask``: 8 fonts, size, rotation, shift):

    real                  the set itself (the ceiling at this size)
    mask-white            the mask, white on black (a perfect grey shape, one polarity)
    mask-polarity         the mask or its negative, at random
    mask-grey             two random grey levels, figure and ground
    mask-colours          two random flat colours, figure and ground
    mask-backgrounds      a random flat colour on the set's own gradient backgrounds
    blurR-white           the mask blurred (Gaussian, radius R pixels), white on black
    blurR-polarity        blurred, and its negative at random
    blurR-colours         blurred, in two random flat colours
    thickS-colours        strokes thickened (an S × S max filter), in two random flat colours
    means-polarity        the best a release of class means can do, noiselessly: the class means of the real
                          training records' luminance less its own mean (unit norm, signed so its rarer tone is
                          bright: the generic recipe's polarity feature), each drawn under a random rotation (±15°),
                          scale (0.8–1.2) and shift (±15 %), made nearly two-tone around its own pixels
                          (sigmoid(3·(z − 1)), z its standardised luminance) and put in two random flat colours
    means-ink             the same from each record's |luminance − its least-squares plane| (scaled to peak 1): a
                          figure map that needs no sign
    groupsK-polarity      the best a release of style-group means can do, noiselessly: each class's polarity features
                          split into K groups by k-means (20 Lloyd iterations from K of its records), every group's
                          mean drawn as means-polarity draws a class mean, a group picked in proportion to its size

It asks which of the real records' properties a release must carry for the CNN to transfer, i.e. what the
releases of the generic recipe (class means and variation directions, smooth by construction) lack.
Only the development set letters-rgb is drawn: no setting may be read off a confirmation set.

    .venv/stage/bin/python benchmarks/run.py transfer-targets   # the suite in benchmarks/suites.toml; arguments: measure()
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from PIL import ImageFilter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import datasets  # noqa: E402  (benchmarks/datasets.py)

from dpsynth.config import load_config  # noqa: E402
from dpsynth.data.dataset import ImageDataset  # noqa: E402
from dpsynth.evaluation import accuracy  # noqa: E402

LETTERS = datasets.LETTERS
VARIANTS = ["real", "mask-white", "mask-polarity", "mask-grey", "mask-colours", "mask-backgrounds", "blur0.7-white",
            "blur1.5-white", "blur1.5-polarity", "blur0.7-colours", "blur1.5-colours", "thick3-colours",
            "thick5-colours", "means-polarity", "means-ink", "groups9-polarity", "groups25-polarity",
            "groups60-polarity"]


def two_colours(rng, m: np.ndarray) -> np.ndarray:
    """``m`` (H×W on [0, 1], 1 = figure) in one random flat colour on another."""
    c0, c1 = rng.random(3), rng.random(3)
    return c0 * (1 - m[..., None]) + c1 * m[..., None]


def record(variant: str, rng, label: int) -> np.ndarray:
    """One 32×32×3 record of ``variant`` (values in [0, 1]) of class ``label``."""
    mask = datasets._glyph_mask(LETTERS[label], rng, size=32, fonts=datasets.FONTS)
    if variant == "real":
        return datasets._in_colour(rng, mask) / 255.0
    kind, _, look = variant.partition("-")
    if kind.startswith("blur"):
        mask = mask.filter(ImageFilter.GaussianBlur(float(kind[4:])))
    elif kind.startswith("thick"):
        mask = mask.filter(ImageFilter.MaxFilter(int(kind[5:])))
    m = np.asarray(mask) / 255.0
    if look == "white":
        grey = m
    elif look == "polarity":
        grey = m if rng.random() < 0.5 else 1 - m
    elif look == "grey":
        a, b = rng.random(2)
        grey = a * (1 - m) + b * m
    elif look == "colours":
        return two_colours(rng, m)
    elif look == "backgrounds":
        return datasets._background(rng, 32, True) * (1 - m[..., None]) + rng.random(3) * m[..., None]
    else:
        raise SystemExit(f"unknown variant {variant!r} (of {', '.join(VARIANTS)})")
    return np.repeat(grey[..., None], 3, -1)


def features(real: ImageDataset, kind: str) -> torch.Tensor:
    """Each real record's figure map (N×H×W, computed from the record alone): ``polarity`` or ``ink``."""
    lum = torch.tensor(real.images, dtype=torch.float64).mean(-1) / 255
    n, h, w = lum.shape
    if kind == "polarity":
        z = lum - lum.mean((1, 2), keepdim=True)
        sign = torch.where((z ** 3).sum((1, 2), keepdim=True) < 0, -1.0, 1.0)
        f = (z * sign).flatten(1)
        return (f / f.norm(dim=1, keepdim=True).clamp(min=1e-9)).view(n, h, w).float()
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, h, dtype=lum.dtype), torch.linspace(-1, 1, w, dtype=lum.dtype),
                            indexing="ij")
    plane = torch.stack([torch.ones(h * w, dtype=lum.dtype), xx.flatten(), yy.flatten()], 1)
    flat = lum.flatten(1)
    dev = (flat - (plane @ torch.linalg.lstsq(plane, flat.T).solution).T).abs()
    return (dev / dev.amax(1, keepdim=True).clamp(min=1e-9)).view(n, h, w).float()


def group_means(f: torch.Tensor, labels: np.ndarray, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each class's features ``f`` (N×H×W) split into ``k`` groups by k-means (20 Lloyd iterations from k of its
    records, torch's generator at seed 0): the groups' means (class-major, K·k×H×W) and sizes."""
    means, sizes, g = [], [], torch.Generator().manual_seed(0)
    for y in range(int(labels.max()) + 1):
        x = f[torch.as_tensor(labels == y)].flatten(1)
        centres = x[torch.randperm(len(x), generator=g)[:k]].clone()
        for _ in range(20):
            nearest = torch.cdist(x, centres).argmin(1)
            centres = torch.stack([x[nearest == j].mean(0) if (nearest == j).any() else centres[j] for j in range(k)])
        means += [centres.view(k, *f.shape[1:])]
        sizes += [torch.bincount(nearest, minlength=k)]
    return torch.cat(means), torch.cat(sizes).double()


def from_means(means: torch.Tensor, labels: np.ndarray, rng) -> np.ndarray:
    """Class ``labels``' means (K×H×W), each drawn under a random rotation, scale and shift, made nearly two-tone
    around its own pixels and put in two random flat colours: N×H×W×3 on [0, 1]."""
    import torch.nn.functional as F

    n, (h, w) = len(labels), means.shape[1:]
    angle = torch.tensor(rng.uniform(-15, 15, n) * np.pi / 180, dtype=torch.float32)
    scale = torch.tensor(rng.uniform(0.8, 1.2, n), dtype=torch.float32)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0], theta[:, 0, 1] = torch.cos(angle) * scale, -torch.sin(angle) * scale
    theta[:, 1, 0], theta[:, 1, 1] = torch.sin(angle) * scale, torch.cos(angle) * scale
    theta[:, :, 2] = torch.tensor(rng.uniform(-0.15, 0.15, (n, 2)), dtype=torch.float32)
    grid = F.affine_grid(theta, (n, 1, h, w), align_corners=False)
    img = F.grid_sample(means[torch.as_tensor(labels)][:, None], grid, padding_mode="border", align_corners=False)[:, 0]
    z = (img - img.mean((1, 2), keepdim=True)) / img.std((1, 2), keepdim=True).clamp(min=1e-6)
    m = torch.sigmoid(3 * (z - 1)).numpy()[..., None]
    c0, c1 = rng.random((n, 1, 1, 3)), rng.random((n, 1, 1, 3))
    return c0 * (1 - m) + c1 * m


def drawn(variant: str, n: int, seed: int, means: torch.Tensor | None = None,
          sizes: torch.Tensor | None = None) -> ImageDataset:
    """``n`` records of ``variant``, classes balanced, from numpy's PCG64 at ``seed`` (``means``: the class or group
    means a means-* (one group a class) or groups*-* variant draws; ``sizes``: the groups' sizes)."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % len(LETTERS)
    if variant.startswith("means-"):
        images = from_means(means, labels, rng)
    elif variant.startswith("groups"):
        k = len(means) // len(LETTERS)
        share = (sizes.view(len(LETTERS), k) / sizes.view(len(LETTERS), k).sum(1, keepdim=True)).numpy()
        images = from_means(means, np.array([y * k + rng.choice(k, p=share[y]) for y in labels]), rng)
    else:
        images = np.stack([record(variant, rng, int(y)) for y in labels])
    images = np.round(np.clip(images, 0, 1) * 255).astype(np.uint8)
    return ImageDataset([str(i) for i in range(n)], labels.astype(np.int64), images, None, len(LETTERS), variant)


def measure(*, variants: tuple[str, ...] = tuple(VARIANTS), n: int = 4800, test: int = 1000) -> dict:
    """The CNN on real test records after training on each of ``variants``, ``n`` training records each
    (letters-rgb's training records in the pipeline: 4,818), ``test`` real test records."""
    a = SimpleNamespace(variants=list(variants), n=n, test=test)
    torch.set_num_threads(1)
    cfg = load_config(ROOT / "configs/dpgan-generic-cpu.yaml")  # its evaluate section: the evaluate stage's CNN
    test, fit_real = drawn("real", a.test, 999), drawn("real", 500, 998)  # fit_real: evaluate()'s "real" column
    rows, real = [], None
    for variant in a.variants:
        start = time.process_time()
        means = sizes = None
        if variant.startswith(("means-", "groups")):  # the means of real training records (seed 1, as the variants')
            if real is None:
                real = drawn("real", a.n, 1)
            kind, _, feature = variant.partition("-")
            means, sizes = group_means(features(real, feature), real.labels,
                                       1 if kind == "means" else int(kind.removeprefix("groups")))
        result = accuracy.evaluate("cnn", cfg, synthetic=drawn(variant, a.n, 1, means, sizes),
                                   validation=drawn(variant, 500, 2, means, sizes), fit_real=fit_real, test_real=test)
        rows.append({"variant": variant, "cnn_on_real": result["gen2real"],
                     "validation_accuracy": result["model_selection"].get("validation_accuracy"),
                     "cpu_s": round(time.process_time() - start, 1)})
        print(json.dumps(rows[-1]), flush=True)
    return {"dataset": "letters-rgb", "role": "development", "train_records": a.n, "test_records": a.test,
            "classifier": "cnn (evaluate stage)", "rows": rows}
