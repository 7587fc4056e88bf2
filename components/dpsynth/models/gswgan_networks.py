"""GS-WGAN networks (Chen, Orekondy & Fritz 2020, §5.1) and DPAC's auxiliary classifier (Chen et al. 2023).

* :class:`Generator`: the ResNet generator "adapted from BigGAN": (z, one-hot y) → a spectrally
  normalised linear layer to a 4×4 map of 4·width channels, three residual up-sampling blocks
  (4→8→16→32) with pixel norm and spectrally normalised 3×3 convolutions, a 3×3 output
  convolution, cropped to the image size, tanh to [-1, 1] (the authors output [0, 1]).
* :class:`Discriminator`: the DCGAN critic with spectral norm on every layer: three 5×5
  stride-2 convolutions (28→14→7→4 or 32→16→8→4), a linear output, and a label projection
  ⟨embed(y), h⟩ added to it. No normalisation across the batch, so each record's critic value
  (and its gradient w.r.t. that record) depends on that record alone.
* :class:`Classifier`: DPAC's auxiliary classifier, the same DCGAN trunk without spectral norm or
  labels, ending in class logits.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm

from dpsynth.errors import ConfigError
from dpsynth.models.dcgan import ConditionalGenerator

SUPPORTED_SIZES = (28, 32)


def _check_size(image_size: int) -> None:
    if image_size not in SUPPORTED_SIZES:
        raise ConfigError(f"image size: GS-WGAN networks support {SUPPORTED_SIZES} pixels square, got {image_size}")


def pixel_norm(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + eps)


class GBlock(nn.Module):
    """Residual block: pixel norm → 2× nearest upsample → conv → ReLU(pixel norm) → conv, plus a 1×1 shortcut."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = spectral_norm(nn.Conv2d(channels, channels, 3, padding=1))
        self.conv2 = spectral_norm(nn.Conv2d(channels, channels, 3, padding=1))
        self.shortcut = spectral_norm(nn.Conv2d(channels, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.interpolate(pixel_norm(x), scale_factor=2)
        h = self.conv2(F.relu(pixel_norm(self.conv1(h))))
        return h + self.shortcut(F.interpolate(x, scale_factor=2))


class Generator(ConditionalGenerator):
    """G(z, y) -> image in [-1, 1]; conditional through a one-hot label concatenated to z."""

    def __init__(self, *, num_classes: int, channels: int = 1, image_size: int = 28, width: int = 64,
                 latent_dim: int = 10):
        super().__init__()
        _check_size(image_size)
        self.num_classes, self.channels, self.image_size = num_classes, channels, image_size
        self.width, self.latent_dim = width, latent_dim
        self.init_kwargs = {"num_classes": num_classes, "channels": channels, "image_size": image_size,
                            "width": width, "latent_dim": latent_dim}
        self.fc = spectral_norm(nn.Linear(latent_dim + num_classes, 4 * 4 * 4 * width))
        self.blocks = nn.Sequential(GBlock(4 * width), GBlock(4 * width), GBlock(4 * width))
        # 32×32 after the blocks; a 3×3 conv without padding gives 30 (cropped to 28), with padding 32
        self.out = spectral_norm(nn.Conv2d(4 * width, channels, 3, padding=0 if image_size == 28 else 1))

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.fc(torch.cat([z, F.one_hot(y.view(-1), self.num_classes).to(z.dtype)], dim=1))
        h = pixel_norm(F.relu(h.view(-1, 4 * self.width, 4, 4)))
        x = self.out(self.blocks(h))[:, :, : self.image_size, : self.image_size]
        return torch.tanh(x)


class Discriminator(nn.Module):
    """D(x, y) -> critic value (WGAN: unbounded real). Spectral norm everywhere, label projection."""

    def __init__(self, *, num_classes: int, channels: int = 1, image_size: int = 28, width: int = 64):
        super().__init__()
        _check_size(image_size)
        self.width = width
        self.conv1 = spectral_norm(nn.Conv2d(channels, width, 5, stride=2, padding=2))
        self.conv2 = spectral_norm(nn.Conv2d(width, 2 * width, 5, stride=2, padding=2))
        self.conv3 = spectral_norm(nn.Conv2d(2 * width, 4 * width, 5, stride=2, padding=2))
        self.linear = spectral_norm(nn.Linear(4 * 4 * 4 * width, 1))
        self.embed_y = spectral_norm(nn.Embedding(num_classes, 4 * 4 * 4 * width))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv1(x))
        h = F.relu(self.conv2(h))
        h = F.relu(self.conv3(h)).flatten(1)
        return self.linear(h).view(-1) + (self.embed_y(y.view(-1)) * h).sum(dim=1)


class Classifier(nn.Module):
    """C(x) -> class logits: the DCGAN trunk of :class:`Discriminator`, plain convolutions."""

    def __init__(self, *, num_classes: int, channels: int = 1, image_size: int = 28, width: int = 64):
        super().__init__()
        _check_size(image_size)
        self.net = nn.Sequential(
            nn.Conv2d(channels, width, 5, stride=2, padding=2), nn.LeakyReLU(0.2),
            nn.Conv2d(width, 2 * width, 5, stride=2, padding=2), nn.LeakyReLU(0.2),
            nn.Conv2d(2 * width, 4 * width, 5, stride=2, padding=2), nn.LeakyReLU(0.2),
            nn.Flatten(), nn.Linear(4 * 4 * 4 * width, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def without_spectral_norm(G: Generator) -> Generator:
    """A copy of G whose spectrally normalised weights are baked in as plain weights (picklable, e.g.
    for MLflow's model logging; parametrized modules serialize only through state_dict). Built anew
    rather than deep-copied: a deep copy shares the parametrized classes, and removing the
    parametrization from one would remove it from the other."""
    from torch.nn.utils import parametrize

    plain = Generator(**G.init_kwargs).to(next(G.parameters()).device)
    plain.load_state_dict(G.state_dict())
    plain.eval()
    for m in plain.modules():
        if parametrize.is_parametrized(m):
            for name in list(m.parametrizations):
                parametrize.remove_parametrizations(m, name, leave_parametrized=True)
    return plain


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


@torch.no_grad()
def refresh_spectral_norm(G: torch.nn.Module, iterations: int = 10) -> None:
    """Re-estimate the spectral norms of G's weights (e.g. an EMA copy's) by power iteration (no data involved)."""
    was_training = G.training
    G.train()
    z = torch.zeros(1, G.latent_dim, device=next(G.parameters()).device)
    y = torch.zeros(1, dtype=torch.long, device=z.device)
    for _ in range(iterations):
        G(z, y)
    G.train(was_training)


@torch.no_grad()
def ema_update(ema: nn.Module, model: nn.Module, *, decay: float) -> None:
    """``ema`` ← decay·``ema`` + (1 − decay)·``model``, parameter by parameter; its buffers copied from ``model``."""
    for p_ema, p in zip(ema.parameters(), model.parameters()):
        p_ema.lerp_(p, 1 - decay)
    for b_ema, b in zip(ema.buffers(), model.buffers()):
        b_ema.copy_(b)


@contextlib.contextmanager
def frozen(D: nn.Module):
    """``D`` without parameter gradients and in eval mode (spectral norm uses its stored estimate, no update)
    inside; trainable again after."""
    D.requires_grad_(False).eval()
    try:
        yield D
    finally:
        D.requires_grad_(True).train()
