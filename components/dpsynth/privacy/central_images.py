"""Central images: one Gaussian release of every class's mean image (a DP warm-up).

Li et al., "From Easy to Hard: Building a Shortcut for Differentially Private Image Synthesis"
(2025), warm a generator up on *central images* — noisy averages of the sensitive images — before
DP-SGD: the mean is a low-sensitivity statistic, so it is learnt almost for free, and the generator
then spends its DP-SGD steps on the harder part (the variation around it).

The query. Each record i of class y_i contributes the vector v_i = [x̃_i, c] to the block of its
class, where x̃_i is its image scaled to [0, 1] and clipped to L2 norm C/√2, and c = C/√2 is a
constant count coordinate. So ‖v_i‖ ≤ C, and adding or removing one record moves the stacked vector
of all class blocks by at most C (one block changes). The release adds N(0, (σC)²) to every
coordinate of that stacked vector: one Gaussian mechanism with noise multiplier σ on the full
dataset, i.e. the mechanism event ``full_batch`` (q = 1), σ, ``add_remove``. Each class's mean
is its noisy pixel sum divided by its noisy count (post-processing). The generator is then fitted to
these means and their augmentations without touching the data again (post-processing, free).

>>> import torch
>>> x = torch.full((4, 1, 2, 2), -1.0); x[2:] = 1.0          # two black, two white images
>>> y = torch.tensor([0, 0, 1, 1])
>>> means = central_images(x, y, num_classes=2, clip=10.0, noise_multiplier=0.0)  # σ = 0: not private
>>> means[:, 0, 0, 0].tolist()
[-1.0, 1.0]
>>> e = event_for(20.0); e.sampling, e.sample_rate, e.noise_multiplier
('full_batch', 1.0, 20.0)
"""

from __future__ import annotations

import math

import torch

from dpsynth.errors import PrivacyError
from dpsynth.privacy.events import MechanismEvent
from dpsynth.privacy.randomness import MechanismRandomness


def event_for(noise_multiplier: float) -> MechanismEvent:
    """The one mechanism event a central-image release is."""
    return MechanismEvent(sampling="full_batch", sample_rate=1.0, noise_multiplier=noise_multiplier,
                          sensitivity="add_remove")


def class_sums(images: torch.Tensor, labels: torch.Tensor, *, num_classes: int, clip: float) -> torch.Tensor:
    """The noiseless query: a (num_classes, D + 1) matrix, row k = Σ over class-k records of [x̃_i, c]."""
    if clip <= 0:
        raise PrivacyError(f"warmup.clip: must be > 0, got {clip}")
    x = ((images.double() + 1) / 2).flatten(1)  # [0, 1]
    part = clip / math.sqrt(2)
    x = x * (part / x.norm(dim=1).clamp(min=part)).unsqueeze(1)
    v = torch.cat([x, torch.full((len(x), 1), part, dtype=x.dtype)], dim=1)
    sums = torch.zeros(num_classes, v.shape[1], dtype=v.dtype)
    sums.index_add_(0, labels.long(), v)
    return sums


def central_images(images: torch.Tensor, labels: torch.Tensor, *, num_classes: int, clip: float,
                   noise_multiplier: float, randomness: MechanismRandomness | None = None) -> torch.Tensor:
    """The noisy class means, shaped (num_classes, C, H, W) in [-1, 1]; the caller records
    ``event_for(noise_multiplier)`` in the mechanism trace.

    ``images`` are N×C×H×W in [-1, 1]. ``randomness`` is the mechanism's secret coins (required when
    ``noise_multiplier`` > 0).
    """
    if noise_multiplier < 0:
        raise PrivacyError(f"warmup.noise_multiplier: must be >= 0, got {noise_multiplier}")
    sums = class_sums(images, labels, num_classes=num_classes, clip=clip)
    if noise_multiplier > 0:
        if randomness is None:
            raise PrivacyError("central images: noise needs the mechanism's secret randomness")
        noise = randomness.standard_normal(tuple(sums.shape), dtype=torch.float64).cpu()
        sums = sums + noise_multiplier * clip * noise
    counts = (sums[:, -1] / (clip / math.sqrt(2))).clamp(min=1.0)
    means = (sums[:, :-1] / counts.unsqueeze(1)).clamp(0, 1) * 2 - 1
    return means.float().view(num_classes, *images.shape[1:])
