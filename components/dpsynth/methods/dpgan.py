"""DPGAN, as in Bie, Kamath & Zhang, "Private GANs, Revisited" (Algorithm 1).

DP-SGD on the discriminator only: each step Poisson-samples real records at q = B/n, draws
B fake records from G, clips every per-example gradient (real and fake) to C, adds
N(0, σ²C²) to the sum and divides by 2B, the expected batch size. Every n_D discriminator
steps, one non-private generator step with the non-saturating loss. The generator touches
the data only through the privatized discriminator, so its release is post-processing.

The privacy cost is one Poisson-subsampled Gaussian event per discriminator step,
recorded in the mechanism trace; training stops before the step that would exceed ε
(the mechanism, its plan and statement: :data:`dpsynth.mechanisms.discriminator.DPGAN`).

The algorithm is two step functions over :class:`DPGANState`: :func:`d_step` (the private one) and :func:`g_step`;
:class:`DPGANTrainer` builds the state, draws each step's batch and calls them.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from dpsynth import tracking
from dpsynth.config import RunConfig
from dpsynth.data import ImageDataset
from dpsynth.training import checkpoint
from dpsynth.methods import discriminator_steps
from dpsynth.methods.discriminator_steps import AdaptiveSteps, FixedSteps
from dpsynth.methods.method import Audit, Method
from dpsynth.methods.generator_step import generator_step, non_saturating
from dpsynth.training.loop import Trainer
from dpsynth.methods.networks import dcgan_models
from dpsynth.mechanisms.discriminator import DPGAN
from dpsynth.mechanisms.dpsgd import GradientSanitizer, private_module
from dpsynth.mechanisms.randomness import MechanismRandomness

# Opacus' hooks fire on module outputs because image inputs need no gradient; that is expected.
warnings.filterwarnings("ignore", message="Full backward hook is firing")


_PLAN = "the privacy plan: from the configuration and n (public), before any step"
_POST = "post-processing of the DP discriminator on fresh fakes (no real record enters)"


@dataclass(eq=False, kw_only=True)
class DPGANState:
    """What a DPGAN run holds between steps; a checkpoint holds its fields in this order, but the transient ones."""

    since_g: int = 0  # discriminator steps since the last generator step
    G: torch.nn.Module
    D: torch.nn.Module
    opt_g: torch.optim.Optimizer
    opt_d: torch.optim.Optimizer
    rng: torch.Generator  # latents and fake labels only (train.seed)
    mechanism: MechanismRandomness  # the secret coins: Poisson masks and noise (never train.seed)
    torch_rng: None = None  # checkpoint.TORCH_RNG: the global CPU generator's state
    n_d: FixedSteps | AdaptiveSteps  # n_D, fixed or Bie et al.'s adaptive schedule
    D_private: torch.nn.Module = field(metadata=checkpoint.TRANSIENT)  # D, per-example norms recorded
    fake_accuracy: float = field(default=math.nan, metadata=checkpoint.TRANSIENT)  # before the last g_step
    g_loss: float = field(default=math.nan, metadata=checkpoint.TRANSIENT)  # of the last g_step
    keeps_snapshots: ClassVar[bool] = True  # a generator snapshot at every checkpoint (evaluate's ε-vs-metric curve)


def d_step(state: DPGANState, batch: tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
           sanitizer: GradientSanitizer, *, chunk: int | None = None) -> None:
    """One private discriminator step (Algorithm 1, lines 4–8) on ``batch``, the Poisson-sampled real records and the
    fakes, each (images, labels): every example's loss clipped, the noisy sum released (the sanitizer records the
    step's event), one Adam step of D. ``chunk``: examples per forward pass (train.physical_batch_size; None: all)."""
    real, fake = batch
    x, y = torch.cat([real[0], fake[0]]), torch.cat([real[1], fake[1]])
    device = x.device
    is_real = torch.cat([torch.ones(len(real[0]), device=device), torch.zeros(len(fake[0]), device=device)])
    chunk = chunk or len(x)
    for start in range(0, len(x), chunk):
        xs, ys, rs = x[start:start + chunk], y[start:start + chunk], is_real[start:start + chunk]
        logits = state.D_private(xs, ys)
        # -log D(x) for real, -log(1 - D(x)) for fake: one loss per example, the sanitizer clips each.
        sanitizer.accumulate(F.softplus(torch.where(rs.bool(), -logits, logits)))
    sanitizer.finalize()  # the noisy release; it records the step's event in the trace
    state.opt_d.step()
    state.opt_d.zero_grad(set_to_none=True)
    state.since_g += 1


def g_step(state: DPGANState, batch_size: int) -> None:
    """One generator step (Algorithm 1, lines 10–14), after n_D discriminator steps: D's accuracy on a fresh fake
    batch drives the n_D schedule, then the one generator step with the non-saturating loss (post-processing)."""
    hooks = hasattr(state.D_private, "disable_hooks")  # "ew" mode has none: plain D calls skip it
    if hooks:
        state.D_private.disable_hooks()
    try:
        with torch.no_grad():  # D's accuracy on a fresh fake batch: post-processing, free
            fx, fy = state.G.sample(batch_size, generator=state.rng)
            state.fake_accuracy = (state.D(fx, fy) < 0).float().mean().item()
        state.n_d.observe(state.fake_accuracy)
        state.g_loss = generator_step(state.G, state.D, state.opt_g, batch_size, state.rng, loss=non_saturating)
    finally:
        if hooks:
            state.D_private.enable_hooks()
    state.since_g = 0


N_D = "adaptive"  # train.n_d's default: Bie et al.'s adaptive n_D (DPGAN is the only method that takes it)


class DPGANTrainer(Trainer):
    """Trains a label-conditioned DCGAN with a DP-SGD discriminator; ``train()`` (:mod:`dpsynth.training.loop`)
    runs it to the end. One step is one discriminator step (Algorithm 1's n_D counts them per generator step)."""

    STEP = "DP discriminator steps"
    NAME = "dpgan"
    MECHANISM = DPGAN  # its plan, statement and sanitizer (dpsynth.mechanisms.discriminator)
    MLFLOW_KEYS = Trainer.MLFLOW_KEYS | tracking.LoggedKeys(metrics={
        "noise_multiplier": _PLAN, "sample_rate": _PLAN,
        "n_d": "the adaptive n_D schedule, driven by d_accuracy_fake_ema (post-processing)",
        "generator_steps": "follows the n_D schedule (post-processing)", "d_accuracy_fake": _POST,
        "d_accuracy_fake_ema": _POST, "g_loss": _POST})

    def __init__(self, cfg: RunConfig, dataset: ImageDataset, *, parent_run_id: str | None = None,
                 run_tags: dict[str, str] | None = None, mechanism_seed: int | None = None):
        """``mechanism_seed``: tests only (replaying the mechanism); None draws it from OS entropy."""
        super().__init__(cfg, spread=METHOD.data_parallel, parent_run_id=parent_run_id, run_tags=run_tags)
        t = cfg.train
        self.num_classes = cfg.data.num_classes or dataset.num_classes
        images, labels = dataset.to_tensors()
        self.images, self.labels = images.to(self.device), labels.to(self.device)
        self.n = len(dataset)
        _, channels, size, _ = self.images.shape
        self.plan = DPGAN.plan(cfg, self.n)

        torch.manual_seed(t.seed)
        G, D = dcgan_models(cfg, num_classes=self.num_classes, image_shape=(channels, size, size))
        G, D = G.to(self.device), D.to(self.device)
        betas = (t.adam_beta1, t.adam_beta2)
        n_d = discriminator_steps.n_d(cfg, N_D)  # n_D of Bie et al.
        self.state = DPGANState(
            G=G, D=D, D_private=private_module(D, t.grad_sample_mode),
            opt_d=torch.optim.Adam(D.parameters(), lr=t.lr_d, betas=betas),
            opt_g=torch.optim.Adam(G.parameters(), lr=t.lr_g, betas=betas),
            rng=torch.Generator(device=self.device).manual_seed(t.seed),
            mechanism=self.secret_coins(mechanism_seed),
            n_d=AdaptiveSteps(threshold=t.n_d_threshold, beta=t.n_d_beta) if n_d == "adaptive" else FixedSteps(n_d))
        # records plan.event in the trace at every noisy release (finalize)
        self.sanitizer = DPGAN.sanitizer(cfg, self.plan, list(D.parameters()), randomness=self.state.mechanism,
                                         module=self.state.D_private, trace=self.trace)

    def draw(self) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """A discriminator step's batch (under torchrun this rank's part of it): (real, fake), each (images, labels)."""
        s = self.state
        take = self.select(s.mechanism, self.n)  # Poisson: the mask (under torchrun this rank's part)
        with torch.no_grad():  # this process's share of the B fakes
            fake = self.own_share(*s.G.sample(self.cfg.train.batch_size, generator=s.rng))
        return (self.images[take], self.labels[take]), fake

    def train_step(self) -> None:
        d_step(self.state, self.draw(), self.sanitizer, chunk=self.cfg.train.physical_batch_size)
        self.step += 1
        if self.state.since_g >= self.state.n_d.n_d:
            g_step(self.state, self.cfg.train.batch_size)
            self.g_steps += 1

    def progress(self) -> tuple[dict, dict]:
        s = self.state
        ema = s.n_d.ema
        shown = ema if ema is not None else s.fake_accuracy
        metrics = {"n_d": s.n_d.n_d, "generator_steps": self.g_steps}
        if not math.isnan(s.fake_accuracy):
            metrics["d_accuracy_fake"] = s.fake_accuracy
            metrics["g_loss"] = s.g_loss
        if ema is not None:
            metrics["d_accuracy_fake_ema"] = ema
        return {"n_d": s.n_d.n_d, "d_acc": f"{shown:.2f}"}, metrics


METHOD = Method("dpgan", trainer=DPGANTrainer, mechanism=DPGAN, default_n_d=N_D, networks="dcgan", data_parallel=True,
                empirical_audit=Audit.GRADIENT)
