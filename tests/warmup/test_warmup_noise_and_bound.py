"""The intensity-histogram and polarity-shape releases add the noise they are accounted with and move by at most the
bound they are accounted with (issue #52 item 5): each check with a positive control that it catches a release that
does not.

Beside their canary runs in the empirical audit (tests/audit/test_empirical_warmup_generic.py; the histogram's has
only 16 coordinates) and the brute-force sensitivity tests of tests/warmup/test_warmup_intensity.py and
tests/warmup/test_warmup_polarity.py, these tests check their noise over many releases.

The noise test is the empirical audit's own (docs/privacy.md, "the noise test"): the output less the noiseless query,
divided by the accounted σ·bound, has a mean square that N(0, 1) noise would make that small (or that large) with
probability < 10⁻⁶ (χ² with as many degrees of freedom as independent coordinates).
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2

from dpsynth.warmup import central_images as ci
from dpsynth.mechanisms.randomness import MechanismRandomness
from tests.warmup.test_warmup_polarity import coloured_squares

P = 1e-6


def noise_as_accounted(noise: torch.Tensor, scale: float, dof: int | None = None) -> bool:
    """Whether ``noise`` (the output less the noiseless query) is N(0, scale²) on its ``dof`` independent
    coordinates (default: all of them) by a two-sided χ² test at level P."""
    z = noise.double().flatten() / scale
    dof = dof or z.numel()
    stat = float((z ** 2).sum())
    return chi2.ppf(P / 2, dof) <= stat <= chi2.ppf(1 - P / 2, dof)


def weaker(monkeypatch, factor: float = 0.5):
    """A broken mechanism: its noise is ``factor`` × what it is accounted with."""
    draw = MechanismRandomness.standard_normal
    monkeypatch.setattr(MechanismRandomness, "standard_normal", lambda self, shape, dtype=None:
                        factor * draw(self, shape, dtype=dtype))


# --- the intensity histogram: sensitivity 1, noise N(0, σ²) per bin ---------------------------------------------


RELEASES = 400


def histogram_noise(sigma: float) -> torch.Tensor:
    """The histogram's noise over RELEASES releases. The query's sums are held at c = 10⁶ per bin (no clamping), so
    a release is h_b = (c + σZ_b) / (16c + σΣZ), and 16c·h_b − c = σ(Z_b − Z̄) to first order in σ/c: the noise less
    its mean over the bins (what the normalisation takes out), 15 independent coordinates per release."""
    c = 1e6
    r = MechanismRandomness()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ci, "intensity_sums", lambda images, bins=ci.INTENSITY_BINS: torch.full((bins,), c, dtype=torch.float64))
        h = torch.stack([ci.intensity_histogram(torch.zeros(1, 1, 2, 2), noise_multiplier=sigma, randomness=r).double()
                         for _ in range(RELEASES)])
    return h * (ci.INTENSITY_BINS * c) - c


def test_the_histogram_adds_noise_of_sigma_per_bin():
    """Each bin's noise has std σ: the query's sensitivity is 1."""
    assert noise_as_accounted(histogram_noise(3.0), 3.0, dof=RELEASES * (ci.INTENSITY_BINS - 1))


def test_the_histogram_noise_test_catches_half_the_noise(monkeypatch):
    weaker(monkeypatch)
    assert not noise_as_accounted(histogram_noise(3.0), 3.0, dof=RELEASES * (ci.INTENSITY_BINS - 1))


def test_the_histogram_query_moves_by_at_most_one_and_the_check_catches_an_unnormalised_one():
    """Brute force over removals: ‖Δ‖₂ ≤ 1 for the released query; the raw pixel counts (each record's histogram
    not divided by its pixel count) move by H·W·C and are caught."""
    g = torch.Generator().manual_seed(1)
    x = torch.rand(30, 3, 6, 6, generator=g) * 2 - 1

    def moved(query):
        full = query(x)
        return max(float((full - query(torch.cat([x[:i], x[i + 1:]]))).norm()) for i in range(len(x)))

    assert moved(ci.intensity_sums) <= 1 + 1e-12
    unnormalised = lambda images: ci.intensity_sums(images) * images[0].numel()  # noqa: E731
    assert moved(unnormalised) > 1


# --- the polarity shapes: sensitivity C, noise N(0, (σC)²) on every coordinate ----------------------------------


def polarity_noise(sigma: float, clip: float) -> torch.Tensor:
    """One release's noise on its raw output (the sums before post-processing), as the audit reads it."""
    x, y = coloured_squares(60)
    seen = []
    ci.polarity_shapes(x, y, num_classes=2, clip=clip, noise_multiplier=sigma, randomness=MechanismRandomness(),
                       observe=lambda noisy, query: seen.append(noisy - query))
    return seen[0]


def test_the_polarity_shapes_add_noise_of_sigma_times_the_clip():
    noise = polarity_noise(2.0, 10.0)
    assert noise.numel() == 2 * 2 * (16 * 16 + 1)  # every coordinate of the 2 classes × 2 polarities
    assert noise_as_accounted(noise, 2.0 * 10.0)


def test_the_polarity_noise_test_catches_half_the_noise_and_noise_of_the_wrong_scale(monkeypatch):
    assert not noise_as_accounted(polarity_noise(2.0, 10.0), 2.0 * 10.0 * 2)  # accounted σ·2C: caught too
    weaker(monkeypatch)
    assert not noise_as_accounted(polarity_noise(2.0, 10.0), 2.0 * 10.0)


def test_the_polarity_bound_check_catches_a_query_clipped_to_twice_the_bound():
    """The brute-force bound (one record moves one row by ≤ C) fails for a query whose rows are built at 2C."""
    x, y = coloured_squares(30)

    def moved(clip_used):
        full = ci.shape_sums(x, y, num_classes=2, clip=clip_used)
        return max(float((full - ci.shape_sums(torch.cat([x[:i], x[i + 1:]]), torch.cat([y[:i], y[i + 1:]]),
                                                num_classes=2, clip=clip_used)).norm(dim=1).max())
                   for i in range(len(x)))

    assert moved(10.0) <= 10.0 + 1e-9
    assert moved(20.0) > 10.0  # what a release accounted at C but built at 2C would move by
