"""dp-GAN, as in Zhang, Ji & Wang, "Differentially Private Releasing via Deep Generative Model" (Algorithm 3).

A conditional WGAN-GP whose critic D is trained with DP-SGD (per-unit gradients clipped group by group); the
generator touches the data only through D. Its pre-training (:func:`dpsynth.methods.pretraining.pretrain`) uses public records only.
What one unit is and why its latents are the mechanism's coins, the groups and bounds, and the account
(one Poisson event of multiplier σ/√k per step; ``as_published``): docs/privacy.md,
"dp-GAN (Zhang et al.): the critic step and its account".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from dpsynth import tracking
from dpsynth.config import RunConfig
from dpsynth.data import ImageDataset
from dpsynth.data import assignment
from dpsynth.errors import ConfigError, PrivacyError
from dpsynth.mechanisms.discriminator import ZHANG
from dpsynth.training import checkpoint
from dpsynth.methods import discriminator_steps
from dpsynth.methods.method import Audit, Method, require
from dpsynth.methods.dpgan import DPGANTrainer
from dpsynth.methods.generator_step import generator_step
from dpsynth.training.loop import Trainer
from dpsynth.methods.networks import dcgan_models, load_warm_models
from dpsynth.methods.pretraining import pretrain
from dpsynth.methods.wgan_gp import N_CRITIC, per_unit_gradients, unit_losses
from dpsynth.mechanisms import grouping
from dpsynth.mechanisms.ghost import GhostClipping
from dpsynth.mechanisms.randomness import MechanismRandomness

# --- the private steps ------------------------------------------------------------------------------


@dataclass(eq=False, kw_only=True)
class ZhangState:
    """What a dp-GAN run holds between steps; a checkpoint holds its fields (and the sanitizer's bounds)."""

    groups: list[list[str]]  # the critic's clip groups, by parameter name
    since_g: int = 0  # critic steps since the last generator step
    G: torch.nn.Module
    D: torch.nn.Module
    opt_g: torch.optim.Optimizer
    opt_d: torch.optim.Optimizer
    rng: torch.Generator  # the generator steps' latents (train.seed)
    mechanism: MechanismRandomness  # the secret coins: masks, the units' latents and weights, noise
    public_rng: torch.Generator  # the public records' batches (train.seed + 2)
    torch_rng: None = None  # checkpoint.TORCH_RNG: the global CPU generator's state
    # ghost clipping (grad_sample_mode "ghost": through the penalty too), else None: per_unit_gradients (torch.func)
    D_private: GhostClipping | None = field(default=None, metadata=checkpoint.TRANSIENT)
    g_loss: float = field(default=math.nan, metadata=checkpoint.TRANSIENT)  # of the last g_step


def clip_groups(state: ZhangState, groups: list[list[str]]) -> list[list[torch.Tensor]]:
    """The critic's parameters in ``groups`` (by name)."""
    params = dict(state.D.named_parameters())
    return [[params[name] for name in g] for g in groups]


def public_gradients(state: ZhangState, public: tuple[torch.Tensor, torch.Tensor], cfg: RunConfig):
    """Per-unit critic gradients on a batch of public records (and fresh fakes): nothing private."""
    z, (images, labels) = cfg.zhang, public
    m = min(z.public_batch_size, len(images))
    idx = torch.randperm(len(images), device=images.device, generator=state.public_rng)[:m]
    real, y = images[idx], labels[idx]
    with torch.no_grad():
        fake, _ = state.G.sample(m, labels=y, generator=state.public_rng)
    rho = torch.rand(m, device=images.device, generator=state.public_rng).view(-1, 1, 1, 1)
    return per_unit_gradients(state.D, real, fake, y, rho, gp_weight=z.gp_weight, chunk=cfg.train.physical_batch_size)


def public_groups(state: ZhangState, bounds: list[float], public, cfg: RunConfig, *, k: int):
    """(groups, bounds) from public data (Alg. 3 lines 4–6): the k groups clustered (``zhang.grouping=clustering``)
    and their bounds, adaptive (``zhang.adaptive_clipping``) or C."""
    z, names, groups = cfg.zhang, [n for n, _ in state.D.named_parameters()], state.groups
    if z.grouping == "clustering":
        groups, bounds = grouping.cluster_groups(public_gradients(state, public, cfg), names, k=k)
        if not z.adaptive_clipping:  # clustered once from public data, then fixed bounds
            bounds = [cfg.privacy.max_grad_norm] * len(groups)
    elif z.adaptive_clipping:
        bounds = grouping.public_bounds(public_gradients(state, public, cfg), groups)
    return groups, bounds


def d_step(state: ZhangState, batch: tuple[torch.Tensor, torch.Tensor], sanitizer, *, gp_weight: float,
           chunk: int | None = None) -> None:
    """One private critic step (Alg. 3 lines 7–17) on ``batch``, the Poisson-sampled records: each unit's fake from
    its own latent and interpolation weight (the secret coins, see the module docstring), each unit's gradient
    clipped group by group, the noisy sums released (the sanitizer records the step's event), one Adam step."""
    (real, y), D_private = batch, state.D_private
    m = len(real)
    latents = state.mechanism.standard_normal((m, state.G.latent_dim))
    rho = state.mechanism.uniform((m,)).view(-1, 1, 1, 1)
    with torch.no_grad():
        fake = state.G(latents, y)
    chunk = chunk or max(m, 1)
    params = dict(state.D.named_parameters())
    for start in range(0, m, chunk):
        s = slice(start, start + chunk)
        if D_private is not None:
            D_private.enable_hooks()
            try:
                sanitizer.accumulate(unit_losses(D_private, real[s], fake[s], y[s], rho[s], gp_weight=gp_weight))
            finally:
                D_private.disable_hooks()
            continue
        for name, g in per_unit_gradients(state.D, real[s], fake[s], y[s], rho[s], gp_weight=gp_weight).items():
            params[name].grad_sample = g
        sanitizer.accumulate()
    sanitizer.finalize()  # the noisy release; it records the step's event in the trace
    state.opt_d.step()
    state.opt_d.zero_grad(set_to_none=True)
    state.since_g += 1


def g_step(state: ZhangState, batch_size: int) -> None:
    """One generator step (Alg. 3 lines 18–21), after n_critic critic steps: WGAN's loss through the private
    critic (post-processing)."""
    state.g_loss = generator_step(state.G, state.D, state.opt_g, batch_size, state.rng)
    state.since_g = 0


# --- the trainer -----------------------------------------------------------------------------------


class ZhangTrainer(Trainer):
    """Algorithm 3 on ``dataset`` (the private records); ``train()`` (:mod:`dpsynth.training.loop`) runs it to
    the end. One step is one critic step (the paper's n_critic counts them per generator step)."""

    STEP = "DP critic steps"
    NAME = "zhang"
    MECHANISM = ZHANG  # its plan, statement and sanitizer (dpsynth.mechanisms.discriminator)
    MLFLOW_KEYS = DPGANTrainer.MLFLOW_KEYS | tracking.LoggedKeys(
        metrics={"epsilon_as_published_unsound": "the paper's account of the steps taken (from the plan)"},
        params={"derived.num_groups": "k, from the critic's architecture and the config",
                "derived.sigma_per_group": "σ of the plan", "derived.pretrained": "whether a public pre-training was given"})

    def __init__(self, cfg: RunConfig, dataset: ImageDataset, *, public: ImageDataset | None = None,
                 pretrained_state: dict | None = None, parent_run_id: str | None = None,
                 run_tags: dict[str, str] | None = None, mechanism_seed: int | None = None):
        """``mechanism_seed``: tests only (replaying the mechanism); None draws it from OS entropy."""
        super().__init__(cfg, spread=METHOD.data_parallel, parent_run_id=parent_run_id, run_tags=run_tags)
        z, t = cfg.zhang, cfg.train
        self.num_classes = cfg.data.num_classes or dataset.num_classes
        images, labels = dataset.to_tensors()
        self.images, self.labels = images.to(self.device), labels.to(self.device)
        self.n = len(dataset)
        image_shape = tuple(self.images.shape[1:])

        if public is None and (z.adaptive_clipping or z.grouping == "clustering"):
            name = "zhang.adaptive_clipping" if z.adaptive_clipping else "zhang.grouping"
            raise ConfigError(f"{name}: needs public data (data.public_source, e.g. sklearn:digits); "
                              "or set zhang.adaptive_clipping=false and a grouping other than 'clustering'")
        # the partition's public output (the stage reads it from its manifest), checked against the private records
        self.public_images, self.public_labels = (None, None) if public is None else (
            x.to(self.device) for x in assignment.check_given(cfg, public, dataset).to_tensors())

        torch.manual_seed(t.seed)
        G, D = dcgan_models(cfg, num_classes=self.num_classes, image_shape=image_shape)
        self.pretrained = pretrained_state is not None
        if pretrained_state is not None:  # G and D trained on the public records (checked against this run's)
            load_warm_models(cfg, pretrained_state, G, D, num_classes=self.num_classes, image_shape=image_shape)
        G, D = G.to(self.device), D.to(self.device)
        names = [n for n, _ in D.named_parameters()]

        self.plan = ZHANG.plan(cfg, self.n)  # the audit's plan: k from the config's critic
        k = grouping.num_groups(names, strategy=z.grouping, k=z.num_groups)
        if k != self.plan.releases:
            raise PrivacyError(f"zhang.grouping: this critic has {k} clip groups, the plan {self.plan.releases}")

        betas = (z.adam_beta1, z.adam_beta2)
        self.state = s = ZhangState(
            G=G, D=D, opt_d=torch.optim.Adam(D.parameters(), lr=z.lr, betas=betas),
            opt_g=torch.optim.Adam(G.parameters(), lr=z.lr if z.lr_g is None else z.lr_g, betas=betas),
            rng=torch.Generator(device=self.device).manual_seed(t.seed),
            mechanism=self.secret_coins(mechanism_seed),
            public_rng=torch.Generator(device=self.device).manual_seed(t.seed + 2),
            groups=([names[i::self.plan.releases] for i in range(self.plan.releases)]  # replaced at step 0
                    if z.grouping == "clustering" else grouping.fixed_groups(names, strategy=z.grouping)))
        if t.grad_sample_mode == "ghost":  # ('ghost_two_pass' is refused by the configuration)
            s.D_private = GhostClipping(D, strategy="bookkeeping", second_order=True)
            s.D_private.disable_hooks()  # recording only inside the critic step
        # σ per group; records plan.event (the k groups folded: σ/√k) in the trace at every noisy release
        self.sanitizer = ZHANG.sanitizer(cfg, self.plan, clip_groups(s, s.groups), randomness=s.mechanism,
                                         module=s.D_private, trace=self.trace)

    def update_bounds(self) -> None:
        """Groups and bounds from public data, chosen by rank 0 (every rank clips to the bounds rank 0 noises by)."""
        s = self.state
        groups, bounds = self.chosen_once(lambda: public_groups(
            s, list(self.sanitizer.bounds), (self.public_images, self.public_labels), self.cfg, k=self.plan.releases))
        self.sanitizer.regroup(clip_groups(s, groups), bounds)
        s.groups = groups

    def train_step(self) -> None:
        s, z = self.state, self.cfg.zhang
        if (self.step % z.update_every == 0 if z.adaptive_clipping else z.grouping == "clustering" and self.step == 0):
            self.update_bounds()
        take = self.select(s.mechanism, self.n)  # Poisson: the mask (under torchrun this rank's part)
        d_step(s, (self.images[take], self.labels[take]), self.sanitizer, gp_weight=z.gp_weight,
               chunk=self.cfg.train.physical_batch_size)
        self.step += 1
        if s.since_g >= discriminator_steps.n_d(self.cfg, N_CRITIC):
            g_step(s, self.cfg.train.batch_size)
            self.g_steps += 1

    def state_dict(self) -> dict:
        return {**super().state_dict(), "bounds": list(self.sanitizer.bounds)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.state.groups = [list(g) for g in state["groups"]]
        self.sanitizer.regroup(clip_groups(self.state, self.state.groups), state["bounds"])

    def published_epsilon(self) -> float | None:
        return ZHANG.published_epsilon(self.cfg, self.plan, self.trace.steps)  # as_published mode only

    def progress(self) -> tuple[dict, dict]:
        g_loss = self.state.g_loss
        metrics = {"generator_steps": self.g_steps}
        if not math.isnan(g_loss):  # on fresh fakes through the privatized critic
            metrics["g_loss"] = g_loss
        return {"g_loss": f"{g_loss:.3f}"}, metrics

    def details(self) -> dict:
        return {"num_groups": self.plan.releases, "grouping": self.cfg.zhang.grouping,
                "pretrained": self.pretrained}

    def derived_params(self) -> dict:
        return {**super().derived_params(), "num_groups": self.plan.releases,
                "sigma_per_group": self.plan.noise_multiplier, "pretrained": self.pretrained}


def validate(cfg: RunConfig) -> None:
    """dp-GAN's rules across sections."""
    require(cfg.train.grad_sample_mode != "ghost_two_pass", "train.grad_sample_mode",
            "'ghost_two_pass' cannot differentiate through dp-GAN's gradient penalty; use 'ghost' (or "
            "'ew'/'hooks': per-unit gradients by torch.func)")


METHOD = Method(
    "zhang", trainer=ZhangTrainer, mechanism=ZHANG, pretrain="public", pretrain_function=pretrain,
    sections=("zhang",), default_n_d=N_CRITIC, networks="dcgan", data_parallel=True, empirical_audit=Audit.GRADIENT, validate=validate)
