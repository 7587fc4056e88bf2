"""train.g_tone: the generator's tone layer, set after the warm-up's fit so that its pixels have the intensity
histogram the warm-up released (post-processing of G and of a released value; no privacy spent)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dpsynth.config import load_config
from dpsynth.errors import ConfigError
from dpsynth.methods.dpgan import DPGANTrainer
from dpsynth.models.dcgan import TONE_KNOTS, Generator, tone_map
from dpsynth.training import artifacts, warmup


def tiny(tmp_path, *extra):
    return load_config(overrides=[
        f"output.dir={tmp_path}", "tracking.enabled=false", "train.d_width=4", "train.g_width=4",
        "train.latent_dim=8", "train.batch_size=32", "train.steps=4", "train.n_d=2",
        "output.checkpoint_every=2", "output.sample_every=0", "output.log_every=0", "privacy.epsilon=8",
        "privacy.delta=1e-4", "warmup.central_images=true", "warmup.steps=20", "warmup.noise_multiplier=5",
        "warmup.intensity_noise_multiplier=20", *extra,
    ])


def shares(x: torch.Tensor, bins: int = 16) -> np.ndarray:
    """The share of x's values (in [-1, 1]) in each of ``bins`` equal bins of [0, 1]."""
    v = ((x.detach().flatten().double() + 1) / 2).clamp(0, 1)
    return np.bincount((v * bins).long().clamp(max=bins - 1).numpy(), minlength=bins) / len(v)


def test_histogram_quantiles_agree_with_a_brute_force_sample_of_the_histogram():
    """Independent reference: draw a million values from the piecewise-uniform histogram, take numpy's quantiles."""
    rng = np.random.default_rng(0)
    hist = torch.tensor(rng.dirichlet(np.full(16, 0.3)), dtype=torch.float32)
    bins = rng.choice(16, size=1_000_000, p=hist.double().numpy() / hist.double().sum().item())
    values = (bins + rng.random(len(bins))) / 16 * 2 - 1
    p = torch.linspace(0.01, 0.99, 33)
    expected = np.quantile(values, p.numpy())
    np.testing.assert_allclose(warmup.histogram_quantiles(hist, p).numpy(), expected, atol=4e-3)


def test_the_tone_map_is_monotone_keeps_its_ends_and_is_the_identity_until_set():
    torch.manual_seed(0)
    plain = Generator(num_classes=3, width=8, latent_dim=10, warp=True)
    toned = Generator(num_classes=3, width=8, latent_dim=10, warp=True, tone=True)
    toned.load_state_dict({**plain.state_dict(), "tone_x": toned.tone_x, "tone_y": toned.tone_y})
    z, y = torch.randn(5, 10), torch.tensor([0, 1, 2, 0, 1])
    with torch.no_grad():
        torch.testing.assert_close(toned(z, y), plain(z, y))  # identity knots: no change
    kx = torch.linspace(-1, 1, TONE_KNOTS + 1)
    ky = torch.sort(torch.rand(TONE_KNOTS + 1) * 2 - 1).values
    x = torch.linspace(-1, 1, 1001)
    out = tone_map(x, kx, ky)
    assert (out.diff() >= -1e-6).all()  # monotone
    torch.testing.assert_close(out[[0, -1]], ky[[0, -1]])
    torch.testing.assert_close(tone_map(kx, kx, ky), ky)  # through its knots
    assert "tone" not in plain.describe() and toned.describe()["tone"] is True


@pytest.mark.parametrize("kind", ["ink on black", "light page"])
def test_match_tones_gives_the_generators_pixels_the_released_histogram(kind):
    hist = torch.zeros(16)
    if kind == "ink on black":  # MNIST-like: mostly background, some ink, few greys
        hist[0], hist[15], hist[4:12] = 0.8, 0.12, 0.01
    else:  # a light page with dark ink and mid greys
        hist[13], hist[14], hist[2], hist[6:10] = 0.5, 0.3, 0.1, 0.025
    torch.manual_seed(0)
    G = Generator(num_classes=4, width=8, latent_dim=10, warp=True, tone=True)
    before = shares(G.sample(400, generator=torch.Generator().manual_seed(1))[0])
    warmup.match_tones(G, hist, generator=torch.Generator().manual_seed(2), n=400)
    after = shares(G.sample(400, generator=torch.Generator().manual_seed(3))[0])
    tv_before, tv_after = 0.5 * np.abs(before - hist.numpy()).sum(), 0.5 * np.abs(after - hist.numpy()).sum()
    assert tv_after < 0.06 < tv_before, (tv_before, tv_after)
    assert (G.tone_x.diff() > 0).all() and (G.tone_y.diff() >= 0).all()


def test_a_toned_run_is_accounted_as_without_the_layer_and_its_generator_keeps_the_map(tmp_path, small_mnist):
    """The layer is post-processing: the same trace (events and ε) as the run without it; the released generator
    file rebuilds G with its knots (buffers in the state dict), and its samples take the histogram's tones."""
    toned = DPGANTrainer(tiny(tmp_path / "a", "train.g_tone=true"), small_mnist).train()
    plain = DPGANTrainer(tiny(tmp_path / "b"), small_mnist).train()
    events = [json.loads(Path(r.trace_path).read_text())["events"] for r in (toned, plain)]
    assert events[0] == events[1] and toned.epsilon == pytest.approx(plain.epsilon, rel=1e-12)
    loaded, _ = artifacts.load_generator(toned.generator_path)
    assert loaded.tone and not torch.equal(loaded.tone_x, torch.linspace(-1, 1, TONE_KNOTS + 1))
    assert (loaded.tone_x.diff() > 0).all()


def test_g_tone_is_refused_without_the_released_histogram_or_for_the_resnet_generator(tmp_path):
    with pytest.raises(ConfigError, match="train.g_tone"):
        tiny(tmp_path, "train.g_tone=true", "warmup.intensity_noise_multiplier=null")
    with pytest.raises(ConfigError, match="train.g_tone"):
        tiny(tmp_path, "train.g_tone=true", "warmup.central_images=false")
    with pytest.raises(ConfigError, match="train.g_tone"):
        tiny(tmp_path, "train.g_tone=true", "train.method=gswgan")
