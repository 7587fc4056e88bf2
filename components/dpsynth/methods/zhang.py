"""dp-GAN, as in Zhang, Ji & Wang, "Differentially Private Releasing via Deep Generative Model" (Algorithm 3).

A conditional WGAN-GP whose critic D is trained with DP-SGD (per-unit gradients clipped group by group); the
generator touches the data only through D. Its warm start (:func:`dpsynth.methods.warm_starts.warm_start`) uses public records only.
What one unit is and why its latents are the mechanism's coins, the groups and bounds, and the account
(one Poisson event of multiplier σ/√k per step; ``as_published``): docs/privacy.md,
"dp-GAN (Zhang et al.): the critic step and its account".
"""

from __future__ import annotations

import math

import torch
from torch.func import functional_call, grad, vmap

from dpsynth import tracking
from dpsynth.config import RunConfig
from dpsynth.data import ImageDataset
from dpsynth.data import assignment
from dpsynth.errors import ConfigError, PrivacyError
from dpsynth.mechanisms.discriminator import ZHANG
from dpsynth.training import checkpoint, data_parallel
from dpsynth.methods import discriminator_steps
from dpsynth.methods.dpgan import DPGANTrainer
from dpsynth.methods.generator_step import generator_step
from dpsynth.training.loop import Trainer
from dpsynth.methods.networks import dcgan_models, load_warm_models
from dpsynth.mechanisms import grouping
from dpsynth.mechanisms.ghost import GhostClipping
from dpsynth.mechanisms.randomness import MechanismRandomness

# --- the WGAN-GP losses ----------------------------------------------------------------------------


def unit_losses(D, real, fake, y, rho, *, gp_weight: float) -> torch.Tensor:
    """(m,): each unit's critic loss D(fake_i) − D(real_i) + λ(‖∇_x̂ D(x̂_i)‖ − 1)²."""
    x_hat = (rho.view(-1, 1, 1, 1) * real + (1 - rho.view(-1, 1, 1, 1)) * fake).requires_grad_(True)
    (g,) = torch.autograd.grad(D(x_hat, y).sum(), x_hat, create_graph=True)
    penalty = ((g.flatten(1).pow(2).sum(1) + 1e-12).sqrt() - 1).pow(2)
    return D(fake, y) - D(real, y) + gp_weight * penalty


def wgan_gp_loss(D, real, fake, y, rho, *, gp_weight: float) -> torch.Tensor:
    """The batch-mean critic loss (non-private: the warm start)."""
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


# --- the private trainer ---------------------------------------------------------------------------


class ZhangTrainer(Trainer):
    """Algorithm 3 on ``dataset`` (the private records); ``train()`` (:mod:`dpsynth.training.loop`) runs it to
    the end. One step is one critic step (the paper's n_critic counts them per generator step)."""

    STEP = "DP critic steps"
    MECHANISM = ZHANG  # its plan, statement and sanitizer (dpsynth.mechanisms.discriminator)
    STATE = ("since_g", "G", "D", "opt_g", "opt_d", "rng", "mechanism", "public_rng", checkpoint.TORCH_RNG)
    DATA_PARALLEL = True  # across torchrun ranks: one noise draw per logical step (dpsynth.training.data_parallel)

    MLFLOW_KEYS = DPGANTrainer.MLFLOW_KEYS | tracking.LoggedKeys(
        metrics={"epsilon_as_published_unsound": "the paper's account of the steps taken (from the plan)"},
        params={"derived.num_groups": "k, from the critic's architecture and the config",
                "derived.sigma_per_group": "σ of the plan", "derived.warm_started": "whether a public warm start was given"})

    def __init__(self, cfg: RunConfig, dataset: ImageDataset, *, public: ImageDataset | None = None,
                 warm_start_state: dict | None = None, parent_run_id: str | None = None,
                 run_tags: dict[str, str] | None = None, mechanism_seed: int | None = None):
        """``mechanism_seed``: tests only (replaying the mechanism); None draws it from OS entropy."""
        super().__init__(cfg, parent_run_id=parent_run_id, run_tags=run_tags)
        z, t = cfg.zhang, cfg.train
        self.num_classes = cfg.data.num_classes or dataset.num_classes
        images, labels = dataset.to_tensors()
        self.images, self.labels = images.to(self.device), labels.to(self.device)
        self.n = len(dataset)
        self.image_shape = tuple(self.images.shape[1:])

        if public is None and (z.adaptive_clipping or z.grouping == "clustering"):
            field = "zhang.adaptive_clipping" if z.adaptive_clipping else "zhang.grouping"
            raise ConfigError(f"{field}: needs public data (data.public_source, e.g. sklearn:digits); "
                              "or set zhang.adaptive_clipping=false and a grouping other than 'clustering'")
        # the partition's public output (the stage reads it from its manifest), checked against the private records
        self.public_images, self.public_labels = (None, None) if public is None else (
            x.to(self.device) for x in assignment.check_given(cfg, public, dataset).to_tensors())

        torch.manual_seed(t.seed)
        self.G, self.D = dcgan_models(cfg, num_classes=self.num_classes, image_shape=self.image_shape)
        self.warm_started = warm_start_state is not None
        if warm_start_state is not None:  # G and D trained on the public records (checked against this run's)
            load_warm_models(cfg, warm_start_state, self.G, self.D, num_classes=self.num_classes,
                             image_shape=self.image_shape)
        self.G, self.D = self.G.to(self.device), self.D.to(self.device)
        self.names = [n for n, _ in self.D.named_parameters()]
        self.params = dict(self.D.named_parameters())

        self.plan = ZHANG.plan(cfg, self.n)  # the audit's plan: k from the config's critic
        k = grouping.num_groups(self.names, strategy=z.grouping, k=z.num_groups)
        if k != self.plan.releases:
            raise PrivacyError(f"zhang.grouping: this critic has {k} clip groups, the plan {self.plan.releases}")

        betas = (z.adam_beta1, z.adam_beta2)
        self.opt_d = torch.optim.Adam(self.D.parameters(), lr=z.lr, betas=betas)
        self.opt_g = torch.optim.Adam(self.G.parameters(), lr=z.lr if z.lr_g is None else z.lr_g, betas=betas)
        self.rng = torch.Generator(device=self.device).manual_seed(t.seed)  # the generator steps' latents
        # the secret coins: Poisson masks, the units' latents and interpolation weights, noise (never train.seed)
        self.mechanism = MechanismRandomness(device=self.device, secure_mode=cfg.privacy.secure_mode,
                                             seed=self.dist.mechanism_seed(mechanism_seed))
        self.public_rng = torch.Generator(device=self.device).manual_seed(t.seed + 2)
        groups = ([self.names[i::self.plan.releases] for i in range(self.plan.releases)]  # replaced at step 0
                  if z.grouping == "clustering" else grouping.fixed_groups(self.names, strategy=z.grouping))
        # ghost clipping (train.grad_sample_mode "ghost": norms through the penalty's second-order uses too),
        # else per-unit gradients instantiated with torch.func (per_unit_gradients)
        self.D_private = None  # ('ghost_two_pass' is refused by the configuration)
        if t.grad_sample_mode == "ghost":
            self.D_private = GhostClipping(self.D, strategy="bookkeeping", second_order=True)
            self.D_private.disable_hooks()  # recording only inside the critic step
        # σ per group; records plan.event (the k groups folded: σ/√k) in the trace at every noisy release
        self.sanitizer = ZHANG.sanitizer(cfg, self.plan, [[self.params[nm] for nm in g] for g in groups],
                                         randomness=self.mechanism, module=self.D_private, trace=self.trace)
        self.group_names = groups
        data_parallel.join(self)  # under torchrun: the groups' noise on rank 0, their clipped sums all-reduced
        self.since_g = 0
        self.last_g_loss = float("nan")

    # --- groups and bounds from public data (Alg. 3 lines 4–6) ---------------------------------
    def public_gradients(self) -> dict[str, torch.Tensor]:
        """Per-unit critic gradients on a batch of public records (and fresh fakes): nothing private."""
        z = self.cfg.zhang
        m = min(z.public_batch_size, len(self.public_images))
        idx = torch.randperm(len(self.public_images), device=self.device, generator=self.public_rng)[:m]
        real, y = self.public_images[idx], self.public_labels[idx]
        with torch.no_grad():
            fake, _ = self.G.sample(m, labels=y, generator=self.public_rng)
        rho = torch.rand(m, device=self.device, generator=self.public_rng).view(-1, 1, 1, 1)
        return per_unit_gradients(self.D, real, fake, y, rho, gp_weight=z.gp_weight,
                                  chunk=self.cfg.train.physical_batch_size)

    def update_bounds(self) -> None:
        z = self.cfg.zhang
        groups, bounds = self.group_names, list(self.sanitizer.bounds)
        if self.dist.is_main:  # under torchrun rank 0 chooses them and every rank takes its choice (from_main)
            if z.grouping == "clustering":
                groups, bounds = grouping.cluster_groups(self.public_gradients(), self.names, k=self.plan.releases)
                if not z.adaptive_clipping:  # clustered once from public data, then fixed bounds
                    bounds = [self.cfg.privacy.max_grad_norm] * len(groups)
            elif z.adaptive_clipping:
                bounds = grouping.public_bounds(self.public_gradients(), self.group_names)
        groups, bounds = self.dist.from_main((groups, bounds))  # every rank clips to the bounds rank 0 noises by
        self.sanitizer.regroup([[self.params[nm] for nm in g] for g in groups], bounds)
        self.group_names = groups

    def _due_for_bounds(self) -> bool:
        z = self.cfg.zhang
        if z.adaptive_clipping:
            return self.step % z.update_every == 0
        return z.grouping == "clustering" and self.step == 0

    def train_step(self) -> None:
        self.critic_step()
        if self.since_g >= discriminator_steps.n_d(self.cfg):
            self.generator_step()

    # --- one critic step (Alg. 3 lines 7–17) ---------------------------------------------------
    def critic_step(self) -> None:
        z, t = self.cfg.zhang, self.cfg.train
        if self._due_for_bounds():
            self.update_bounds()
        take = self.dist.poisson_take(self.mechanism, self.n, self.event.sample_rate)  # this rank's part
        real, y = self.images[take], self.labels[take]
        m = len(real)
        # each unit's own latent and interpolation weight, from the secret coins (see the module docstring)
        latents = self.mechanism.standard_normal((m, self.G.latent_dim))
        rho = self.mechanism.uniform((m,)).view(-1, 1, 1, 1)
        with torch.no_grad():
            fake = self.G(latents, y)
        chunk = t.physical_batch_size or max(m, 1)
        for start in range(0, m, chunk):
            s = slice(start, start + chunk)
            if self.D_private is not None:
                self.D_private.enable_hooks()
                try:
                    self.sanitizer.accumulate(unit_losses(self.D_private, real[s], fake[s], y[s], rho[s],
                                                          gp_weight=z.gp_weight))
                finally:
                    self.D_private.disable_hooks()
                continue
            grads = per_unit_gradients(self.D, real[s], fake[s], y[s], rho[s], gp_weight=z.gp_weight)
            for name, g in grads.items():
                self.params[name].grad_sample = g
            self.sanitizer.accumulate()
        self.sanitizer.finalize()  # the noisy release; it records the step's event in the trace
        self.opt_d.step()
        self.opt_d.zero_grad(set_to_none=True)
        self.step += 1
        self.since_g += 1

    def generator_step(self) -> None:
        self.last_g_loss = generator_step(self.G, self.D, self.opt_g, self.cfg.train.batch_size, self.rng)
        self.g_steps += 1
        self.since_g = 0

    # --- what the loop saves and reports ----------------------------------------------------------
    def method_state(self) -> dict:
        return {"groups": self.group_names, "bounds": list(self.sanitizer.bounds), **super().method_state()}

    def load_method_state(self, state: dict) -> None:
        super().load_method_state(state)
        self.group_names = [list(g) for g in state["groups"]]
        self.sanitizer.regroup([[self.params[nm] for nm in g] for g in self.group_names], state["bounds"])

    def published_epsilon(self) -> float | None:
        return ZHANG.published_epsilon(self.cfg, self.plan, self.trace.steps)  # as_published mode only

    def progress(self) -> tuple[dict, dict]:
        metrics = {"generator_steps": self.g_steps}
        if not math.isnan(self.last_g_loss):  # on fresh fakes through the privatized critic
            metrics["g_loss"] = self.last_g_loss
        return {"g_loss": f"{self.last_g_loss:.3f}"}, metrics

    def details(self) -> dict:
        return {"num_groups": self.plan.releases, "grouping": self.cfg.zhang.grouping,
                "warm_started": self.warm_started}

    def derived_params(self) -> dict:
        return {**super().derived_params(), "num_groups": self.plan.releases,
                "sigma_per_group": self.plan.noise_multiplier, "warm_started": self.warm_started}
