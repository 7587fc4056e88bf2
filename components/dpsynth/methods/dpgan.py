"""DPGAN, as in Bie, Kamath & Zhang, "Private GANs, Revisited" (Algorithm 1).

DP-SGD on the discriminator only: each step Poisson-samples real records at q = B/n, draws
B fake records from G, clips every per-example gradient (real and fake) to C, adds
N(0, σ²C²) to the sum and divides by 2B, the expected batch size. Every n_D discriminator
steps, one non-private generator step with the non-saturating loss. The generator touches
the data only through the privatized discriminator, so its release is post-processing.

The privacy cost is one Poisson-subsampled Gaussian event per discriminator step,
recorded in the mechanism trace; training stops before the step that would exceed ε
(the mechanism, its plan and statement: :data:`dpsynth.mechanisms.discriminator.DPGAN`).
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

from dpsynth import tracking
from dpsynth.config import RunConfig
from dpsynth.data import ImageDataset
from dpsynth.training import checkpoint, data_parallel
from dpsynth.methods import discriminator_steps
from dpsynth.methods.discriminator_steps import AdaptiveSteps, FixedSteps
from dpsynth.methods.generator_step import generator_step, non_saturating
from dpsynth.training.loop import Trainer
from dpsynth.methods.networks import dcgan_models
from dpsynth.mechanisms.discriminator import DPGAN
from dpsynth.mechanisms.dpsgd import private_module
from dpsynth.mechanisms.randomness import MechanismRandomness

# Opacus' hooks fire on module outputs because image inputs need no gradient; that is expected.
warnings.filterwarnings("ignore", message="Full backward hook is firing")


_PLAN = "the privacy plan: from the configuration and n (public), before any step"
_POST = "post-processing of the DP discriminator on fresh fakes (no real record enters)"


class DPGANTrainer(Trainer):
    """Trains a label-conditioned DCGAN with a DP-SGD discriminator; ``train()`` (:mod:`dpsynth.training.loop`)
    runs it to the end. One step is one discriminator step (Algorithm 1's n_D counts them per generator step)."""

    STEP = "DP discriminator steps"
    MECHANISM = DPGAN  # its plan, statement and sanitizer (dpsynth.mechanisms.discriminator)
    KEEPS_SNAPSHOTS = True
    STATE = ("since_g", "G", "D", "opt_g", "opt_d", "rng", "mechanism", checkpoint.TORCH_RNG, "n_d")
    DATA_PARALLEL = True  # across torchrun ranks: one noise draw per logical step (dpsynth.training.data_parallel)
    MLFLOW_KEYS = Trainer.MLFLOW_KEYS | tracking.LoggedKeys(metrics={
        "noise_multiplier": _PLAN, "sample_rate": _PLAN,
        "n_d": "the adaptive n_D schedule, driven by d_accuracy_fake_ema (post-processing)",
        "generator_steps": "follows the n_D schedule (post-processing)", "d_accuracy_fake": _POST,
        "d_accuracy_fake_ema": _POST, "g_loss": _POST})

    def __init__(self, cfg: RunConfig, dataset: ImageDataset, *, parent_run_id: str | None = None,
                 run_tags: dict[str, str] | None = None, mechanism_seed: int | None = None):
        """``mechanism_seed``: tests only (replaying the mechanism); None draws it from OS entropy."""
        super().__init__(cfg, parent_run_id=parent_run_id, run_tags=run_tags)
        t = cfg.train
        self.num_classes = cfg.data.num_classes or dataset.num_classes
        images, labels = dataset.to_tensors()
        self.images, self.labels = images.to(self.device), labels.to(self.device)
        self.n = len(dataset)
        _, channels, size, _ = self.images.shape
        self.image_shape = (channels, size, size)
        self.plan = DPGAN.plan(cfg, self.n)

        torch.manual_seed(t.seed)
        G, D = dcgan_models(cfg, num_classes=self.num_classes, image_shape=self.image_shape)
        self.G, self.D = G.to(self.device), D.to(self.device)
        self.D_private = private_module(self.D, t.grad_sample_mode)
        betas = (t.adam_beta1, t.adam_beta2)
        self.opt_d = torch.optim.Adam(self.D.parameters(), lr=t.lr_d, betas=betas)
        self.opt_g = torch.optim.Adam(self.G.parameters(), lr=t.lr_g, betas=betas)
        self.rng = torch.Generator(device=self.device).manual_seed(t.seed)  # latents and fake labels only
        # the secret coins: Poisson masks and noise (never train.seed)
        self.mechanism = MechanismRandomness(device=self.device, secure_mode=cfg.privacy.secure_mode,
                                             seed=self.dist.mechanism_seed(mechanism_seed))
        # records plan.event in the trace at every noisy release (finalize)
        self.sanitizer = DPGAN.sanitizer(cfg, self.plan, list(self.D.parameters()), randomness=self.mechanism,
                                         module=self.D_private, trace=self.trace)
        data_parallel.join(self)  # under torchrun: noise on rank 0, the clipped sums all-reduced
        n_d = discriminator_steps.n_d(cfg)  # n_D of Bie et al.
        self.n_d = AdaptiveSteps(threshold=t.n_d_threshold, beta=t.n_d_beta) if n_d == "adaptive" else FixedSteps(n_d)
        self.since_g = 0  # discriminator steps since the last generator step
        self.last_fake_acc = float("nan")
        self.last_g_loss = float("nan")

    def train_step(self) -> None:
        self.discriminator_step()
        if self.since_g >= self.n_d.n_d:
            self.generator_step()

    # --- one discriminator step (Algorithm 1, lines 4–8) -------------------------------
    def discriminator_step(self) -> None:
        B = self.cfg.train.batch_size
        take = self.dist.poisson_take(self.mechanism, self.n, self.event.sample_rate)  # this rank's part
        real_x, real_y = self.images[take], self.labels[take]
        with torch.no_grad():
            fake_x, fake_y = self.dist.share(*self.G.sample(B, generator=self.rng))  # this rank's share of the B
        x = torch.cat([real_x, fake_x])
        y = torch.cat([real_y, fake_y])
        is_real = torch.cat([torch.ones(len(real_x), device=self.device), torch.zeros(len(fake_x), device=self.device)])
        chunk = self.cfg.train.physical_batch_size or len(x)
        for start in range(0, len(x), chunk):
            xs, ys, rs = x[start:start + chunk], y[start:start + chunk], is_real[start:start + chunk]
            logits = self.D_private(xs, ys)
            # -log D(x) for real, -log(1 - D(x)) for fake: one loss per example, the sanitizer clips each.
            self.sanitizer.accumulate(F.softplus(torch.where(rs.bool(), -logits, logits)))
        self.sanitizer.finalize()  # the noisy release; it records the step's event in the trace
        self.opt_d.step()
        self.opt_d.zero_grad(set_to_none=True)
        self.step += 1
        self.since_g += 1

    # --- one generator step (Algorithm 1, lines 10–14) ---------------------------------
    def generator_step(self) -> None:
        B = self.cfg.train.batch_size
        hooks = hasattr(self.D_private, "disable_hooks")  # "ew" mode has none: plain D calls skip it
        if hooks:
            self.D_private.disable_hooks()
        try:
            with torch.no_grad():  # D's accuracy on a fresh fake batch: post-processing, free
                fx, fy = self.G.sample(B, generator=self.rng)
                self.last_fake_acc = (self.D(fx, fy) < 0).float().mean().item()
            self.n_d.observe(self.last_fake_acc)
            self.last_g_loss = generator_step(self.G, self.D, self.opt_g, B, self.rng, loss=non_saturating)
        finally:
            if hooks:
                self.D_private.enable_hooks()
        self.g_steps += 1
        self.since_g = 0

    # --- what the loop saves and reports ------------------------------------------------
    def progress(self) -> tuple[dict, dict]:
        ema = self.n_d.ema
        shown = ema if ema is not None else self.last_fake_acc
        metrics = {"n_d": self.n_d.n_d, "generator_steps": self.g_steps}
        if not math.isnan(self.last_fake_acc):
            metrics["d_accuracy_fake"] = self.last_fake_acc
            metrics["g_loss"] = self.last_g_loss
        if ema is not None:
            metrics["d_accuracy_fake_ema"] = ema
        return {"n_d": self.n_d.n_d, "d_acc": f"{shown:.2f}"}, metrics
