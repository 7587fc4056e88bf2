"""GS-WGAN networks: shapes, ranges, conditioning, per-record independence, spectral norm."""

import pytest
import torch

from dpsynth.errors import ConfigError
from dpsynth.models.gswgan_networks import Classifier, Discriminator, Generator, without_spectral_norm


@pytest.mark.parametrize("size, channels", [(28, 1), (32, 3)])
def test_shapes_and_range(size, channels):
    torch.manual_seed(0)
    G = Generator(num_classes=10, channels=channels, image_size=size, width=4, latent_dim=6)
    D = Discriminator(num_classes=10, channels=channels, image_size=size, width=4)
    C = Classifier(num_classes=10, channels=channels, image_size=size, width=4)
    x, y = G.sample(7, generator=torch.Generator().manual_seed(0))
    assert x.shape == (7, channels, size, size) and x.abs().max() <= 1
    assert y.shape == (7,) and 0 <= y.min() and y.max() < 10
    assert D(x, y).shape == (7,) and C(x).shape == (7, 10)


def test_sample_follows_the_given_labels_and_the_label_matters():
    torch.manual_seed(0)
    G = Generator(num_classes=10, width=4).eval()
    labels = torch.arange(10)
    _, y = G.sample(10, labels=labels)
    assert torch.equal(y, labels)
    z = torch.randn(1, G.latent_dim).repeat(2, 1)
    a, b = G(z, torch.tensor([3, 7]))
    assert not torch.allclose(a, b)


def test_critic_value_of_a_record_depends_on_that_record_alone():
    """No batch statistics: what makes ∂Σℓ/∂x_i the per-sample gradient of the generator step."""
    torch.manual_seed(0)
    D = Discriminator(num_classes=10, width=4).eval()
    x, y = torch.randn(5, 1, 28, 28), torch.randint(0, 10, (5,))
    other = x.clone()
    other[1:] = torch.randn(4, 1, 28, 28)
    assert D(x, y)[0].item() == pytest.approx(D(other, y)[0].item(), rel=1e-6)
    leaf = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(D(leaf, y).sum(), leaf)
    one = x[2:3].clone().requires_grad_(True)
    (alone,) = torch.autograd.grad(D(one, y[2:3]).sum(), one)
    torch.testing.assert_close(grad[2:3], alone)


def test_discriminator_layers_are_spectrally_normalised():
    torch.manual_seed(0)
    D = Discriminator(num_classes=10, width=4)
    for _ in range(30):  # power iterations converge in training mode
        D(torch.randn(2, 1, 28, 28), torch.randint(0, 10, (2,)))
    D.eval()
    w = D.linear.weight
    assert torch.linalg.matrix_norm(w, ord=2).item() == pytest.approx(1.0, rel=1e-3)
    w3 = D.conv3.weight.flatten(1)
    assert torch.linalg.matrix_norm(w3, ord=2).item() == pytest.approx(1.0, rel=1e-3)


def test_plain_copy_computes_the_same_function_and_pickles():
    import pickle

    torch.manual_seed(0)
    G = Generator(num_classes=10, width=4).eval()
    plain = without_spectral_norm(G)
    z, y = torch.randn(3, G.latent_dim), torch.arange(3)
    torch.testing.assert_close(plain(z, y), G(z, y))
    assert pickle.loads(pickle.dumps(plain)) is not None
    with pytest.raises(RuntimeError):
        pickle.dumps(G)
    torch.testing.assert_close(plain(z, y), G(z, y))  # G itself is untouched


def test_unsupported_size_is_a_config_error():
    with pytest.raises(ConfigError, match="image size"):
        Generator(num_classes=10, image_size=64)
