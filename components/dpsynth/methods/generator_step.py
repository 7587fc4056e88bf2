"""One non-private generator step through a discriminator: the one implementation DPGAN's, dp-GAN's and the
pre-training runs' generator steps share.

G draws a fresh batch of latents and labels from ``generator`` (a public stream, train.seed), D scores it with
its weights frozen, and G takes one optimizer step on the loss. Nothing reads a record: when D is the
privatized discriminator the step is post-processing, and in a pre-training D is non-private but stays in the
sensitive zone with G.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


def wasserstein(scores: torch.Tensor) -> torch.Tensor:
    """WGAN's generator loss −E[D(G(z))] (dp-GAN, GS-WGAN's pre-training)."""
    return -scores.mean()


def non_saturating(logits: torch.Tensor) -> torch.Tensor:
    """The non-saturating GAN loss −E[log D(G(z))] on D's logits (DPGAN, Bie et al. Algorithm 1)."""
    return F.softplus(-logits).mean()


def generator_step(G: torch.nn.Module, D: torch.nn.Module, opt_g: torch.optim.Optimizer, batch_size: int,
                   generator: torch.Generator, *, loss: Callable[[torch.Tensor], torch.Tensor] = wasserstein) -> float:
    """One step of ``opt_g`` on ``loss(D(G(z), y))`` for ``batch_size`` fresh (z, y) from ``generator``, D frozen
    (its parameters take no gradient; restored after); returns the loss."""
    D.requires_grad_(False)
    try:
        fake, labels = G.sample(batch_size, generator=generator)
        value = loss(D(fake, labels))
        opt_g.zero_grad(set_to_none=True)
        value.backward()
        opt_g.step()
    finally:
        D.requires_grad_(True)
    return value.item()
