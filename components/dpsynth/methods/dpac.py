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

from dpsynth.methods.gswgan import GSWGANTrainer, real_batch
from dpsynth.methods.networks import gswgan_adam
from dpsynth.training.seeds import derived_seed, init_with_seed
from dpsynth.models.gswgan_networks import Classifier


def balanced_labels(n: int, num_classes: int) -> torch.Tensor:
    """0, 1, …, K−1, 0, 1, …: every class n // K or n // K + 1 times."""
    return torch.arange(n) % num_classes


class DPACTrainer(GSWGANTrainer):
    method = "dpac"
    DATA_PARALLEL = True  # as GS-WGAN: C is trained, like D_k, by the rank holding shard k

    def generator_loss(self, k: int) -> Callable:
        d = self.cfg.dpac
        if self.step < d.start_iteration:
            return super().generator_loss(k)
        C = self.train_classifier(k).eval().requires_grad_(False)
        return lambda x, y: d.beta * (-self.D(x, y)) + (1 - d.beta) * F.cross_entropy(C(x), y, reduction="none")

    def train_classifier(self, k: int) -> Classifier:
        """A fresh C: n_f steps on a fixed class-balanced fake batch, then n_r steps on shard k."""
        cfg, d, B = self.cfg, self.cfg.dpac, self.cfg.gswgan.batch_size
        C = init_with_seed(derived_seed(cfg.train.seed, "classifier", self.step),
                            lambda: Classifier(**{**self.spec, "width": d.c_width})).to(self.device)
        opt = gswgan_adam(C.parameters(), lr=d.lr_c, cfg=cfg)
        fake_y = balanced_labels(B, self.num_classes).to(self.device)
        with torch.no_grad():
            z = torch.randn(B, self.G.latent_dim, device=self.device, generator=self.rng)
            fake_x = self.G(z, fake_y)
        images, labels = self.shards[k]
        batches = [(fake_x, fake_y)] * d.n_f
        batches += [real_batch(images, labels, size=B, rng=self.data_rng) for _ in range(d.n_r)]
        for x, y in batches:  # sequential: all fake steps, then all real steps
            loss = F.cross_entropy(C(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return C


__all__ = ["DPACTrainer", "balanced_labels"]
