"""Public seeds: one train.seed, many independent streams (one per purpose), and modules built under a seed.

These streams are public (reproducibility: the same run gives the same weights, batches and latents); the
mechanism's secret coins are :mod:`dpsynth.mechanisms.randomness`'s, never drawn from here.
"""

from __future__ import annotations

import hashlib
import json
from typing import Callable

import torch


def derived_seed(seed: int, *tags) -> int:
    """A 63-bit seed for one purpose (``tags``), independent of the others drawn from ``seed``."""
    digest = hashlib.sha256(json.dumps([seed, *tags]).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def cpu_rng(seed: int, *tags) -> torch.Generator:
    """A CPU stream for one purpose (:func:`derived_seed`)."""
    return torch.Generator().manual_seed(derived_seed(seed, *tags))


def init_with_seed(seed: int, build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """Construct a module under a fixed global seed without disturbing the caller's RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()
