"""Public data: records from a source separate from the sensitive dataset, usable without privacy.

A method that trains without privacy on "public" records (dp-GAN's pre-training and clipping
bounds) is private only if those records really are public. dpsynth takes them from one of:

* ``data.public_source`` — a separate source: ``sklearn:digits`` (scikit-learn's bundled 1,797
  handwritten digits, 8×8, available offline; resized to the sensitive images' size and centred
  like MNIST: the digit fills 5/7 of the side) or any source ``dpsynth data import`` reads;
* ``data.public_split`` — the records of a split of ``data.uri`` that the operator declares public;
* ``data.public_fraction`` — a keyed-hash slice of the *sensitive* dataset. Those records are not
  protected by the release's (ε, δ), so the config must acknowledge it
  (``data.public_fraction_unprotected: true``, :data:`UNPROTECTED`), and the audit (``audit.md``),
  the release record and the MLflow tags carry the statement.
"""

from __future__ import annotations

import numpy as np

from dpsynth.data.dataset import ImageDataset

SKLEARN_DIGITS = "sklearn:digits"
UNPROTECTED = "these records are unprotected"


def declared(cfg) -> bool:
    """Whether the config names public data at all."""
    d = cfg.data
    return d.public_source is not None or d.public_split is not None or d.public_fraction > 0


def describe(cfg) -> str:
    """Where the public records come from, in one sentence."""
    d = cfg.data
    if d.public_source is not None:
        return f"a separate source, data.public_source = {d.public_source!r}"
    if d.public_split is not None:
        return f"the records of split {d.public_split!r} of data.uri, declared public by the operator"
    if d.public_fraction > 0:
        return (f"a {d.public_fraction:g} keyed-hash slice of the sensitive dataset (data.public_fraction), "
                f"acknowledged unprotected")
    return "none are used"


def unprotected_statement(cfg) -> str | None:
    """The statement the gate shows when sensitive records are used as public; None when none are."""
    if cfg.data.public_fraction > 0:
        return (f"data.public_fraction = {cfg.data.public_fraction:g}: that slice of the sensitive dataset was used "
                f"without privacy (pre-training, clipping bounds); {UNPROTECTED} by this release's (ε, δ).")
    return None


def load_public_source(source: str, *, shape: tuple[int, int, int] | None = None) -> ImageDataset:
    """The records of ``data.public_source``, every one with split "public"; ``shape`` (H, W, C) resizes
    ``sklearn:digits`` to the sensitive images' shape (other sources must already have it)."""
    import dataclasses

    from dpsynth.data.importers import import_source
    from dpsynth.errors import DatasetError

    if source == SKLEARN_DIGITS:
        ds = _digits(shape or (28, 28, 1))
    else:
        ds = import_source(source, split="public")
        ds = dataclasses.replace(ds, source=f"data.public_source {source}")
    if shape is not None and ds.shape != tuple(shape):
        raise DatasetError(f"data.public_source: {source} has images of shape {ds.shape}, the sensitive data {tuple(shape)}")
    return ds


def _digits(shape: tuple[int, int, int]) -> ImageDataset:
    """scikit-learn's bundled digits (0–16 on 8×8), as uint8 images of ``shape``: white digits on black,
    the digit resized (bilinear) to 5/7 of the side and centred, like MNIST's 20×20 box in 28×28."""
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits

    height, width, channels = shape
    digits = load_digits()
    x = torch.from_numpy(digits.images.astype(np.float32) / 16.0)[:, None]  # N×1×8×8 in [0, 1]
    inner_h, inner_w = max(1, round(height * 5 / 7)), max(1, round(width * 5 / 7))
    x = F.interpolate(x, size=(inner_h, inner_w), mode="bilinear", align_corners=False).clamp(0, 1)
    top, left = (height - inner_h) // 2, (width - inner_w) // 2
    x = F.pad(x, (left, width - inner_w - left, top, height - inner_h - top))
    images = np.repeat((x[:, 0].numpy() * 255).round().astype(np.uint8)[..., None], channels, axis=3)
    n = len(images)
    return ImageDataset(record_ids=[f"sklearn-digits-{i:04d}" for i in range(n)],
                        labels=digits.target.astype(np.int64), images=images, splits=["public"] * n,
                        num_classes=10, source=SKLEARN_DIGITS + " (scikit-learn's bundled digits, resized)")
