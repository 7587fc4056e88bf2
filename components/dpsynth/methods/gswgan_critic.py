"""GS-WGAN's non-private critic (Chen, Orekondy & Fritz 2020, supplement Algorithm 1): the WGAN-GP loss and the n_dis
critic steps on one shard, which both the private iteration (:func:`dpsynth.methods.gswgan.critic_step`) and the
per-shard pre-training (:func:`dpsynth.methods.pretraining.pretrain_shard`) take. Nothing here is private: a
critic reads its own shard, and only the generator's gradient through it is released."""

from __future__ import annotations

import torch

from dpsynth.config import RunConfig
from dpsynth.methods import discriminator_steps


def real_batch(images: torch.Tensor, labels: torch.Tensor, *, size: int, rng: torch.Generator):
    """``size`` records of one shard, drawn uniformly without replacement (all of them if fewer). ``rng`` (a public stream, shared by every shard) gives one seed, whatever the shard's size s; the
    permutation of s is drawn from that seed. So the stream's state afterwards does not depend on s: one
    record more or less in shard k cannot shift what the stream later draws for another shard or for G."""
    seed = int(torch.randint(0, 2**62, (1,), generator=rng))
    index = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))[:size].to(images.device)
    return images[index], labels[index]


def critic_loss(D, real_x, real_y, fake_x, *, gp_weight: float, drift_weight: float,
                generator: torch.Generator | None = None, draws: int | None = None) -> torch.Tensor:
    """WGAN-GP critic loss E[D(fake)] − E[D(real)] + λ·GP + ε_drift·E[D(real)²] (fakes carry the real labels).
    ``draws``: how many interpolation weights to draw from ``generator`` (the first len(real_x) are used),
    so that a public stream advances by the same amount whatever the batch's size; None: len(real_x)."""
    d_real = D(real_x, real_y)
    d_fake = D(fake_x, real_y)
    loss = d_fake.mean() - d_real.mean() + drift_weight * d_real.pow(2).mean()
    if gp_weight:
        alpha = torch.rand(max(draws or 0, len(real_x)), 1, 1, 1, device=real_x.device,
                           generator=generator)[:len(real_x)]
        mixed = (alpha * real_x + (1 - alpha) * fake_x).requires_grad_(True)
        (grad,) = torch.autograd.grad(D(mixed, real_y).sum(), mixed, create_graph=True)
        loss = loss + gp_weight * (grad.flatten(1).norm(dim=1) - 1).pow(2).mean()
    return loss


# n_dis: the paper's critic steps per generator iteration (train.n_d's default for GS-WGAN and DPAC)
N_DIS = 5


def critic_steps(D, opt_d, G, images, labels, *, cfg: RunConfig, data_rng: torch.Generator,
                 rng: torch.Generator) -> None:
    """n_dis (``train.n_d``) non-private WGAN-GP steps of D on one shard's (images, labels). A shard may hold s < B records (then the batch is all s of them); the public streams ``data_rng`` and
    ``rng`` still advance by B draws' worth (:func:`real_batch`; B latents and B interpolation weights, the
    first s used), so their state afterwards — and every later latent of G — does not depend on s."""
    g = cfg.gswgan
    for _ in range(discriminator_steps.n_d(cfg, N_DIS)):
        real_x, real_y = real_batch(images, labels, size=g.batch_size, rng=data_rng)
        with torch.no_grad():
            z = torch.randn(g.batch_size, G.latent_dim, device=real_x.device, generator=rng)[:len(real_x)]
            fake_x = G(z, real_y)
        loss = critic_loss(D, real_x, real_y, fake_x, gp_weight=g.gp_weight, drift_weight=g.drift_weight,
                           generator=rng, draws=g.batch_size)
        opt_d.zero_grad(set_to_none=True)
        loss.backward()
        opt_d.step()
