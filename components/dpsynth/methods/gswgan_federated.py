"""GS-WGAN, federated (Chen, Orekondy & Fritz 2020, supplement Algorithm 2).

The server (:class:`FederatedServer`) holds the generator; each :class:`Client` keeps its data and its
discriminator and returns only sanitized gradients. :class:`FederatedGSWGANTrainer` runs the protocol in one
process (the reference); :mod:`dpsynth.methods.federated_processes` runs it as the ranks of one ``torchrun``
job. The protocol and its messages, the secret coins, the account (one event per iteration folding n_dis·B
releases), against whom it holds, and the client-level guarantee: docs/privacy.md,
"Federated GS-WGAN: protocol, account, against whom".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dpsynth import tracking
from dpsynth.config import RunConfig
from dpsynth.data import ImageDataset
from dpsynth.errors import ConfigError
from dpsynth.methods import discriminator_steps
from dpsynth.training import checkpoint
from dpsynth.training.result import resolve_device
from dpsynth.training.loop import Trainer
from dpsynth.training.seeds import cpu_rng, derived_seed
from dpsynth.methods.gswgan import GSWGANTrainer, critic_loss, ema_decay, real_batch
from dpsynth.methods.networks import (discriminator_kwargs, fresh_discriminator, generator_models, gswgan_adam,
                                      image_spec, read_discriminator)
from dpsynth.mechanisms.generator_gradient import FEDERATED, Receipts
from dpsynth.models.gswgan_networks import ema_update, frozen
from dpsynth.mechanisms.dpsgd import sanitize
from dpsynth.mechanisms.randomness import MechanismRandomness, secret_seed

# --- the client -------------------------------------------------------------------------------


@dataclass(eq=False, kw_only=True)
class Client:
    """Client k: its shard and its state, which its own checkpoint holds (on its own rank), all but the shard."""
    D: torch.nn.Module
    opt: torch.optim.Optimizer  # D_k's
    data_rng: torch.Generator  # its real batches (train.seed)
    rng: torch.Generator  # the critic's interpolation weights (train.seed)
    randomness: MechanismRandomness  # its secret noise coins
    images: torch.Tensor = field(metadata=checkpoint.TRANSIENT)
    labels: torch.Tensor = field(metadata=checkpoint.TRANSIENT)

    def state_dict(self) -> dict:
        return checkpoint.cpu_copy(checkpoint.capture_state(self))

    def load_state_dict(self, state: dict) -> None:
        checkpoint.restore_state(self, state)


def client_update(client: Client, fake_x: torch.Tensor, fake_y: torch.Tensor, *, cfg: RunConfig,
                  noise_multiplier: float) -> torch.Tensor:
    """ClientUpdate (Algorithm 2, lines 28–32): one non-private step of D_k on its shard and the server's fakes, then
    the private release, the sanitized ∂(−D_k)/∂x_i of the fakes."""
    g = cfg.gswgan
    real_x, real_y = real_batch(client.images, client.labels, size=g.batch_size, rng=client.data_rng)
    n = min(len(real_x), len(fake_x))  # the critic pairs each real record with a fake
    loss = critic_loss(client.D, real_x[:n], real_y[:n], fake_x[:n].detach(), gp_weight=g.gp_weight,
                       drift_weight=g.drift_weight, generator=client.rng)
    client.opt.zero_grad(set_to_none=True)
    loss.backward()
    client.opt.step()
    with frozen(client.D):
        x = fake_x.detach().requires_grad_(True)
        (grads,) = torch.autograd.grad(-client.D(x, fake_y).sum(), x)
    return sanitize(grads, clip_norm=cfg.privacy.max_grad_norm, noise_multiplier=noise_multiplier,
                    randomness=client.randomness)


def mechanism_seeds(master: int | None, num_clients: int) -> tuple[int, list[int]]:
    """The secret seeds of the server's client choice and of each client's noise, from one master seed (None: a fresh
    secret_seed): the in-process reference's, and the tests' replay of the job's ranks; nothing logs or stores it."""
    master = secret_seed() if master is None else master
    return derived_seed(master, "client-choice"), [derived_seed(master, "client-noise", k) for k in range(num_clients)]


def make_client(cfg: RunConfig, shard: tuple[torch.Tensor, torch.Tensor], *, spec: dict, shard_index: int,
                warm: bytes | None, mechanism_seed: int | None = None, device: torch.device | None = None) -> Client:
    """Client k on ``device`` (None: train.device's) with its pre-trained D_k (or a fresh one), RNGs of its own
    seeded by train.seed and k, and its secret noise coins (``mechanism_seed``, from :func:`mechanism_seeds`)."""
    device = resolve_device(cfg.train.device) if device is None else device
    D = fresh_discriminator(cfg, spec, shard_index=shard_index).to(device)
    if warm is not None:
        D.load_state_dict(read_discriminator(warm, expect_kwargs=discriminator_kwargs(cfg, spec),
                                             shard_index=shard_index))
    seed, (images, labels) = cfg.train.seed, (t.to(device) for t in shard)
    return Client(D=D, opt=gswgan_adam(D.parameters(), lr=cfg.gswgan.lr_d, cfg=cfg), images=images, labels=labels,
                  data_rng=cpu_rng(seed, "client-real-batches", shard_index),
                  rng=torch.Generator(device=device).manual_seed(derived_seed(seed, "client-critic", shard_index)),
                  randomness=MechanismRandomness(device=device, secure_mode=cfg.privacy.secure_mode, seed=mechanism_seed))


# --- what the server may know ----------------------------------------------------------------


@dataclass(frozen=True)
class FederationMeta:
    """Data-independent metadata the server is given instead of the shards."""

    spec: dict  # num_classes, channels, image_size
    n: int  # total records (for δ < 1/n and the plan)
    num_clients: int


def federation_meta(cfg: RunConfig, shards: list[ImageDataset]) -> FederationMeta:
    return FederationMeta(spec=image_spec(cfg, shards[0]), n=sum(len(s) for s in shards), num_clients=len(shards))


def message_bytes(cfg: RunConfig, spec: dict) -> dict:
    """Bytes per generator iteration, from the protocol alone (data-independent: shapes only)."""
    B, image = cfg.gswgan.batch_size, spec["channels"] * spec["image_size"] ** 2
    rounds = discriminator_steps.n_d(cfg, FEDERATED.n_dis)
    to_client = rounds * (8 + B * image * 4 + B * 8)
    from_client = rounds * B * image * 4
    return {"to_clients": to_client, "from_clients": from_client, "total": to_client + from_client}


# --- transports ------------------------------------------------------------------------------


class InProcessClients:
    """All K clients in this process (the reference)."""

    transport = "in_process"

    def __init__(self, cfg: RunConfig, clients: list[Client], *, noise_multiplier: float, moved: dict):
        """``moved``: what the gloo transport would move (:func:`message_bytes`)."""
        self.cfg, self.clients, self.noise_multiplier, self.moved = cfg, clients, noise_multiplier, moved

    def ask(self, k: int, fake_x: torch.Tensor, fake_y: torch.Tensor) -> torch.Tensor:
        return client_update(self.clients[k], fake_x, fake_y, cfg=self.cfg, noise_multiplier=self.noise_multiplier)

    def close(self, steps: int = 0) -> tuple[int, int, int]:
        """Bytes per iteration to and from the clients, and at the end (the K STOP messages)."""
        return self.moved["to_clients"], self.moved["from_clients"], 8 * len(self.clients)

    def state_dict(self) -> dict:
        return {"clients": [c.state_dict() for c in self.clients]}

    def load_state_dict(self, state: dict) -> None:
        for c, s in zip(self.clients, state["clients"]):
            c.load_state_dict(s)


# --- the server --------------------------------------------------------------------------------


_PROTOCOL = "bytes of the protocol's messages: from shapes (config) alone"
_BYTES = ("bytes_per_iteration_to_clients", "bytes_per_iteration_from_clients", "bytes_per_iteration")


@dataclass(eq=False, kw_only=True)
class ServerState:
    """What the server holds between iterations (no data); a checkpoint holds its fields in this order, but D."""
    method: str
    G: torch.nn.Module
    G_ema: torch.nn.Module  # the released generator
    opt_g: torch.optim.Optimizer
    mechanism: MechanismRandomness  # the secret client choice k ~ U[0, K) (never train.seed, never logged)
    rng: torch.Generator  # latents and labels (train.seed)
    clients: object  # the transport to the K clients: its checkpoint is theirs (in process) or their round (gloo)
    D: torch.nn.Module = field(metadata=checkpoint.TRANSIENT)  # architecture only: its parameter count is logged


def g_step(state: ServerState, receipts: Receipts, *, cfg: RunConfig, plan, num_clients: int, iteration: int) -> None:
    """The server's generator iteration (Algorithm 2, lines 5–12): client k drawn, n_dis rounds of B fakes sent and
    their sanitized gradients (the private releases, ``receipts`` records their event) received, G and G_ema updated."""
    g, rounds, device = cfg.gswgan, discriminator_steps.n_d(cfg, FEDERATED.n_dis), state.rng.device
    k = FEDERATED.select(plan, state.mechanism, num_clients)  # the client, from the server's secret coins
    for r in range(rounds):  # every round's answer is a release the server sees
        labels = torch.randint(0, state.G.num_classes, (g.batch_size,), device=device, generator=state.rng)
        z = torch.randn(g.batch_size, state.G.latent_dim, device=device, generator=state.rng)
        with torch.set_grad_enabled(r == rounds - 1):  # only the last round's graph is needed
            x = state.G(z, labels)
        released = receipts.received(state.clients.ask(k, x.detach(), labels))
    receipts.end_iteration()  # records the event that folds the n_dis·B releases received
    state.opt_g.zero_grad(set_to_none=True)
    x.backward(released / g.batch_size)  # the last round's gradients update G (line 11)
    state.opt_g.step()
    ema_update(state.G_ema, state.G, decay=ema_decay(cfg, iteration))


class FederatedServer(GSWGANTrainer):
    """The server of Algorithm 2 (its reports are GS-WGAN's): its state, the plan, the trace. No data."""

    MECHANISM = FEDERATED  # the n_dis·B releases of an iteration folded (dpsynth.mechanisms.generator_gradient)
    NAME = "gswgan_federated"
    MLFLOW_KEYS = GSWGANTrainer.MLFLOW_KEYS | tracking.LoggedKeys(
        metrics={k: _PROTOCOL for k in _BYTES},
        params={"derived.privacy_unit": "client (fixed)", "derived.clients": "K (configuration)",
                "derived.transport": "the transport's name",
                "derived.delta_below_one_over_clients": "δ < 1/K, from the configuration",
                **{f"derived.{k}": _PROTOCOL for k in _BYTES}})

    def __init__(self, cfg: RunConfig, clients, *, meta: FederationMeta, parent_run_id: str | None = None,
                 run_tags: dict[str, str] | None = None, mechanism_seed: int | None = None):
        if meta.num_clients != cfg.partition.num_shards:
            raise ConfigError(f"partition.num_shards: {cfg.partition.num_shards}, but {meta.num_clients} clients")
        Trainer.__init__(self, cfg, parent_run_id=parent_run_id, run_tags=run_tags)  # not data-parallel
        self.spec, self.num_classes, self.K, self.n = meta.spec, meta.spec["num_classes"], meta.num_clients, meta.n
        self.plan = FEDERATED.plan(cfg, self.n)  # K = partition.num_shards clients
        models = generator_models(cfg, self.spec, self.device)  # G, G_ema and G's Adam, as GS-WGAN's
        self.state = ServerState(
            method=self.NAME, **models, D=fresh_discriminator(cfg, self.spec, shard_index=0), clients=clients,
            mechanism=MechanismRandomness(device=self.device, secure_mode=cfg.privacy.secure_mode, seed=mechanism_seed),
            rng=torch.Generator(device=self.device).manual_seed(derived_seed(cfg.train.seed, "latents")))
        self.receipts = Receipts(self.trace, self.plan.event, releases=self.plan.releases)

    def train_step(self) -> None:
        g_step(self.state, self.receipts, cfg=self.cfg, plan=self.plan, num_clients=self.K, iteration=self.step + 1)
        self.step += 1
        self.g_steps += 1

    def details(self) -> dict:
        """GS-WGAN's details and the federation's: privacy_unit, clients, delta_below_one_over_clients (client-level
        reading of δ; the audit checks δ < 1/n), transport, bytes per iteration to / from the clients (control
        messages included) and in all, and bytes_at_stop. Closes the transport: STOP to every client."""
        to_clients, from_clients, bytes_at_stop = self.state.clients.close(self.step)
        self._federation = {"privacy_unit": "client", "clients": self.K,
                            "delta_below_one_over_clients": self.cfg.privacy.delta < 1 / self.K,
                            "transport": self.state.clients.transport, "bytes_per_iteration_to_clients": to_clients,
                            "bytes_per_iteration_from_clients": from_clients,
                            "bytes_per_iteration": to_clients + from_clients}
        return {**super().details(), **self._federation, "bytes_at_stop": bytes_at_stop}

    def final_metrics(self) -> dict:  # the bytes per iteration; the federation's details as derived.* parameters
        return {**{k: self._federation[k] for k in _BYTES}, **{f"derived.{k}": v for k, v in self._federation.items()}}


class FederatedGSWGANTrainer(FederatedServer):
    """The in-process reference: the server and all K clients in this process."""

    def __init__(self, cfg: RunConfig, shards: list[ImageDataset], *, warm: dict[int, bytes] | None = None,
                 mechanism_seed: int | None = None, **kwargs):
        """``mechanism_seed``: tests only (the multi-process run given the same one must match bit for bit)."""
        meta = federation_meta(cfg, shards)
        sigma = FEDERATED.plan(cfg, meta.n).noise_multiplier
        choice_seed, client_seeds = mechanism_seeds(mechanism_seed, len(shards))
        clients = [make_client(cfg, s.to_tensors(), spec=meta.spec, shard_index=k, warm=(warm or {}).get(k),
                               mechanism_seed=client_seeds[k]) for k, s in enumerate(shards)]
        super().__init__(cfg, InProcessClients(cfg, clients, noise_multiplier=sigma, moved=message_bytes(cfg, meta.spec)),
                         meta=meta, mechanism_seed=choice_seed, **kwargs)


__all__ = ["Client", "FederatedGSWGANTrainer", "ServerState", "client_update", "g_step", "FederatedServer", "federation_meta", "make_client", "mechanism_seeds"]
