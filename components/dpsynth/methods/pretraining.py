"""The methods' non-private pre-training runs, which the pretrain stage runs (:mod:`dpsynth.stages.pretrain`; the
registry's ``pretrain`` kind): each trains on what it may read without privacy and writes a file that stays in
the sensitive zone, which the method's trainer reads back.

* ``"shard"`` — :func:`pretrain_shard` (GS-WGAN, Algorithm 1 lines 2–10; DPAC and the federated clients
  alike): D_k pre-trained on shard k with a throw-away generator;
* ``"public"`` — :func:`pretrain` (dp-GAN of Zhang et al., Algorithm 3 line 1): G and D as a regular WGAN-GP
  on the public records only.
"""

from __future__ import annotations

import time

import torch

from dpsynth import storage
from dpsynth.config import RunConfig
from dpsynth.data import ImageDataset
from dpsynth.data import assignment
from dpsynth.methods import discriminator_steps
from dpsynth.methods.generator_step import generator_step
from dpsynth.methods.gswgan_critic import critic_steps
from dpsynth.methods.networks import (DISCRIMINATOR_FORMAT, PRETRAINED_FORMAT, dcgan_models, discriminator_kwargs,
                                      fresh_discriminator, gswgan_adam, image_spec, make_generator,
                                      warm_models_record)
from dpsynth.methods.wgan_gp import N_CRITIC, wgan_gp_loss
from dpsynth.training.artifacts import model_file_bytes
from dpsynth.training.result import resolve_device
from dpsynth.training.seeds import cpu_rng, derived_seed, init_with_seed


def pretrain_shard(cfg: RunConfig, shard: ImageDataset, *, shard_index: int, out_path: str) -> dict:
    """Pre-train D_k non-privately on ``shard`` with a throw-away generator; write D_k to ``out_path``.

    ``gswgan.pretrain_iterations`` iterations of n_dis critic steps and one generator step.
    Deterministic given train.seed and ``shard_index``. The file stays in the sensitive zone.
    """
    started = time.monotonic()
    device = resolve_device(cfg.train.device)
    spec = image_spec(cfg, shard)
    g = cfg.gswgan
    D = fresh_discriminator(cfg, spec, shard_index=shard_index).to(device)
    G = init_with_seed(derived_seed(cfg.train.seed, "pretrain-generator", shard_index),
                        lambda: make_generator(cfg, spec)).to(device)
    opt_d, opt_g = gswgan_adam(D.parameters(), lr=g.lr_d, cfg=cfg), gswgan_adam(G.parameters(), lr=g.lr_g, cfg=cfg)
    images, labels = (t.to(device) for t in shard.to_tensors())
    data_rng = cpu_rng(cfg.train.seed, "pretrain-data", shard_index)
    rng = torch.Generator(device=device).manual_seed(derived_seed(cfg.train.seed, "pretrain-latent", shard_index))
    for _ in range(g.pretrain_iterations):
        critic_steps(D, opt_d, G, images, labels, cfg=cfg, data_rng=data_rng, rng=rng)
        generator_step(G, D, opt_g, g.batch_size, rng)  # −E[D_k(G(z))]
    seconds = time.monotonic() - started
    storage.write_bytes(out_path, model_file_bytes(DISCRIMINATOR_FORMAT, {
        "shard": shard_index, "iterations": g.pretrain_iterations, "model": discriminator_kwargs(cfg, spec),
        "state_dict": {k: v.detach().cpu() for k, v in D.state_dict().items()}}))
    return {"shard": shard_index, "iterations": g.pretrain_iterations, "seconds": seconds,
            "iterations_per_second": g.pretrain_iterations / seconds if seconds > 0 else None}


def pretrain(cfg: RunConfig, public: ImageDataset, *, out_path: str) -> dict:
    """Train G and D as a regular WGAN-GP on ``public`` (no privacy, so public records only) for
    ``zhang.pretrain_iterations`` generator iterations; write both to the local file ``out_path``."""
    assignment.require_public(cfg, public, what="pre-training")
    z, t = cfg.zhang, cfg.train
    started = time.monotonic()
    device = resolve_device(t.device)
    num_classes = cfg.data.num_classes or public.num_classes
    images, labels = (a.to(device) for a in public.to_tensors())
    image_shape = tuple(images.shape[1:])
    torch.manual_seed(t.seed)
    G, D = dcgan_models(cfg, num_classes=num_classes, image_shape=image_shape)
    G, D = G.to(device), D.to(device)
    rng = torch.Generator(device=device).manual_seed(t.seed + 1)
    betas = (z.adam_beta1, z.adam_beta2)
    opt_d = torch.optim.Adam(D.parameters(), lr=z.lr, betas=betas)
    opt_g = torch.optim.Adam(G.parameters(), lr=z.lr, betas=betas)
    m, n_critic = min(t.batch_size, len(public)), discriminator_steps.n_d(cfg, N_CRITIC)
    for _ in range(z.pretrain_iterations):
        for _ in range(n_critic):
            idx = torch.randperm(len(public), device=device, generator=rng)[:m]
            real, y = images[idx], labels[idx]
            with torch.no_grad():
                fake, _ = G.sample(m, labels=y, generator=rng)
            rho = torch.rand(m, device=device, generator=rng)
            loss_d = wgan_gp_loss(D, real, fake, y, rho, gp_weight=z.gp_weight)
            opt_d.zero_grad(set_to_none=True)
            loss_d.backward()
            opt_d.step()
        generator_step(G, D, opt_g, m, rng)
    state = {"G": G.state_dict(), "D": D.state_dict(),
             "model": warm_models_record(cfg, num_classes=num_classes, image_shape=image_shape),
             "iterations": z.pretrain_iterations, "public_records": len(public)}
    storage.write_bytes(out_path, model_file_bytes(PRETRAINED_FORMAT, state))
    return {"iterations": z.pretrain_iterations, "public_records": len(public), "critic_steps_per_iteration": n_critic,
            "seconds": time.monotonic() - started}
