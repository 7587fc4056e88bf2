"""dp-GAN's critic loss (Zhang, Ji & Wang, Algorithm 3): the conditional WGAN-GP loss of one unit (a real record, a
fake and their interpolation), its batch mean (the non-private pre-training) and each unit's gradient (the private
critic step, :func:`dpsynth.methods.zhang.d_step`)."""

from __future__ import annotations

import torch
from torch.func import functional_call, grad, vmap

N_CRITIC = 4  # n_critic: the paper's critic steps per generator step (train.n_d's default for dp-GAN)


def unit_losses(D, real, fake, y, rho, *, gp_weight: float) -> torch.Tensor:
    """(m,): each unit's critic loss D(fake_i) − D(real_i) + λ(‖∇_x̂ D(x̂_i)‖ − 1)²."""
    x_hat = (rho.view(-1, 1, 1, 1) * real + (1 - rho.view(-1, 1, 1, 1)) * fake).requires_grad_(True)
    (g,) = torch.autograd.grad(D(x_hat, y).sum(), x_hat, create_graph=True)
    penalty = ((g.flatten(1).pow(2).sum(1) + 1e-12).sqrt() - 1).pow(2)
    return D(fake, y) - D(real, y) + gp_weight * penalty


def wgan_gp_loss(D, real, fake, y, rho, *, gp_weight: float) -> torch.Tensor:
    """The batch-mean critic loss (non-private: the pre-training)."""
    return unit_losses(D, real, fake, y, rho, gp_weight=gp_weight).mean()


def per_unit_gradients(D, real, fake, y, rho, *, gp_weight: float, chunk: int | None = None) -> dict[str, torch.Tensor]:
    """``{name: (m, *shape)}``: each unit's (real_i, fake_i, x̂_i) critic-loss gradient (Alg. 3 lines 25–31)."""
    params = {k: v.detach() for k, v in D.named_parameters()}

    def unit_loss(params, real, fake, y, rho):
        real, fake, y = real[None], fake[None], y[None]

        def critic(x):
            return functional_call(D, params, (x, y)).sum()

        gx = grad(critic)(rho * real + (1 - rho) * fake)
        penalty = ((gx.pow(2).sum() + 1e-12).sqrt() - 1) ** 2
        return critic(fake) - critic(real) + gp_weight * penalty

    per_unit = vmap(grad(unit_loss), in_dims=(None, 0, 0, 0, 0))
    m = len(real)
    if m == 0:
        return {k: v.new_zeros((0, *v.shape)) for k, v in params.items()}
    step = chunk or m
    parts = [per_unit(params, real[s:s + step], fake[s:s + step], y[s:s + step], rho[s:s + step])
             for s in range(0, m, step)]
    return {k: torch.cat([p[k] for p in parts]) for k in params}
