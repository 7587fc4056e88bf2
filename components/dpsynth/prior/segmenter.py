"""A small public segmenter: a fully convolutional network that predicts a painted figure's mask from the painting.

It is trained only on the prior's own paintings (:mod:`dpsynth.prior.figures` draws a mask from a public seed,
:mod:`dpsynth.prior.paint` paints it, graphic or photographic, in 3 or 1 channels; the target is that mask), by
``scripts/train_segmenter.py``; its weights (:data:`WEIGHTS`, a numpy ``.npz`` of the state dict, about 0.25 MB)
are committed with the command that made them. No record is an argument of its training, so it is a fixed public
function: applied to each record alone it adds no privacy event (docs/prior.md, "A public segmenter").

The input of the network is the image (RGB in [0, 1]; a grey image repeated on the three channels) and, as a fourth
channel, each pixel's distance from the image's background colour plane
(:func:`dpsynth.prior.ground.background_distance`). Its output is a probability map in [0, 1]
(:func:`predict`), which Private Evolution maps as it maps a candidate's mask drawn white on black.

>>> import numpy as np
>>> x = np.zeros((2, 32, 32, 3), np.uint8); x[:, 8:24, 8:24] = (250, 40, 40)
>>> p = predict(x); p.shape, p.dtype, bool(p.min() >= 0 and p.max() <= 1)
((2, 32, 32), dtype('float32'), True)
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from dpsynth.prior.ground import background_distance

WEIGHTS = Path(__file__).with_name("segmenter.npz")
WIDTHS = (12, 24, 32)  # channels at 32 × 32, 16 × 16 and 8 × 8


def inputs(images: np.ndarray) -> np.ndarray:
    """The network's input of uint8 images N × H × W × C (C = 1 or 3): float32 N × 4 × H × W (RGB in [0, 1], grey
    repeated, and the distance from the border's colour plane)."""
    x = images.astype(np.float32) / 255.0
    if x.shape[-1] == 1:
        x = np.repeat(x, 3, axis=-1)
    d = background_distance(images).astype(np.float32)[..., None]
    return np.ascontiguousarray(np.concatenate([x, d], -1).transpose(0, 3, 1, 2))


def network():
    """The segmenter's network (a small U-Net of :data:`WIDTHS`), untrained: N × 4 × H × W → N × 1 × H × W logits
    (H, W multiples of 4)."""
    import torch
    from torch import nn

    a, b, c = WIDTHS

    def block(i, o, dilation=1):
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=dilation, dilation=dilation), nn.BatchNorm2d(o), nn.ReLU())

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.e1 = nn.Sequential(block(4, a), block(a, a))
            self.e2 = nn.Sequential(block(a, b), block(b, b))
            self.e3 = nn.Sequential(block(b, c), block(c, c, 2), block(c, c, 4))
            self.d2 = nn.Sequential(block(c + b, b), block(b, b))
            self.d1 = nn.Sequential(block(b + a, a), nn.Conv2d(a, 1, 1))

        def forward(self, x):
            up = lambda t: nn.functional.interpolate(t, scale_factor=2, mode="nearest")  # noqa: E731
            e1 = self.e1(x)
            e2 = self.e2(nn.functional.max_pool2d(e1, 2))
            e3 = self.e3(nn.functional.max_pool2d(e2, 2))
            d2 = self.d2(torch.cat([up(e3), e2], 1))
            return self.d1(torch.cat([up(d2), e1], 1))

    return UNet()


@lru_cache(maxsize=2)
def load(path: str = str(WEIGHTS)):
    """The network with the committed weights (``path``: a ``.npz`` of its state dict), in evaluation mode."""
    import torch

    net = network()
    with np.load(path) as z:
        state = {k: torch.from_numpy(z[k]) for k in z.files}
    net.load_state_dict(state)
    return net.eval()


def predict(images: np.ndarray, *, batch: int = 512, path: str = str(WEIGHTS)) -> np.ndarray:
    """The predicted figure mask of every uint8 image (N × H × W × C, C = 1 or 3; H, W multiples of 4): float32
    N × H × W in [0, 1], each image's a function of that image alone (evaluation mode: no batch statistics)."""
    import torch

    net = load(path)
    out = np.empty(images.shape[:3], np.float32)
    with torch.no_grad():
        for lo in range(0, len(images), batch):
            x = torch.from_numpy(inputs(images[lo:lo + batch]))
            out[lo:lo + batch] = torch.sigmoid(net(x))[:, 0].numpy()
    return out
