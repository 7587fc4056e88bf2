"""GS-WGAN, centralized (Chen, Orekondy & Fritz 2020, supplement Algorithm 1).

Per-shard WGAN-GP critics pre-trained non-privately (:func:`dpsynth.methods.pretraining.pretrain_shard`),
then private iterations in which only the per-sample gradients ∂ℓ_i/∂G(z_i) are sanitized; the released generator is an
exponential moving average of G's weights. Its steps over :class:`GSWGANState`: :func:`critic_step` (not private),
:func:`g_step` (the private release is the generator's gradient). The iteration step by step, and why one iteration is one
without-replacement event of multiplier σ/√B: docs/privacy.md, "GS-WGAN: the iteration and its account".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from dpsynth import tracking
from dpsynth.config import RunConfig
from dpsynth.data import ImageDataset
from dpsynth.grids import class_grid
from dpsynth.training import checkpoint
from dpsynth.methods.gswgan_critic import N_DIS, critic_loss, critic_steps, real_batch  # noqa: F401
from dpsynth.methods.method import Audit, Method
from dpsynth.methods.pretraining import pretrain_shard
from dpsynth.training.loop import SPREAD, Trainer
from dpsynth.training.seeds import cpu_rng, derived_seed
from dpsynth.methods.networks import (discriminator_kwargs, fresh_discriminator, generator_models, generator_record,
                                      gswgan_adam, image_spec, read_discriminator)
from dpsynth.models.gswgan_networks import ema_update, frozen, refresh_spectral_norm
from dpsynth.mechanisms.generator_gradient import ACCOUNTANT, GSWGAN
from dpsynth.mechanisms.dpsgd import InputGradientSanitizer
from dpsynth.mechanisms.randomness import MechanismRandomness

# --- the pieces of one iteration ------------------------------------------------------------------


def sanitized_generator_step(G, opt_g, per_sample_loss: Callable | None, *, batch_size: int,
                             generator: torch.Generator, sanitizer: InputGradientSanitizer) -> None:
    """One generator update in which only ∂ℓ_i/∂G(z_i) is sanitized (paper Eq. 11). ``generator`` draws the
    latents and labels (train.seed), ``sanitizer`` releases the B gradients (its secret coins draw the noise; it
    records the iteration's event). ``per_sample_loss(x, y)`` returns the vector (ℓ_1 … ℓ_B); ℓ_i may depend on
    x_i alone (no batch statistics), so the gradient of Σℓ w.r.t. x holds the per-sample gradients. None: a rank
    that does not hold this iteration's D_k (torchrun); it adds zeros to the job's one release."""
    labels = torch.randint(0, G.num_classes, (batch_size,), device=generator.device, generator=generator)
    z = torch.randn(batch_size, G.latent_dim, device=generator.device, generator=generator)
    x = G(z, labels)
    x_in = x.detach().requires_grad_(True)
    if per_sample_loss is None:
        grads = torch.zeros_like(x_in)
    else:
        (grads,) = torch.autograd.grad(per_sample_loss(x_in, labels).sum(), x_in)
    released = sanitizer(grads)
    opt_g.zero_grad(set_to_none=True)
    x.backward(released / batch_size)  # (1/B) Σ g̃_i · J_θ G(z_i): post-processing of the releases
    opt_g.step()


# --- the state and its steps ---------------------------------------------------------------------


@dataclass(eq=False, kw_only=True)
class GSWGANState:
    """What a GS-WGAN (or DPAC) run holds between iterations; a checkpoint holds its fields in this order, but D."""

    method: str
    G: torch.nn.Module
    G_ema: torch.nn.Module  # the released generator: an exponential moving average of G's weights
    opt_g: torch.optim.Optimizer
    # {k: D_k's state}, {k: its Adam state}, on the CPU (under torchrun: on the rank holding shard k)
    d_states: dict[int, dict] = field(default_factory=dict, metadata=SPREAD)
    opt_states: dict[int, dict] = field(default_factory=dict, metadata=SPREAD)
    mechanism: MechanismRandomness  # the secret coins: the shard k ~ U[0, K) and the noise (never train.seed)
    data_rng: torch.Generator  # the shards' real batches (train.seed)
    rng: torch.Generator  # latents, labels and interpolation weights (train.seed)
    D: torch.nn.Module = field(metadata=checkpoint.TRANSIENT)  # the working discriminator: D_k loaded in, stored back


def critic_step(state: GSWGANState, k: int, shard: tuple[torch.Tensor, torch.Tensor], *, cfg: RunConfig,
                spec: dict) -> None:
    """The critic's part of an iteration (Algorithm 1, lines 14–17), not private: D_k into the working D, its n_dis
    WGAN-GP steps on shard k, D_k out."""
    opt_d = load_discriminator(state, k, cfg=cfg, spec=spec)
    critic_steps(state.D, opt_d, state.G, *shard, cfg=cfg, data_rng=state.data_rng, rng=state.rng)
    store_discriminator(state, k, opt_d)


def load_discriminator(state: GSWGANState, k: int, *, cfg: RunConfig, spec: dict) -> torch.optim.Adam:
    """D_k (fresh when not warm) into the working D; its Adam, with D_k's Adam state."""
    d_state = state.d_states.get(k)
    state.D.load_state_dict(d_state if d_state is not None else fresh_discriminator(cfg, spec, shard_index=k).state_dict())
    opt_d = gswgan_adam(state.D.parameters(), lr=cfg.gswgan.lr_d, cfg=cfg)
    if k in state.opt_states:
        opt_d.load_state_dict(state.opt_states[k])
    return opt_d


def store_discriminator(state: GSWGANState, k: int, opt_d: torch.optim.Adam) -> None:
    """The working D and its Adam state back as D_k's, on the CPU."""
    state.d_states[k] = {name: v.detach().to("cpu", copy=True) for name, v in state.D.state_dict().items()}
    state.opt_states[k] = checkpoint.cpu_copy(opt_d.state_dict())


def g_step(state: GSWGANState, loss: Callable | None, sanitizer: InputGradientSanitizer, *, cfg: RunConfig,
           iteration: int) -> None:
    """The private step (Algorithm 1, lines 18–20): the generator's update on the B sanitized ∂ℓ_i/∂G(z_i) (the
    sanitizer records the iteration's event; ``loss``: ℓ_i of the drawn shard, None on a rank not holding it), then
    G_ema's update (``iteration``: the iterations taken, this one included)."""
    with frozen(state.D):
        sanitized_generator_step(state.G, state.opt_g, loss, batch_size=cfg.gswgan.batch_size, generator=state.rng,
                                 sanitizer=sanitizer)
    ema_update(state.G_ema, state.G, decay=ema_decay(cfg, iteration))


def ema_decay(cfg: RunConfig, iteration: int) -> float:  # G_ema's after ``iteration`` iterations
    return min(cfg.gswgan.ema_decay, (1 + iteration) / (10 + iteration))


# --- the trainer --------------------------------------------------------------------------------


_PLAN = "the privacy plan: from the configuration, n and K, before any iteration"


class GSWGANTrainer(Trainer):
    """Private phase of GS-WGAN on K shards, run by the one loop (:mod:`dpsynth.training.loop`). One step is one
    generator iteration (n_dis critic steps on the drawn shard, B releases); ``own``: the shards this process holds."""

    MECHANISM = GSWGAN  # its plan, statement and sanitizer (dpsynth.mechanisms.generator_gradient)
    STEP, NAME = "private generator iterations", "gswgan"
    MLFLOW_KEYS = Trainer.MLFLOW_KEYS | tracking.LoggedKeys(
        metrics={"epsilon_as_published_unsound": "the authors' account of the iterations taken (from the plan)"},
        params={"derived.release_noise_multiplier": _PLAN, "derived.accountant": "wor (fixed for shard sampling)"})

    def __init__(self, cfg: RunConfig, shards: list[ImageDataset | None], *, warm: dict[int, bytes] | None = None,
                 records: int | None = None, parent_run_id: str | None = None, run_tags: dict[str, str] | None = None,
                 mechanism_seed: int | None = None):
        """``shards``: the K shards; under torchrun a rank needs only its own (``None`` for the others, and then
        ``records``, n, from the partition's manifest). ``warm``: {k: D_k's pre-training file}, of its own shards
        at least. ``mechanism_seed``: tests only (replaying the mechanism); None draws it from OS entropy."""
        super().__init__(cfg, spread=METHOD.data_parallel, parent_run_id=parent_run_id, run_tags=run_tags)
        seed = cfg.train.seed
        self.K = len(shards)
        # the shards (and D_k) this rank holds (all in one process); every shard's (images, labels) or None
        self.own, self.shards = self.hold_shards(shards)
        self.spec = image_spec(cfg, shards[self.own.start])
        self.num_classes = self.spec["num_classes"]
        self.n = records if records is not None else sum(len(s) for s in shards)
        self.plan = self.MECHANISM.plan(cfg, self.n)  # K = partition.num_shards, the shards given

        models = generator_models(cfg, self.spec, self.device)
        D = fresh_discriminator(cfg, self.spec, shard_index=0).to(self.device)
        kwargs = discriminator_kwargs(cfg, self.spec)  # D_k of the pre-training, of the shards this rank holds
        d_states = {k: read_discriminator(data, expect_kwargs=kwargs, shard_index=k)
                    for k, data in (warm or {}).items() if k in self.own}
        mechanism = self.secret_coins(mechanism_seed)
        # σ per release; records plan.event (the B releases folded: σ/√B) in the trace at every iteration
        self.sanitizer = self.MECHANISM.sanitizer(cfg, self.plan, randomness=mechanism, trace=self.trace)
        self.state = GSWGANState(
            method=self.NAME, **models, D=D, d_states=d_states, mechanism=mechanism,
            data_rng=cpu_rng(seed, "real-batches"),
            rng=torch.Generator(device=self.device).manual_seed(derived_seed(seed, "latents")))

    def warm_up(self, records=None) -> None:
        """The private warm-up (:mod:`dpsynth.warmup.fit`) on the union of the shards; G_ema starts at the warm G."""
        super().warm_up(self.every_record(self.own, self.shards))
        self.state.G_ema.load_state_dict(self.state.G.state_dict())

    def train_step(self) -> None:
        """One private iteration (Algorithm 1, lines 13–20) on the shard k drawn by rank 0's secret coins."""
        s = self.state
        k = self.select(s.mechanism, self.K)  # the shard: rank 0's draw from the secret coins, on every rank
        loss = None
        if k in self.own:
            critic_step(s, k, self.shards[k], cfg=self.cfg, spec=self.spec)
            loss = self.generator_loss(k)
        self.hand_on(k, [s.data_rng, s.rng], s.G)
        g_step(s, loss, self.sanitizer, cfg=self.cfg, iteration=self.step + 1)  # records the event
        self.step += 1
        self.g_steps += 1

    def generator_loss(self, k: int) -> Callable:
        """ℓ_i(x_i, y_i) for the generator step on shard k: the WGAN loss −D_k(x_i, y_i)."""
        return lambda x, y: -self.state.D(x, y)

    def generator(self) -> tuple[torch.nn.Module, dict]:
        return self.state.G_ema, generator_record(self.cfg, self.spec)

    def grid(self):
        refresh_spectral_norm(self.state.G_ema)
        return class_grid(self.state.G_ema, num_classes=self.num_classes)

    def published_epsilon(self) -> float | None:
        return self.MECHANISM.published_epsilon(self.cfg, self.plan, self.step)

    def final_metrics(self) -> dict:
        return {}  # ε only (and the published ε under as_published)

    def details(self) -> dict:
        return {"event_noise_multiplier": self.event.noise_multiplier}

    def derived_params(self) -> dict:
        return {**super().derived_params(), "release_noise_multiplier": self.plan.noise_multiplier,
                "accountant": ACCOUNTANT}


METHOD = Method(
    "gswgan", trainer=GSWGANTrainer, mechanism=GSWGAN, pretrain="shard", pretrain_function=pretrain_shard,
    sections=("gswgan",), default_n_d=N_DIS, networks="gswgan.generator", data_parallel=True,
    empirical_audit=Audit.INPUT_GRADIENT)
