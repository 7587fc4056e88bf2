"""train.g_tone: the generator's tone layer, set after the warm-up's fit so that its pixels have the intensity
histogram the warm-up released (post-processing of G and of a released value; no privacy spent)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dpsynth.methods.registry import load_config  # the configuration with its method's rules
from dpsynth.errors import ConfigError
from dpsynth.methods.dpgan import DPGANTrainer
from dpsynth.models.dcgan import TONE_KNOTS, Generator, tone_map
from dpsynth.training import artifacts
from dpsynth.warmup import fit as warmup


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


def spread_generator(gain: float) -> Generator:
    """An untrained toned G whose last layer's weights are scaled by ``gain``: its pixels' spread grows with it."""
    torch.manual_seed(0)
    G = Generator(num_classes=4, width=8, latent_dim=10, warp=True, tone=True)
    with torch.no_grad():
        G.net[-2].weight.mul_(gain)
    return G


class UniformPixels(torch.nn.Module):
    """A test double with the toned generator's interface whose pixels are each uniform on [-1, 1] before its tone
    layer (erf of a normalised random projection of z): the matching's arithmetic, apart from any network."""

    latent_dim, num_classes = 10, 4

    def __init__(self):
        super().__init__()
        w = torch.randn(self.latent_dim, 28 * 28, generator=torch.Generator().manual_seed(0))
        self.register_buffer("w", w / w.norm(dim=0))
        self.register_buffer("tone_x", torch.linspace(-1, 1, TONE_KNOTS + 1))
        self.register_buffer("tone_y", torch.linspace(-1, 1, TONE_KNOTS + 1))

    def forward(self, z, y):
        return tone_map(torch.erf(z @ self.w / 2 ** 0.5).view(-1, 1, 28, 28), self.tone_x, self.tone_y)


@pytest.mark.parametrize("kind", ["ink on black", "light page"])
def test_match_tones_gives_the_generators_pixels_the_released_histogram(kind):
    """Every bin holds ≥ 1/64 of the pixels, so from uniform pixels no segment needs a slope above the cap (4)."""
    hist = torch.zeros(16)
    if kind == "ink on black":  # mostly background, some ink, few greys
        hist[:] = 0.3 / 14
        hist[0], hist[15] = 0.5, 0.2
    else:  # a light page with dark ink
        hist[:] = 0.3 / 13
        hist[13], hist[14], hist[2] = 0.35, 0.25, 0.1
    G = UniformPixels()
    draw = lambda seed: G(torch.randn(400, 10, generator=torch.Generator().manual_seed(seed)), None)  # noqa: E731
    before = shares(draw(1))
    warmup.match_tones(G, hist, generator=torch.Generator().manual_seed(2), n=400)
    after = shares(draw(3))
    tv_before, tv_after = 0.5 * np.abs(before - hist.numpy()).sum(), 0.5 * np.abs(after - hist.numpy()).sum()
    assert tv_after < 0.03 < 0.2 < tv_before, (tv_before, tv_after)
    assert (G.tone_x.diff() > 0).all() and (G.tone_y.diff() >= 0).all()


def test_the_map_never_stretches_a_nearly_flat_generator_more_than_the_slope_cap():
    """A G that draws nearly one grey (a flat class mean: colours averaged out, little signal) would have its small
    differences, noise included, stretched over the whole histogram by an exact match: no segment is steeper than
    TONE_MAX_SLOPE, so its pixels' spread grows at most that much."""
    G = spread_generator(0.05)
    hist = torch.full((16,), 1 / 16)  # pixels spread over the whole range
    z, y = torch.randn(300, 10, generator=torch.Generator().manual_seed(1)), torch.arange(300) % 4
    with torch.no_grad():
        before = G(z, y).std()
        warmup.match_tones(G, hist, generator=torch.Generator().manual_seed(2), n=300)
        after = G(z, y).std()
    slopes = G.tone_y.diff() / G.tone_x.diff()
    assert slopes.max() <= warmup.TONE_MAX_SLOPE + 1e-4 and (slopes >= 0).all()
    assert after <= warmup.TONE_MAX_SLOPE * before * 1.01
    assert after > 2 * before  # it still stretches, as far as the cap allows


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


def test_colour_images_keep_their_generators_own_values(tmp_path):
    """One monotone map of every channel together cannot give colours: with train.g_tone on, a generator of RGB
    images has no tone layer, a generator of grey images has one (the warm-up sets the map only where G has one)."""
    from dpsynth.methods.networks import dcgan_models, generator_record

    cfg = tiny(tmp_path, "train.g_tone=true")
    grey, _ = dcgan_models(cfg, num_classes=2, image_shape=(1, 28, 28))
    colour, _ = dcgan_models(cfg, num_classes=2, image_shape=(3, 28, 28))
    assert grey.tone and not colour.tone and not hasattr(colour, "tone_x")
    gs = tiny(tmp_path, "train.g_tone=true", "train.method=gswgan", "gswgan.generator=dcgan")
    assert generator_record(gs, {"num_classes": 2, "channels": 1, "image_size": 16})["tone"] is True
    assert "tone" not in generator_record(gs, {"num_classes": 2, "channels": 3, "image_size": 16})
