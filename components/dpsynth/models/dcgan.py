"""Label-conditioned DCGAN without BatchNorm (Bie et al., "Private GANs, Revisited", App. B.1).

Five-layer fully convolutional DCGAN adapted to 28×28 (MNIST, Fashion-MNIST) or 32×32
(CelebA) images: BatchNorm removed (incompatible with per-example gradients), a label
embedding added to each network, PyTorch default initialisation. At width 128 the
discriminator has ≈1.72M parameters, as the paper states, and the generator ≈2.16M
(the paper reports 2.27M; its exact generator layout is not given in the text).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dpsynth.errors import ConfigError

SUPPORTED_SIZES = (28, 32)
LATENT_CONTROLS = 6  # z[:, :6]: the uniforms Φ(z) of the warp (rotation, shear, scale, x/y shift, stroke width)
STYLE_LATENT = 6  # with styles > 1, z[:, 6] picks the style slot (Φ(z₆) cut into equal parts)
TONE_KNOTS = 64  # the tone layer's segments: a monotone piecewise-linear map of [-1, 1] onto itself


def _check_size(image_size: int) -> None:
    if image_size not in SUPPORTED_SIZES:
        raise ConfigError(f"image size: DCGAN supports {SUPPORTED_SIZES} pixels square, got {image_size}")


class Discriminator(nn.Module):
    """D(x, y) -> logit that (x, y) is real. The label is embedded as an extra input channel."""

    def __init__(self, *, num_classes: int, channels: int = 1, image_size: int = 28, width: int = 128):
        super().__init__()
        _check_size(image_size)
        self.image_size = image_size
        self.label_embedding = nn.Embedding(num_classes, image_size * image_size)
        # 28: 28→14→7→4→1 ; 32: 32→16→8→4→1
        k3, s3, p3 = (3, 2, 1) if image_size == 28 else (4, 2, 1)
        self.net = nn.Sequential(
            nn.Conv2d(channels + 1, width, 4, 2, 1),
            nn.LeakyReLU(0.2),
            nn.Conv2d(width, 2 * width, 4, 2, 1),
            nn.LeakyReLU(0.2),
            nn.Conv2d(2 * width, 4 * width, k3, s3, p3),
            nn.LeakyReLU(0.2),
            nn.Conv2d(4 * width, 1, 4, 1, 0),
        )

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # (B, 1) indices: Opacus' expanded-weights mode needs a batch dimension on every input
        label_map = self.label_embedding(y.view(-1, 1)).view(-1, 1, self.image_size, self.image_size)
        return self.net(torch.cat([x, label_map], dim=1)).view(-1)


class ConditionalGenerator(nn.Module):
    """What every dpsynth generator offers besides ``forward(z, y)``: ``num_classes``, ``latent_dim``
    and :meth:`sample` (the interface ``dpsynth sample`` relies on)."""

    num_classes: int
    latent_dim: int

    def sample(self, n: int, *, labels: torch.Tensor | None = None, generator: torch.Generator | None = None):
        """Draw n images (and their labels, uniform over classes unless given); z ~ N(0, I)."""
        device = next(self.parameters()).device
        if labels is None:
            labels = torch.randint(0, self.num_classes, (n,), device=device, generator=generator)
        z = torch.randn(n, self.latent_dim, device=device, generator=generator)
        return self(z, labels), labels


class Generator(ConditionalGenerator):
    """G(z, y) -> image in [-1, 1].

    The latent and the label each pass through their own first layer to a 4×4 map of 2·width
    channels; the two maps are concatenated and upsampled (4→7→14→28, or 4→8→16→32).
    LeakyReLU(0.2) throughout, tanh at the end.

    ``warp`` ends G with a fixed, parameter-free layer: the canonical image the network draws is deformed by
    :func:`deform` with the uniforms Φ(z[:, :6]) (rotation, shear, scale, shift, stroke width), so the network
    need not learn those warps itself (the private warm-up's regression loses less; G(z, y) stays the
    interface, differentiable for the GAN steps).

    ``contrast`` s > 0 ends G (after the warp) with a second fixed layer, x ↦ tanh(s·x) / tanh(s): it keeps
    −1, 0 and 1 and pushes grey pixels towards ink or background. The warm-up fits the canonical image to
    noisy means of many records, which are blurred strokes; real digits are nearly two-tone.

    ``tone`` ends G (after the warp and any contrast) with a fixed monotone piecewise-linear map of [-1, 1]
    (:func:`tone_map`, TONE_KNOTS segments, its knots the buffers ``tone_x`` → ``tone_y``; the identity until set).
    The private warm-up sets it after its fit so that G's pixels have the intensity histogram the warm-up
    released (:func:`dpsynth.warmup.fit.match_tones`): what the contrast layer does for two-tone digits, read
    off the data's own released tones instead of assumed. The GAN steps train through it.

    ``styles`` > 1 gives every class that many learned 4×4 maps instead of one, and z[:, 6] picks which
    (a discrete choice, uniform over the slots): the private warm-up fits one released style image per
    slot (``dpsynth.warmup.fit``). The interface is unchanged: G(z, y) with y the class.
    """

    def __init__(self, *, num_classes: int, channels: int = 1, image_size: int = 28, width: int = 128,
                 latent_dim: int = 100, styles: int = 1, warp: bool = False, contrast: float = 0.0,
                 tone: bool = False):
        super().__init__()
        _check_size(image_size)
        if styles < 1 or (styles > 1 and latent_dim <= STYLE_LATENT):
            raise ConfigError(f"generator: styles={styles} needs styles >= 1 and latent_dim > {STYLE_LATENT}")
        self.latent_dim = latent_dim
        self.num_classes = num_classes
        self.channels, self.image_size = channels, image_size
        self.width = width
        self.styles = styles
        if warp and latent_dim < LATENT_CONTROLS:
            raise ConfigError(f"generator: warp needs latent_dim >= {LATENT_CONTROLS}")
        self.warp = bool(warp)
        if contrast < 0:
            raise ConfigError(f"generator: contrast must be >= 0, got {contrast}")
        self.contrast = float(contrast)
        self.tone = bool(tone)
        if self.tone:  # buffers: in the state dict, so a checkpoint and the released generator keep the map
            self.register_buffer("tone_x", torch.linspace(-1, 1, TONE_KNOTS + 1))
            self.register_buffer("tone_y", torch.linspace(-1, 1, TONE_KNOTS + 1))
        self.latent_branch = nn.ConvTranspose2d(latent_dim, 2 * width, 4, 1, 0)
        self.label_branch = nn.Embedding(num_classes * styles, 2 * width * 16)  # learned 4×4 maps per class
        k, p = (3, 1) if image_size == 28 else (4, 1)
        self.net = nn.Sequential(
            nn.ConvTranspose2d(4 * width, 2 * width, k, 2, p),
            nn.LeakyReLU(0.2),
            nn.ConvTranspose2d(2 * width, width, 4, 2, 1),
            nn.LeakyReLU(0.2),
            nn.ConvTranspose2d(width, channels, 4, 2, 1),
            nn.Tanh(),
        )

    def describe(self) -> dict:
        """Its class and keywords, as the generator file records them (``dpsynth.training.artifacts``)."""
        return {"class": "dpsynth.models.dcgan.Generator", "num_classes": self.num_classes, "channels": self.channels,
                "image_size": self.image_size, "width": self.width, "latent_dim": self.latent_dim,
                "styles": self.styles, "warp": self.warp, "contrast": self.contrast,
                **({"tone": True} if self.tone else {})}

    def slot(self, z: torch.Tensor) -> torch.Tensor:
        """The style slot z picks: ⌊Φ(z₆)·styles⌋ (0 when styles = 1)."""
        if self.styles == 1:
            return torch.zeros_like(z[:, 0], dtype=torch.long)  # not len(z): torch.export keeps the batch dynamic
        u = 0.5 * (1 + torch.erf(z[:, STYLE_LATENT] / math.sqrt(2)))
        return (u * self.styles).long().clamp(max=self.styles - 1)

    def canonical(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The image the network draws, before the fixed layers (the warp and the contrast)."""
        h_z = F.leaky_relu(self.latent_branch(z[:, :, None, None]), 0.2)
        index = y.view(-1) * self.styles + self.slot(z)
        h_y = F.leaky_relu(self.label_branch(index).view(-1, 2 * self.width, 4, 4), 0.2)
        return self.net(torch.cat([h_z, h_y], dim=1))

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = self.canonical(z, y)
        if self.warp:
            x = deform(x, 0.5 * (1 + torch.erf(z[:, :LATENT_CONTROLS] / math.sqrt(2))))
        if self.contrast:
            x = torch.tanh(self.contrast * x) / math.tanh(self.contrast)
        if self.tone:
            x = tone_map(x, self.tone_x, self.tone_y)
        return x


def tone_map(x: torch.Tensor, knots_x: torch.Tensor, knots_y: torch.Tensor) -> torch.Tensor:
    """The monotone piecewise-linear map through (knots_x[k], knots_y[k]) (both increasing, knots_x strictly),
    constant beyond the end knots: a sum of clamped ramps, differentiable and plain tensor arithmetic.

    >>> kx, ky = torch.tensor([-1.0, 0.0, 1.0]), torch.tensor([-1.0, 0.8, 1.0])
    >>> [round(v, 4) for v in tone_map(torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0]), kx, ky).tolist()]
    [-1.0, -0.1, 0.8, 0.9, 1.0]
    """
    lo, hi = knots_x[:-1], knots_x[1:]
    slope = (knots_y[1:] - knots_y[:-1]) / (hi - lo)
    t = torch.minimum(torch.maximum(x.unsqueeze(-1), lo), hi) - lo
    return knots_y[0] + (t * slope).sum(-1)



def deform(x: torch.Tensor, u: torch.Tensor, *, max_rotate: float = 15.0, max_shear: float = 0.25,
           scale: tuple[float, float] = (0.85, 1.1), max_shift: float = 0.1) -> torch.Tensor:
    """Deform images ``x`` (N×C×H×W in [-1, 1]) by uniforms ``u`` (N×6 in [0, 1]): rotation, shear,
    scale, x and y shift (fractions of the side), then stroke width (thinner below 1/3, thicker above 2/3)."""
    a = (2 * u[:, 0] - 1) * max_rotate * math.pi / 180
    shear = (2 * u[:, 1] - 1) * max_shear
    s = scale[0] + (scale[1] - scale[0]) * u[:, 2]
    tx, ty = (2 * u[:, 3] - 1) * max_shift * 2, (2 * u[:, 4] - 1) * max_shift * 2
    cos, sin = torch.cos(a) / s, torch.sin(a) / s
    theta = torch.stack([torch.stack([cos, -sin + shear, tx], 1), torch.stack([sin, cos, ty], 1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    # outside the image: its nearest edge pixel (a black border stays black; a light page or a coloured background
    # is not cut by black corners)
    x = F.grid_sample(x + 1, grid, align_corners=False, padding_mode="border") - 1  # (black: exactly 0, then -1)
    thick = F.max_pool2d(x, 3, 1, 1)
    thin = -F.max_pool2d(-x, 3, 1, 1)
    w = u[:, 5].view(-1, 1, 1, 1)
    x = torch.where(w > 2 / 3, 0.5 * (x + thick), torch.where(w < 1 / 3, 0.5 * (x + thin), x))
    return x.clamp(-1, 1)


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)
