"""DP-GAN-DPAC (Chen, Liu, Ma, Nepal & Xu, CVPR 2023, Algorithm 1): GS-WGAN plus a dual-purpose
auxiliary classifier.

From generator iteration t_c (``dpac.start_iteration``) on, each iteration on shard k also
initialises a fresh classifier C and trains it *sequentially*: ``n_f`` steps on one fixed,
class-balanced batch of B fakes from the current G (the gen2real purpose), then ``n_r`` steps on
real batches of shard k (the real2gen purpose). The generator's per-sample loss is then

    ℓ_i = β · (−D_k(x_i, y_i)) + (1 − β) · CE(C(x_i), y_i),

combined *before* sanitization, so each of the B per-sample gradients ∂ℓ_i/∂x_i is clipped and
noised once — one release per sample, exactly GS-WGAN's mechanism and accounting (the authors'
code sanitizes the D and C paths separately while counting one, and lets its generator step
use a batch of 1000; here the step keeps batch size B). C and D_k touch shard k only.

Classifier loss: cross-entropy, for training C and as the generator's feedback. The paper
writes the objective as −E[C(G(z, y), y)] and describes the real2gen feedback as "the
validation loss" of a classifier — a classification loss; we read C(x, y) as the
log-probability of class y, i.e. cross-entropy, rather than the raw logit (margin) score.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from dpsynth.config import RunConfig
from dpsynth.methods.gswgan import N_DIS, GSWGANState, GSWGANTrainer, real_batch
from dpsynth.methods.pretraining import pretrain_shard
from dpsynth.methods.method import Audit, Method
from dpsynth.mechanisms.generator_gradient import GSWGAN
from dpsynth.methods.networks import gswgan_adam
from dpsynth.training.seeds import derived_seed, init_with_seed
from dpsynth.models.gswgan_networks import Classifier


def balanced_labels(n: int, num_classes: int) -> torch.Tensor:
    """0, 1, …, K−1, 0, 1, …: every class n // K or n // K + 1 times."""
    return torch.arange(n) % num_classes


def train_classifier(state: GSWGANState, shard: tuple[torch.Tensor, torch.Tensor], *, cfg: RunConfig, spec: dict,
                     iteration: int) -> Classifier:
    """A fresh C (seeded by train.seed and ``iteration``): n_f steps on a fixed class-balanced batch of B fakes from
    the current G, then n_r steps on real batches of ``shard`` (shard k's records); not private."""
    d, B, device = cfg.dpac, cfg.gswgan.batch_size, shard[0].device
    C = init_with_seed(derived_seed(cfg.train.seed, "classifier", iteration),
                       lambda: Classifier(**{**spec, "width": d.c_width})).to(device)
    opt = gswgan_adam(C.parameters(), lr=d.lr_c, cfg=cfg)
    fake_y = balanced_labels(B, spec["num_classes"]).to(device)
    with torch.no_grad():
        z = torch.randn(B, state.G.latent_dim, device=device, generator=state.rng)
        fake_x = state.G(z, fake_y)
    batches = [(fake_x, fake_y)] * d.n_f
    batches += [real_batch(*shard, size=B, rng=state.data_rng) for _ in range(d.n_r)]
    for x, y in batches:  # sequential: all fake steps, then all real steps
        loss = F.cross_entropy(C(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return C


def generator_loss(state: GSWGANState, C: Classifier, *, beta: float) -> Callable:
    """ℓ_i = β · (−D_k(x_i, y_i)) + (1 − β) · CE(C(x_i), y_i): one loss, so one sanitized release per sample
    (GS-WGAN's :func:`~dpsynth.methods.gswgan.g_step` releases its gradient)."""
    C = C.eval().requires_grad_(False)
    return lambda x, y: beta * (-state.D(x, y)) + (1 - beta) * F.cross_entropy(C(x), y, reduction="none")


class DPACTrainer(GSWGANTrainer):
    """GS-WGAN's trainer and steps (:class:`~dpsynth.methods.gswgan.GSWGANState`: C is fresh every iteration), the
    generator's loss from iteration t_c on combined with a classifier trained on shard k (as D_k, by the rank
    holding it under torchrun)."""

    NAME = "dpac"

    def generator_loss(self, k: int) -> Callable:
        d = self.cfg.dpac
        if self.step < d.start_iteration:
            return super().generator_loss(k)
        C = train_classifier(self.state, self.shards[k], cfg=self.cfg, spec=self.spec, iteration=self.step)
        return generator_loss(self.state, C, beta=d.beta)



METHOD = Method(
    "dpac", trainer=DPACTrainer, mechanism=GSWGAN, pretrain="shard", pretrain_function=pretrain_shard,
    sections=("gswgan", "dpac"), default_n_d=N_DIS, networks="gswgan.generator", data_parallel=True,
    empirical_audit=Audit.INPUT_GRADIENT)

__all__ = ["METHOD", "DPACTrainer", "balanced_labels", "generator_loss", "train_classifier"]
