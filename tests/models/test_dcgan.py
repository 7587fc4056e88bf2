import pytest
import torch

from dpsynth.errors import ConfigError
from dpsynth.models.dcgan import Discriminator, Generator, count_parameters


def test_parameter_counts_match_the_paper():
    # Bie et al. App. B.1: D has 1.72M parameters at width 128 (MNIST); App. C: 2.64M for 32×32 RGB.
    assert count_parameters(Discriminator(num_classes=10)) / 1e6 == pytest.approx(1.72, abs=0.01)
    assert count_parameters(Discriminator(num_classes=2, channels=3, image_size=32)) / 1e6 == pytest.approx(2.64, abs=0.02)
    # G: the paper reports 2.27M (MNIST) and 3.16M (CelebA); the text does not give G's exact layout,
    # ours is within 5%.
    assert count_parameters(Generator(num_classes=10)) / 1e6 == pytest.approx(2.27, rel=0.05)
    assert count_parameters(Generator(num_classes=2, channels=3, image_size=32)) / 1e6 == pytest.approx(3.16, rel=0.05)


@pytest.mark.parametrize("size,channels", [(28, 1), (32, 3)])
def test_shapes(size, channels):
    g = Generator(num_classes=4, channels=channels, image_size=size, width=8)
    d = Discriminator(num_classes=4, channels=channels, image_size=size, width=8)
    x, y = g.sample(3, generator=torch.Generator().manual_seed(0))
    assert x.shape == (3, channels, size, size) and x.abs().max() <= 1
    assert d(x, y).shape == (3,)


def test_no_batchnorm():
    for m in (Generator(num_classes=10), Discriminator(num_classes=10)):
        assert not any(isinstance(mod, torch.nn.modules.batchnorm._BatchNorm) for mod in m.modules())


def test_unsupported_size_names_the_field():
    with pytest.raises(ConfigError, match="image size"):
        Discriminator(num_classes=10, image_size=64)


def test_a_warping_generator_deforms_its_canonical_image_by_its_latent():
    """warp=True: G(z, y) = deform(canonical(z, y), Φ(z[:, :6])) — a fixed layer, no parameters of its own."""
    import math

    from dpsynth.models.dcgan import Generator, deform

    torch.manual_seed(0)
    plain = Generator(num_classes=3, width=8, latent_dim=10)
    warped = Generator(num_classes=3, width=8, latent_dim=10, warp=True)
    warped.load_state_dict(plain.state_dict())  # same parameters: the warp adds none
    z, y = torch.randn(5, 10), torch.tensor([0, 1, 2, 0, 1])
    with torch.no_grad():
        expected = deform(plain(z, y), 0.5 * (1 + torch.erf(z[:, :6] / math.sqrt(2))))
        torch.testing.assert_close(warped(z, y), expected)
        assert not torch.allclose(warped(z, y), plain(z, y))
    z.requires_grad_(False)
    warped(z, y).sum().backward()  # differentiable for the GAN steps
    assert all(p.grad is not None for p in warped.parameters())


def test_the_contrast_layer_sharpens_greys_and_keeps_ink_background_and_midpoint():
    """contrast=s: G(z, y) = tanh(s·x) / tanh(s) of the (warped) image x — a fixed layer, no parameters of its
    own; −1, 0 and 1 stay where they are, a grey between them moves away from 0; 0 is no layer at all."""
    import math

    torch.manual_seed(0)
    plain = Generator(num_classes=3, width=8, latent_dim=10, warp=True)
    sharp = Generator(num_classes=3, width=8, latent_dim=10, warp=True, contrast=3.0)
    sharp.load_state_dict(plain.state_dict())
    z, y = torch.randn(5, 10), torch.tensor([0, 1, 2, 0, 1])
    with torch.no_grad():
        x = plain(z, y)
        torch.testing.assert_close(sharp(z, y), torch.tanh(3 * x) / math.tanh(3.0))
        torch.testing.assert_close(sharp.canonical(z, y), plain.canonical(z, y))
    assert ((sharp(z, y).abs() >= x.abs() - 1e-6) | (x.abs() > 1 - 1e-6)).all()
    layer = torch.tensor([-1.0, -0.3, 0.0, 0.3, 1.0])
    out = torch.tanh(3 * layer) / math.tanh(3.0)
    torch.testing.assert_close(out[[0, 2, 4]], layer[[0, 2, 4]])
    assert out[3] > 0.7 and out[1] < -0.7  # a grey of 0.3 (0.65 on [0, 1]) becomes 0.72 (0.86)
    assert sharp.describe()["contrast"] == 3.0 and plain.describe()["contrast"] == 0.0
    sharp(z, y).sum().backward()  # differentiable for the GAN steps
    assert all(p.grad is not None for p in sharp.parameters())
    with pytest.raises(ConfigError, match="contrast"):
        Generator(num_classes=3, width=8, contrast=-1.0)
