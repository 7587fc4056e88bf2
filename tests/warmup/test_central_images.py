"""The central-image release (dpsynth.warmup.central_images) against first principles."""

import math

import numpy as np
import pytest
import torch

from dpsynth.errors import PrivacyError
from dpsynth.privacy import MechanismTrace, full_batch_gaussian, get_accountant
from dpsynth.warmup.central_images import (central_images, class_sums, group_sums, nearest_template,
                                           residual_second_moments, style_images, symmetric_noise,
                                           variation_directions)
from dpsynth.mechanisms.randomness import MechanismRandomness


def _data(n=40, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 6, 6, generator=g) * 2 - 1
    x[:5] = 1.0  # all-white images, norm 6 in [0, 1]: clipped
    return x, torch.randint(0, k, (n,), generator=g)


def test_sensitivity_of_the_query_is_at_most_clip_under_add_remove():
    """Brute force: removing any one record moves the stacked class sums by at most C."""
    x, y = _data()
    clip = 2.5
    full = class_sums(x, y, num_classes=3, clip=clip)
    worst = 0.0
    for i in range(len(x)):
        keep = torch.arange(len(x)) != i
        worst = max(worst, float((full - class_sums(x[keep], y[keep], num_classes=3, clip=clip)).norm()))
    assert worst <= clip * (1 + 1e-12)
    assert worst > 0.9 * clip  # the clipped all-white records reach the bound


def _templates(k=3, per_class=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(k * per_class, 1, 6, 6, generator=g) * 2 - 1, torch.arange(k).repeat_interleave(per_class)


def test_sensitivity_of_the_style_query_is_at_most_clip_under_add_remove():
    """Brute force on the whole query, assignment included: removing any one record (and re-assigning
    everyone from scratch) moves the stacked (class, template) group sums by at most C."""
    x, y = _data()
    t, ty = _templates()
    clip = 2.5

    def query(x, y):
        return group_sums(x, nearest_template(x, y, t, ty), num_groups=len(t), clip=clip)

    full = query(x, y)
    worst = max(float((full - query(x[keep], y[keep])).norm())
                for keep in (torch.arange(len(x)) != i for i in range(len(x))))
    assert worst <= clip * (1 + 1e-12)
    assert worst > 0.9 * clip


def test_records_go_to_the_nearest_template_of_their_own_class():
    x, y = _data()
    t, ty = _templates()
    groups = nearest_template(x, y, t, ty)
    for i in range(len(x)):
        same = (ty == y[i]).nonzero().view(-1)
        d = ((x[i] - t[same]) ** 2).flatten(1).sum(1)  # brute force, on [-1, 1] (same order as on [0, 1])
        assert int(groups[i]) == int(same[d.argmin()])
        assert int(ty[groups[i]]) == int(y[i])


def test_noiseless_style_means_are_the_group_means():
    x, y = _data()
    t, ty = _templates()
    styles, counts = style_images(x, y, t, ty, clip=100.0, noise_multiplier=0.0)
    groups = nearest_template(x, y, t, ty)
    for k in range(len(t)):
        members = groups == k
        assert counts[k].item() == pytest.approx(float(members.sum()), rel=1e-6)
        if members.any():
            assert torch.allclose(styles[k].double(), x[members].double().mean(0), atol=1e-6)


def test_noiseless_means_are_the_class_means_of_the_clipped_images():
    x, y = _data()
    clip = 100.0  # nothing is clipped
    means = central_images(x, y, num_classes=3, clip=clip, noise_multiplier=0.0)
    for k in range(3):
        expected = x[y == k].double().mean(0)
        assert torch.allclose(means[k].double(), expected, atol=1e-6)


def test_noise_is_sigma_times_clip_on_the_sums_and_counts():
    """Over many releases, the empirical std of a class mean's pixel (scaled back to a sum) is σ·C."""
    x, y = _data(n=2000, k=2)
    x[:] = 0.0  # grey images in [-1, 1] = 0.5 in [0, 1]: means stay inside (0, 1), no clamping
    clip, sigma = 100.0, 0.05
    g = MechanismRandomness(seed=3)
    exact_counts = torch.bincount(y, minlength=2).double()
    pixels = torch.stack([central_images(x, y, num_classes=2, clip=clip, noise_multiplier=sigma, randomness=g)[:, 0, 0, 0]
                          for _ in range(300)]).double()
    sums_std = (((pixels + 1) / 2) * exact_counts).std(0)  # ≈ σC: the count's noise is negligible here
    assert torch.allclose(sums_std, torch.full((2,), sigma * clip, dtype=torch.float64), rtol=0.15)


def test_one_release_is_one_gaussian_mechanism_in_the_accounts():
    """ε of the event equals the analytic Gaussian mechanism's RDP bound: α/(2σ²) at the best order."""
    sigma, delta = 8.0, 1e-5
    eps = get_accountant("rdp").epsilon(MechanismTrace([full_batch_gaussian(sigma)]), delta=delta)
    # independent reference: ε = min_α α/(2σ²) + log(1/δ)/(α−1) over a fine grid (Mironov 2017, Prop. 3)
    alphas = np.linspace(1.01, 500, 200000)
    reference = float(np.min(alphas / (2 * sigma**2) + np.log(1 / delta) / (alphas - 1)))
    assert eps <= reference * 1.001  # the accountant may use a tighter conversion, never a looser one
    assert eps > 0.5 * reference


def test_refuses_a_bad_clip():
    x, y = _data()
    with pytest.raises(PrivacyError, match="warmup.clip"):
        class_sums(x, y, num_classes=3, clip=0.0)


# --- the variation release -------------------------------------------------------------------------


def _upper(m):
    iu = torch.triu_indices(m.shape[-1], m.shape[-1])
    return m[:, iu[0], iu[1]]


def test_sensitivity_of_the_variation_query_is_at_most_clip_squared_under_add_remove():
    """Brute force on the released vector (every class's upper triangle, diagonal included): removing any
    one record moves it by at most clip² in L2 — the sensitivity the noise is scaled to."""
    x, y = _data()
    t, ty = _templates()
    clip = 0.8

    def query(x, y):
        return _upper(residual_second_moments(x, y, t, ty, num_classes=3, clip=clip))

    full = query(x, y)
    worst = max(float((full - query(x[keep], y[keep])).norm())
                for keep in (torch.arange(len(x)) != i for i in range(len(x))))
    assert worst <= clip ** 2 * (1 + 1e-12)
    assert worst > 0.5 * clip ** 2  # residuals reach the clip bound on this data


def test_noiseless_variation_directions_are_the_principal_components_of_the_residuals():
    """σ = 0 (not private): the directions equal an independent SVD (numpy) of the clipped residuals,
    up to sign, scaled by sqrt(eigenvalue of the second moment / count)."""
    x, y = _data(n=200, k=2)
    t, ty = _templates(k=2, per_class=1)
    clip = 100.0  # no clipping
    counts = torch.bincount(y, minlength=2).double()
    d = variation_directions(x, y, t, ty, counts, rank=3, clip=clip, noise_multiplier=0.0)
    assert d.shape == (2, 3, 1, 6, 6)
    for c in range(2):
        r = (((x[y == c] + 1) / 2).flatten(1) - ((t[c] + 1) / 2).flatten()).double().numpy()
        _, s, vt = np.linalg.svd(r / math.sqrt(counts[c].item()), full_matrices=False)
        ref = (vt[:3] * s[:3, None]) * 2  # [-1, 1] units
        got = d[c].flatten(1).double().numpy()
        for j in range(3):
            sign = np.sign(np.dot(got[j], ref[j]))
            np.testing.assert_allclose(got[j] * sign, ref[j], rtol=1e-3, atol=1e-4)


def test_shared_variation_directions_are_the_principal_components_of_every_class_residual_and_one_draw():
    """warmup.variations_shared: one matrix over every class (each residual around its own class's template), the
    noise drawn once (D(D+1)/2 coordinates, not K times that), and every class given the same directions; σ = 0
    equals an independent SVD (numpy) of all residuals together. Adding or removing a record still moves the
    summed query by ‖r‖² ≤ clip²: the sum of the per-class query of the test above."""
    x, y = _data(n=200, k=2)
    t, ty = _templates(k=2, per_class=1)
    counts = torch.bincount(y, minlength=2).double()
    d = variation_directions(x, y, t, ty, counts, rank=3, clip=100.0, noise_multiplier=0.0, shared=True)
    assert d.shape == (2, 3, 1, 6, 6) and torch.equal(d[0], d[1])
    r = (((x + 1) / 2).flatten(1) - ((t[y] + 1) / 2).flatten(1)).double().numpy()
    _, s, vt = np.linalg.svd(r / math.sqrt(counts.sum().item()), full_matrices=False)
    got = d[0].flatten(1).double().numpy()
    for j in range(3):
        ref = vt[j] * s[j] * 2
        np.testing.assert_allclose(got[j] * np.sign(np.dot(got[j], ref)), ref, rtol=1e-3, atol=1e-4)
    seen = {}
    variation_directions(x, y, t, ty, counts, rank=3, clip=0.8, noise_multiplier=1.0,
                         randomness=MechanismRandomness(seed=1), shared=True,
                         observe=lambda noisy, query: seen.update(noisy=noisy, query=query))
    assert seen["noisy"].shape == seen["query"].shape == (1, 36, 36)
    per_class = residual_second_moments(x, y, t, ty, num_classes=2, clip=0.8)
    torch.testing.assert_close(seen["query"][0], per_class.sum(0))


def test_variation_noise_is_sigma_clip_squared_on_every_upper_entry_and_symmetric():
    g = MechanismRandomness(seed=5)
    draws = torch.stack([symmetric_noise((2, 4, 4), randomness=g) for _ in range(2000)])
    assert torch.equal(draws, draws.transpose(-1, -2))
    std = draws.std(0)
    assert torch.allclose(std, torch.ones_like(std), rtol=0.08)  # each entry one N(0, 1) draw, mirrored
    corr = torch.corrcoef(torch.stack([draws[:, 0, 0, 1], draws[:, 0, 0, 2], draws[:, 1, 0, 1]]))
    assert (corr - torch.eye(3)).abs().max() < 0.1  # independent upper coordinates


def test_variation_release_refuses_noise_without_the_secret_randomness():
    x, y = _data()
    t, ty = _templates()
    with pytest.raises(PrivacyError, match="secret randomness"):
        variation_directions(x, y, t, ty, torch.ones(3) * 10, rank=2, clip=1.0, noise_multiplier=1.0)
    with pytest.raises(PrivacyError, match="warmup.variations_clip"):
        variation_directions(x, y, t, ty, torch.ones(3) * 10, rank=2, clip=0.0, noise_multiplier=0.0)
