"""Checks shared by the privacy modules; each failure is a PrivacyError naming the field."""

from __future__ import annotations

import math
import operator
from typing import Any

from dpsynth.errors import PrivacyError


def as_real(value: Any, field: str) -> float:
    """``value`` as a float (not NaN, not a bool)."""
    if isinstance(value, bool):
        raise PrivacyError(f"{field}: must be a number, got {value!r}")
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise PrivacyError(f"{field}: must be a number, got {value!r}") from None
    if math.isnan(value):
        raise PrivacyError(f"{field}: must be a number, got nan")
    return value


def as_count(value: Any, field: str) -> int:
    """``value`` as an int >= 0 (not a bool, not a float)."""
    if isinstance(value, bool):
        raise PrivacyError(f"{field}: must be an integer >= 0, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise PrivacyError(f"{field}: must be an integer >= 0, got {value!r}") from None
    if value < 0:
        raise PrivacyError(f"{field}: must be an integer >= 0, got {value}")
    return value


def check_epsilon(epsilon: Any, field: str = "epsilon") -> float:
    eps = as_real(epsilon, field)
    if not 0 < eps < math.inf:
        raise PrivacyError(f"{field}: must be a finite number > 0, got {eps}")
    return eps


def check_delta_range(delta: Any, field: str = "delta") -> float:
    d = as_real(delta, field)
    if not 0 < d < 1:
        raise PrivacyError(f"{field}: must be in (0, 1), got {d}")
    return d


def check_noise(noise_multiplier: Any, field: str = "noise_multiplier") -> float:
    sigma = as_real(noise_multiplier, field)
    if not 0 < sigma < math.inf:
        raise PrivacyError(f"{field}: must be a finite number > 0, got {sigma}")
    return sigma


def check_sample_rate(sample_rate: Any, field: str = "sample_rate") -> float:
    q = as_real(sample_rate, field)
    if not 0 < q <= 1:
        raise PrivacyError(f"{field}: must be in (0, 1], got {q}")
    return q
