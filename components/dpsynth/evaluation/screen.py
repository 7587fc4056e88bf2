"""The screen of released samples (#51 item 5): drop a sample that is a patch of noise rather than an image.

The rule reads the released samples only (post-processing: no record, no statistic of the records, no ε): a
sample is noise when the correlation of neighbouring pixels is below ``sample.screen`` (0.35 by default). For one
image x (H × W × C, each channel less its mean), the correlation is the mean of the products of horizontally and of
vertically adjacent values, divided by the mean square: 1 for a flat or smooth image, 0 for independent pixel noise.
Measured on 300 images of each procedural set of ``benchmarks/datasets.py`` (development and confirmation, drawn
by code, none of them a user's records) it is never below 0.51 (medians 0.75–0.89); on 32 × 32 patches of
independent uniform or Gaussian noise never above 0.06. Noise blurred over a pixel or more (correlation 0.5 and up)
passes: it looks like a blob, not a patch of noise, and no rule on one image tells it from a soft figure.

The screen removes the odd noise patch, not the release: when more than half of the samples fail the rule
(``MAX_SHARE``), the generator itself makes noise, and hiding that would mislead; then nothing is dropped and the
details say how many failed (``flagged``), so the sample grid shows the user what the generator makes.

The kept samples keep their record ids (``synthetic:NNNNNNN``), so a dropped one leaves a gap; the count dropped is
a released quantity (a count of released samples) and is reported in the sample stage's details.
"""

from __future__ import annotations

import numpy as np
import torch

from dpsynth.data import ImageDataset
from dpsynth.grids import tile

DEFAULT = 0.35  # sample.screen's default
MAX_SHARE = 0.5  # above this share of failing samples, nothing is dropped (the generator makes noise)


def neighbour_correlation(images: np.ndarray) -> np.ndarray:
    """N × H × W × C uint8 (or float) → the N neighbouring-pixel correlations (1 for a flat image)."""
    x = images.astype(np.float64)
    if x.ndim == 3:
        x = x[..., None]
    x = x - x.mean(axis=(1, 2), keepdims=True)
    power = (x ** 2).mean(axis=(1, 2, 3))
    across = (x[:, :, 1:] * x[:, :, :-1]).mean(axis=(1, 2, 3))
    down = (x[:, 1:] * x[:, :-1]).mean(axis=(1, 2, 3))
    flat = power < 1e-9
    return np.where(flat, 1.0, (across + down) / 2 / np.where(flat, 1.0, power))


def screen(synthetic: ImageDataset, *, min_correlation: float | None) -> tuple[ImageDataset, dict]:
    """The released samples of ``synthetic`` less those whose neighbouring-pixel correlation is below
    ``min_correlation`` (None: all kept), and what was dropped: the count of released samples, and the rule."""
    rule = (f"dropped when the neighbouring-pixel correlation of the sample is below {min_correlation} "
            "(a patch of noise; dpsynth.evaluation.screen)") if min_correlation is not None else "none (sample.screen: null)"
    if min_correlation is None:
        return synthetic, {"dropped": 0, "flagged": 0, "rule": rule}
    keep = neighbour_correlation(synthetic.images) >= min_correlation
    flagged = int((~keep).sum())
    if flagged > MAX_SHARE * len(keep):
        return synthetic, {"dropped": 0, "flagged": flagged,
                           "rule": rule + f"; not applied: more than {MAX_SHARE:.0%} of the samples are noise"}
    kept = synthetic.subset(np.flatnonzero(keep)) if flagged else synthetic
    return kept, {"dropped": flagged, "flagged": flagged, "rule": rule}


def grid(synthetic: ImageDataset, *, per_class: int, scale: int = 2):
    """The first ``per_class`` released samples of each class, one row per class (blank where fewer), as a PIL
    image: the grid shows what the release holds, after the screen."""
    x = synthetic.to_tensors()[0]
    rows = []
    for k in range(synthetic.num_classes):
        imgs = x[torch.from_numpy(synthetic.labels == k)][:per_class]
        rows.append(torch.cat([imgs, torch.ones((per_class - len(imgs), *x.shape[1:]))]))
    return tile(torch.cat(rows), rows=synthetic.num_classes, cols=per_class, scale=scale)
