"""Sample grids: one row per class, images from the generator, as a PIL image."""

from __future__ import annotations

import itertools

import numpy as np
import torch
from PIL import Image


@torch.no_grad()
def class_grid(generator, *, num_classes: int, per_class: int = 10, seed: int = 0, scale: int = 2) -> Image.Image:
    device = next(itertools.chain(generator.parameters(), generator.buffers())).device  # a painter has buffers only
    rng = torch.Generator(device=device).manual_seed(seed)
    labels = torch.arange(num_classes, device=device).repeat_interleave(per_class)
    was_training = generator.training
    generator.eval()
    images, _ = generator.sample(len(labels), labels=labels, generator=rng)
    generator.train(was_training)
    return tile(images, rows=num_classes, cols=per_class, scale=scale)


def tile(images: torch.Tensor, *, rows: int, cols: int, scale: int = 1, pad: int = 2) -> Image.Image:
    """Tile N×C×H×W images in [-1, 1] into one picture, row-major."""
    x = ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu().numpy()
    n, c, h, w = x.shape
    canvas = np.full((rows * (h + pad) + pad, cols * (w + pad) + pad, c), 255, dtype=np.uint8)
    for i in range(min(n, rows * cols)):
        r, k = divmod(i, cols)
        canvas[pad + r * (h + pad): pad + r * (h + pad) + h, pad + k * (w + pad): pad + k * (w + pad) + w] = x[i].transpose(1, 2, 0)
    img = Image.fromarray(canvas[..., 0] if c == 1 else canvas)
    return img.resize((img.width * scale, img.height * scale), Image.NEAREST) if scale > 1 else img
