"""GS-WGAN, federated (Chen, Orekondy & Fritz 2020, supplement Algorithm 2).

Clients keep their data and their discriminator D_k; the server holds the generator. Each
iteration the server picks a client k uniformly and runs n_dis (``train.n_d``) rounds: it sends B generated
images G(z_i, y_i) (and their labels), the client takes one WGAN-GP step of D_k on a real batch
of its own data and those fakes, and returns the B *sanitized* gradients clip(∂ℓ_i/∂x_i, C) +
N(0, σ²C²) — computed on the client, so the server never sees anything unsanitized. The server
updates G with the last round's gradients (Algorithm 2, line 11).

Two transports run the same server (:class:`FederatedServer`) and the same :class:`Client`:

* :func:`train_federated` — what ``train.method=gswgan_federated`` runs: the server (rank 0)
  and each client k (rank k+1) in its own process, talking over torch.distributed/gloo on
  loopback. The server process is given metadata only (n, K, image shape), never a shard.
* :class:`FederatedGSWGANTrainer` — the same protocol in one process (the reference the
  multi-process run must match bit for bit, given the same train.seed and, in tests, the same
  mechanism seed).

Secret coins: the server's client choice and each client's noise come from
:class:`~dpsynth.privacy.randomness.MechanismRandomness` seeded from one master seed drawn from OS
entropy per run (:func:`mechanism_seeds`), handed to each process in memory and never logged.

Protocol, per round (server → client k, then client k → server); every message is counted:

    control  int64[1]            CONTINUE (or STOP, once per client at the end)
    fakes    float32[B, C, H, W]
    labels   int64[B]
    reply    float32[B, C, H, W]  the sanitized gradients

Accounting: every round's B releases reach the (untrusted) server, all computed on client k's
data, so one iteration is ONE without-replacement event at rate 1/K whose noise multiplier
folds all n_dis·B releases: σ/√(n_dis·B). (Counting only the B releases the server uses would
be unsound: the other rounds' releases are also observed.)

Against whom. The rate-1/K amplification needs the client choice to be secret; the server makes it,
so the audited ε holds against everyone *but* the server (who sees only the released generator).
Against the server, which sees the choice and every sanitized release, the guarantee is the account
without amplification (:func:`privacy_statement`, :func:`dpsynth.privacy.statement.revealed_choice_account`);
the audit states both; only the first rests on GS-WGAN's shard-state assumption.

Client-level guarantee. The same ε holds when neighbouring datasets differ in one client's
*entire* shard: whatever a client's data, each release it sends is clipped to norm ≤ C, so
replacing all of its records moves each release by ≤ 2C — the very sensitivity the
``replace_one`` event already charges for one record — and each iteration draws 1 of K clients
uniformly (without replacement within the iteration), the rate 1/K the event already carries.
The warm start and D_k's state depend only on client k's own data and stay on the client. What
changes is the unit δ is read against: one client of K, so δ should be < 1/K; that is recorded
(``delta_below_one_over_clients``), while the audit checks the record-level δ < 1/n. Clients
here are the shards of ``dpsynth partition`` (a keyed hash of record ids); one client per
*user* needs a partition by user, which the partition stage does not build yet.
"""

from __future__ import annotations

import datetime
import multiprocessing.connection
import os
import queue
import signal
import socket
import sys
import time
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from dpsynth import tracking
from dpsynth.config import RunConfig
from dpsynth.data import ImageDataset
from dpsynth.errors import ConfigError, DpsynthError, PrivacyError
from dpsynth.methods import registry
from dpsynth.methods.core import TrainResult, resolve_device
from dpsynth.methods.loop import Trainer
from dpsynth.methods.gswgan import (
    GSWGANTrainer,
    PrivacyPlan,
    _adam,
    _cpu_copy,
    _cpu_rng,
    _image_spec,
    _init_with_seed,
    audit_invariants as _gswgan_invariants,
    critic_loss,
    derived_seed,
    discriminator_kwargs,
    fresh_discriminator,
    generator_kwargs,
    plan_privacy,
    read_discriminator,
    real_batch,
    sanitize,
)
from dpsynth.models.gswgan import Generator
from dpsynth.privacy import MechanismTrace, fold_releases, gswgan_event
from dpsynth.privacy.randomness import MechanismRandomness, secret_seed

CONTINUE, STOP = 1, 0
IDLE_TIMEOUT_S = 7 * 24 * 3600.0  # how long a client may wait for its next request (see client_main)
PRIVACY_UNIT = ("client: neighbouring datasets differ in one client's entire shard "
                "(and hence also at record level: in one record)")


# --- the client -------------------------------------------------------------------------------


class Client:
    """One client: its data, its D_k and D_k's optimizer; answers a batch of fakes with sanitized gradients."""

    def __init__(self, cfg: RunConfig, shard: tuple[torch.Tensor, torch.Tensor], D: torch.nn.Module,
                 opt: torch.optim.Optimizer, *, data_rng: torch.Generator, rng: torch.Generator,
                 randomness: MechanismRandomness | None = None):
        """``rng`` draws the critic's interpolation weights (train.seed); ``randomness`` the noise
        (the mechanism's secret coins; None: fresh OS-entropy coins)."""
        self.cfg, (self.images, self.labels), self.D, self.opt = cfg, shard, D, opt
        self.data_rng, self.rng = data_rng, rng
        self.randomness = randomness or MechanismRandomness(device=self.images.device,
                                                            secure_mode=cfg.privacy.secure_mode)

    def update(self, fake_x: torch.Tensor, fake_y: torch.Tensor, *, noise_multiplier: float) -> torch.Tensor:
        """ClientUpdate (Algorithm 2, lines 28–32): one step of D_k, then the sanitized ∂(−D_k)/∂x_i."""
        g = self.cfg.gswgan
        real_x, real_y = real_batch(self.images, self.labels, size=g.batch_size, rng=self.data_rng)
        n = min(len(real_x), len(fake_x))  # the critic pairs each real record with a fake
        loss = critic_loss(self.D, real_x[:n], real_y[:n], fake_x[:n].detach(), gp_weight=g.gp_weight,
                           drift_weight=g.drift_weight, generator=self.rng)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.D.requires_grad_(False).eval()
        try:
            x = fake_x.detach().requires_grad_(True)
            (grads,) = torch.autograd.grad(-self.D(x, fake_y).sum(), x)
        finally:
            self.D.requires_grad_(True).train()
        return sanitize(grads, clip_norm=self.cfg.privacy.max_grad_norm, noise_multiplier=noise_multiplier,
                        randomness=self.randomness)

    def state_dict(self) -> dict:
        return {"D": _cpu_copy(self.D.state_dict()), "opt": _cpu_copy(self.opt.state_dict()),
                "data_rng": self.data_rng.get_state(), "rng": self.rng.get_state(),
                "randomness": self.randomness.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.D.load_state_dict(state["D"])
        self.opt.load_state_dict(state["opt"])
        self.data_rng.set_state(state["data_rng"])
        self.rng.set_state(state["rng"])
        self.randomness.load_state_dict(state["randomness"])


def mechanism_seeds(master: int | None, num_clients: int) -> tuple[int, list[int]]:
    """The secret seeds of the server's client choice and of each client's noise, from one master seed
    (None: a fresh :func:`~dpsynth.privacy.randomness.secret_seed`). The master is drawn once per run by
    whoever launches it and passed to the processes in memory only; nothing logs or stores it."""
    master = secret_seed() if master is None else master
    return derived_seed(master, "client-choice"), [derived_seed(master, "client-noise", k) for k in range(num_clients)]


def make_client(cfg: RunConfig, shard: tuple[torch.Tensor, torch.Tensor], *, spec: dict, shard_index: int,
                warm: bytes | None, mechanism_seed: int | None = None) -> Client:
    """Client k with its warm-started D_k (or a fresh one), RNGs of its own seeded by train.seed and k,
    and its secret noise coins (``mechanism_seed``, from :func:`mechanism_seeds`; None: fresh)."""
    device = resolve_device(cfg.train.device)
    D = fresh_discriminator(cfg, spec, shard_index=shard_index).to(device)
    if warm is not None:
        D.load_state_dict(read_discriminator(warm, expect_kwargs=discriminator_kwargs(cfg, spec),
                                             shard_index=shard_index))
    seed = cfg.train.seed
    return Client(cfg, tuple(t.to(device) for t in shard), D, _adam(D.parameters(), lr=cfg.gswgan.lr_d, cfg=cfg),
                  data_rng=_cpu_rng(seed, "client-real-batches", shard_index),
                  rng=torch.Generator(device=device).manual_seed(derived_seed(seed, "client-critic", shard_index)),
                  randomness=MechanismRandomness(device=device, secure_mode=cfg.privacy.secure_mode,
                                                 seed=mechanism_seed))


# --- privacy plan ----------------------------------------------------------------------------


def plan_federated_privacy(cfg: RunConfig, *, n: int, num_shards: int) -> PrivacyPlan:
    """As :func:`plan_privacy`, with n_dis·B releases folded per iteration (sound accounting only)."""
    if cfg.privacy.accounting != "sound":
        raise ConfigError("privacy.accounting: federated GS-WGAN has no published account to reproduce here")
    releases = registry.n_d(cfg) * cfg.gswgan.batch_size
    plan = plan_privacy(replace(cfg, gswgan=replace(cfg.gswgan, batch_size=releases)), n=n, num_shards=num_shards)
    event = gswgan_event(noise_multiplier=plan.noise_multiplier, batch_size=releases, num_shards=num_shards)
    assert event == plan.event
    return plan


# --- what the server may know ----------------------------------------------------------------


@dataclass(frozen=True)
class FederationMeta:
    """Data-independent metadata the server is given instead of the shards."""

    spec: dict  # num_classes, channels, image_size
    n: int  # total records (for δ < 1/n and the plan)
    num_clients: int
    dataset_name: str


def federation_meta(cfg: RunConfig, shards: list[ImageDataset]) -> FederationMeta:
    return FederationMeta(
        spec=_image_spec(cfg, shards[0]), n=sum(len(s) for s in shards), num_clients=len(shards),
        dataset_name=Path(str(cfg.data.uri).rstrip("/")).stem or "dataset")


def message_bytes(cfg: RunConfig, spec: dict) -> dict:
    """Bytes per generator iteration, from the protocol alone (data-independent: shapes only)."""
    B, image = cfg.gswgan.batch_size, spec["channels"] * spec["image_size"] ** 2
    rounds = registry.n_d(cfg)
    to_client = rounds * (8 + B * image * 4 + B * 8)
    from_client = rounds * B * image * 4
    return {"to_clients": to_client, "from_clients": from_client, "total": to_client + from_client}


# --- transports ------------------------------------------------------------------------------


class InProcessClients:
    """All K clients in this process (the reference)."""

    transport = "in_process"

    def __init__(self, clients: list[Client], *, noise_multiplier: float):
        self.clients, self.noise_multiplier = clients, noise_multiplier

    def ask(self, k: int, fake_x: torch.Tensor, fake_y: torch.Tensor) -> torch.Tensor:
        return self.clients[k].update(fake_x, fake_y, noise_multiplier=self.noise_multiplier)

    def close(self) -> None:
        pass

    def state_dict(self) -> dict:
        return {"clients": [c.state_dict() for c in self.clients]}

    def load_state_dict(self, state: dict) -> None:
        for c, s in zip(self.clients, state["clients"]):
            c.load_state_dict(s)


class GlooClients:
    """Client k is rank k + 1 of the gloo process group; counts every byte sent and received."""

    transport = "torch.distributed/gloo"

    def __init__(self, *, spec: dict, batch_size: int):
        self.shape = (batch_size, spec["channels"], spec["image_size"], spec["image_size"])
        self.sent = self.received = 0

    def _send(self, t: torch.Tensor, rank: int) -> None:
        torch.distributed.send(t.contiguous(), dst=rank)
        self.sent += t.element_size() * t.numel()

    def ask(self, k: int, fake_x: torch.Tensor, fake_y: torch.Tensor) -> torch.Tensor:
        self._send(torch.tensor([CONTINUE], dtype=torch.int64), k + 1)
        self._send(fake_x.detach().to("cpu", torch.float32), k + 1)
        self._send(fake_y.to("cpu", torch.int64), k + 1)
        reply = torch.empty(self.shape, dtype=torch.float32)
        torch.distributed.recv(reply, src=k + 1)
        self.received += reply.element_size() * reply.numel()
        return reply.to(fake_x.device)

    def close(self) -> None:
        for rank in range(1, torch.distributed.get_world_size()):
            self._send(torch.tensor([STOP], dtype=torch.int64), rank)

    def state_dict(self) -> dict:
        return {}  # the clients' D_k stay with the clients (see train_federated: no resume)

    def load_state_dict(self, state: dict) -> None:
        pass


def serve(client: Client, *, spec: dict, batch_size: int, noise_multiplier: float) -> int:
    """Client side of the protocol: answer requests from rank 0 until STOP; returns the rounds answered."""
    shape = (batch_size, spec["channels"], spec["image_size"], spec["image_size"])
    device = client.images.device
    rounds = 0
    while True:
        control = torch.empty(1, dtype=torch.int64)
        torch.distributed.recv(control, src=0)
        if int(control) == STOP:
            return rounds
        fake_x, fake_y = torch.empty(shape, dtype=torch.float32), torch.empty(batch_size, dtype=torch.int64)
        torch.distributed.recv(fake_x, src=0)
        torch.distributed.recv(fake_y, src=0)
        released = client.update(fake_x.to(device), fake_y.to(device), noise_multiplier=noise_multiplier)
        torch.distributed.send(released.detach().to("cpu", torch.float32).contiguous(), dst=0)
        rounds += 1


# --- the server --------------------------------------------------------------------------------


class Receipts:
    """The server's accountant hook. The clients sanitize (and draw the noise) in their own processes, so the
    server, which holds the trace, counts the sanitized releases it receives and, once an iteration's are all
    in, records the one event that folds them (σ/√(n_dis·B)); an iteration with any other count is refused."""

    def __init__(self, trace: MechanismTrace, event, *, releases: int):
        self.trace, self.event, self.releases, self.count = trace, event, releases, 0

    def received(self, released: torch.Tensor) -> torch.Tensor:
        self.count += len(released)
        return released

    def end_iteration(self) -> None:
        count, self.count = self.count, 0
        if count != self.releases:
            raise PrivacyError(f"federated server: {count} sanitized releases received in one iteration, but its "
                               f"event folds {self.releases} (n_dis·B); refusing to account for them otherwise")
        self.trace.record(self.event)


_PROTOCOL = "bytes of the protocol's messages: from shapes (config) alone"


class FederatedServer(GSWGANTrainer):
    """The server of Algorithm 2: G, G_ema, opt_g, the plan, the trace and the shard choice. No data."""

    method = "gswgan_federated"
    MLFLOW_KEYS = GSWGANTrainer.MLFLOW_KEYS | tracking.LoggedKeys(
        metrics={k: _PROTOCOL for k in ("bytes_per_iteration_to_clients", "bytes_per_iteration_from_clients",
                                        "bytes_per_iteration")},
        params={"derived.privacy_unit": "client (fixed)", "derived.clients": "K (configuration)",
                "derived.transport": "the transport's name",
                "derived.delta_below_one_over_clients": "δ < 1/K, from the configuration",
                **{f"derived.{k}": _PROTOCOL for k in ("bytes_per_iteration_to_clients",
                                                        "bytes_per_iteration_from_clients", "bytes_per_iteration")}})

    def __init__(self, cfg: RunConfig, clients, *, meta: FederationMeta, parent_run_id: str | None = None,
                 run_tags: dict[str, str] | None = None, mechanism_seed: int | None = None):
        if meta.num_clients != cfg.partition.num_shards:
            raise ConfigError(f"partition.num_shards: {cfg.partition.num_shards}, but {meta.num_clients} clients")
        Trainer.__init__(self, cfg, parent_run_id=parent_run_id, run_tags=run_tags)
        self.clients = clients
        g, seed = cfg.gswgan, cfg.train.seed
        self.spec, self.num_classes = meta.spec, meta.spec["num_classes"]
        self.K, self.n = meta.num_clients, meta.n
        self.dataset_name = meta.dataset_name
        self.plan = plan_federated_privacy(cfg, n=self.n, num_shards=self.K)
        self.G = _init_with_seed(derived_seed(seed, "generator"),
                                 lambda: Generator(**generator_kwargs(cfg, self.spec))).to(self.device)
        self.G_ema = Generator(**generator_kwargs(cfg, self.spec)).to(self.device).requires_grad_(False)
        self.G_ema.load_state_dict(self.G.state_dict())
        self.opt_g = _adam(self.G.parameters(), lr=g.lr_g, cfg=cfg)
        self.D = fresh_discriminator(cfg, self.spec, shard_index=0)  # architecture only: logs its parameter count
        # the secret client choice k ~ U[0, K) (never train.seed, never logged)
        self.mechanism = MechanismRandomness(device=self.device, secure_mode=cfg.privacy.secure_mode,
                                             seed=mechanism_seed)
        self.rng = torch.Generator(device=self.device).manual_seed(derived_seed(seed, "latents"))
        self.receipts = Receipts(self.trace, self.plan.event, releases=self.plan.releases)

    def iteration(self) -> None:
        g, rounds = self.cfg.gswgan, registry.n_d(self.cfg)
        k = self.mechanism.choice(self.K)
        for r in range(rounds):  # every round's answer is a release the server sees
            labels = torch.randint(0, self.num_classes, (g.batch_size,), device=self.device, generator=self.rng)
            z = torch.randn(g.batch_size, self.G.latent_dim, device=self.device, generator=self.rng)
            with torch.set_grad_enabled(r == rounds - 1):  # only the last round's graph is needed
                x = self.G(z, labels)
            released = self.receipts.received(self.clients.ask(k, x.detach(), labels))
        self.receipts.end_iteration()  # records the event that folds the n_dis·B releases received
        self.opt_g.zero_grad(set_to_none=True)
        x.backward(released / g.batch_size)  # the last round's gradients update G (line 11)
        self.opt_g.step()
        self.step += 1
        self.g_steps += 1
        self._update_ema()

    def privacy_record(self) -> dict:
        delta = self.cfg.privacy.delta
        return {"unit": PRIVACY_UNIT, "clients": self.K, "delta_below_one_over_clients": delta < 1 / self.K}

    def method_state(self) -> dict:
        return {"method": self.method, "G": self.G.state_dict(), "G_ema": self.G_ema.state_dict(),
                "opt_g": self.opt_g.state_dict(), "mechanism": self.mechanism.state_dict(),
                "rng": self.rng.get_state(), "clients": self.clients.state_dict()}

    def load_method_state(self, state: dict) -> None:
        self.G.load_state_dict(state["G"])
        self.G_ema.load_state_dict(state["G_ema"])
        self.opt_g.load_state_dict(state["opt_g"])
        self.mechanism.load_state_dict(state["mechanism"])
        self.rng.set_state(state["rng"])
        self.clients.load_state_dict(state["clients"])

    def details(self) -> dict:
        """GS-WGAN's details and the federation's: privacy_unit, clients, delta_below_one_over_clients
        (client-level reading of δ; the audit checks δ < 1/n), transport, bytes per iteration to / from the
        clients (control messages included) and in all, and bytes_at_stop (the K STOP messages at the end).
        Closes the transport: STOP to every client, not part of any iteration."""
        sent_before, received_before = getattr(self.clients, "sent", 0), getattr(self.clients, "received", 0)
        self.clients.close()
        bytes_at_stop = getattr(self.clients, "sent", 0) - sent_before
        if hasattr(self.clients, "sent"):  # measured
            steps = max(self.step, 1)
            to_clients, from_clients = sent_before // steps, received_before // steps
            if to_clients * steps != sent_before or from_clients * steps != received_before:
                raise DpsynthError("federated transport: bytes per iteration are not constant; protocol broken")
        else:  # in-process: what the gloo transport would move
            moved = message_bytes(self.cfg, self.spec)
            to_clients, from_clients, bytes_at_stop = moved["to_clients"], moved["from_clients"], 8 * self.K
        delta = self.cfg.privacy.delta
        self._federation = {"privacy_unit": "client", "clients": self.K,
                            "delta_below_one_over_clients": delta < 1 / self.K, "transport": self.clients.transport,
                            "bytes_per_iteration_to_clients": to_clients,
                            "bytes_per_iteration_from_clients": from_clients,
                            "bytes_per_iteration": to_clients + from_clients}
        return {**super().details(), **self._federation, "bytes_at_stop": bytes_at_stop}

    def final_params(self) -> dict:
        return self._federation

    def final_metrics(self) -> dict:
        return {k: v for k, v in self._federation.items() if k.startswith("bytes_per_iteration")}


class FederatedGSWGANTrainer(FederatedServer):
    """The in-process reference: the server and all K clients in this process."""

    def __init__(self, cfg: RunConfig, shards: list[ImageDataset], *, warm: dict[int, bytes] | None = None,
                 mechanism_seed: int | None = None, **kwargs):
        """``mechanism_seed``: tests only (the multi-process run given the same one must match bit for bit)."""
        if len(shards) != cfg.partition.num_shards:
            raise ConfigError(f"partition.num_shards: {cfg.partition.num_shards}, but {len(shards)} shards were given")
        meta = federation_meta(cfg, shards)
        sigma = plan_federated_privacy(cfg, n=meta.n, num_shards=meta.num_clients).noise_multiplier
        choice_seed, client_seeds = mechanism_seeds(mechanism_seed, len(shards))
        clients = [make_client(cfg, s.to_tensors(), spec=meta.spec, shard_index=k, warm=(warm or {}).get(k),
                               mechanism_seed=client_seeds[k]) for k, s in enumerate(shards)]
        super().__init__(cfg, InProcessClients(clients, noise_multiplier=sigma), meta=meta,
                         mechanism_seed=choice_seed, **kwargs)


# --- processes --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join_group(*, rank: int, world: int, port: int, timeout_s: float) -> None:
    torch.set_num_threads(1)  # K + 1 processes share the machine
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                         world_size=world, timeout=datetime.timedelta(seconds=timeout_s))


def server_main(*, cfg: RunConfig, meta: FederationMeta, port: int, timeout_s: float, parent_run_id: str | None,
                run_tags: dict | None, mechanism_seed: int, results) -> None:
    """Rank 0. Receives metadata only: no shard, no shard URI, no record."""
    try:
        _join_group(rank=0, world=meta.num_clients + 1, port=port, timeout_s=timeout_s)
        clients = GlooClients(spec=meta.spec, batch_size=cfg.gswgan.batch_size)
        server = FederatedServer(cfg, clients, meta=meta, parent_run_id=parent_run_id, run_tags=run_tags,
                                 mechanism_seed=mechanism_seed)
        result = server.train()
        results.put(("result", 0, asdict(result)))
        torch.distributed.destroy_process_group()
    except BaseException:
        results.put(("error", 0, traceback.format_exc()))
        raise SystemExit(1)


def client_main(*, cfg: RunConfig, shard_index: int, shard: tuple[torch.Tensor, torch.Tensor], warm: bytes | None,
                spec: dict, noise_multiplier: float, port: int, world: int, idle_timeout_s: float,
                mechanism_seed: int, results) -> None:
    """Rank k + 1: client k with its own shard and D_k only.

    A client waits for its next request for about K iterations on average, so its own gloo timeout
    is ``idle_timeout_s`` (long); the server's (``timeout_s``) bounds each request. Either side
    dying closes the connection, which fails the other at once, whatever the timeouts.
    """
    try:
        client = make_client(cfg, shard, spec=spec, shard_index=shard_index, warm=warm, mechanism_seed=mechanism_seed)
        _join_group(rank=shard_index + 1, world=world, port=port, timeout_s=idle_timeout_s)
        rounds = serve(client, spec=spec, batch_size=cfg.gswgan.batch_size, noise_multiplier=noise_multiplier)
        results.put(("done", shard_index + 1, rounds))
        torch.distributed.destroy_process_group()
    except BaseException:
        results.put(("error", shard_index + 1, traceback.format_exc()))
        raise SystemExit(1)


def _role(rank: int) -> str:
    return "server" if rank == 0 else f"client {rank - 1}"


def _call(kwargs: dict, parent: int) -> None:
    if sys.platform.startswith("linux"):  # die with the launcher, even when it is SIGKILLed: no orphans
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the launcher died before prctl
        raise SystemExit(1)
    kwargs.pop("target")(**kwargs)


def process_jobs(cfg: RunConfig, shards: list[ImageDataset], *, meta: FederationMeta, warm: dict[int, bytes] | None,
                 noise_multiplier: float, port: int, timeout_s: float, results, server_kwargs: dict,
                 mechanism_seed: int | None = None) -> list[dict]:
    """What each rank's process is given: the server metadata only, client k its own shard and D_k only
    (and each its own secret seed, in memory: see :func:`mechanism_seeds`)."""
    world = meta.num_clients + 1
    choice_seed, client_seeds = mechanism_seeds(mechanism_seed, meta.num_clients)
    jobs = [dict(target=server_main, cfg=cfg, meta=meta, port=port, timeout_s=timeout_s, results=results,
                 mechanism_seed=choice_seed, **server_kwargs)]
    jobs += [dict(target=client_main, cfg=cfg, shard_index=k, shard=shard.to_tensors(), warm=(warm or {}).get(k),
                  spec=meta.spec, noise_multiplier=noise_multiplier, port=port, world=world,
                  idle_timeout_s=max(timeout_s, IDLE_TIMEOUT_S), mechanism_seed=client_seeds[k], results=results)
             for k, shard in enumerate(shards)]
    return jobs


def train_federated(cfg: RunConfig, shards: list[ImageDataset], *, warm: dict[int, bytes] | None = None,
                    parent_run_id: str | None = None, run_tags: dict[str, str] | None = None,
                    timeout_s: float = 120.0, mechanism_seed: int | None = None) -> dict:
    """Run the server and K clients as K + 1 processes over gloo on loopback; returns the server's result.

    Any process failing terminates the others and raises here with its traceback (no orphans:
    the children are daemonic, killed in ``finally``, and die with this process). ``timeout_s``
    bounds the server's wait for any one message; clients wait for requests up to IDLE_TIMEOUT_S.
    Checkpoints hold the server's state only, so the multi-process run does not resume mid-run.
    ``mechanism_seed``: tests only (compare with the in-process reference); None: drawn from OS entropy.
    """
    if cfg.output.resume and (Path(cfg.output.dir) / "checkpoints").is_dir() and any(
            (Path(cfg.output.dir) / "checkpoints").glob("*.pt")):
        raise ConfigError("output.resume: the multi-process federated run cannot resume (the clients' D_k are "
                          "not checkpointed); clear the checkpoints or set output.resume=false")
    cfg = replace(cfg, output=replace(cfg.output, checkpoint_every=0))
    meta = federation_meta(cfg, shards)
    sigma = plan_federated_privacy(cfg, n=meta.n, num_shards=meta.num_clients).noise_multiplier
    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.Queue()
    jobs = process_jobs(cfg, shards, meta=meta, warm=warm, noise_multiplier=sigma, port=_free_port(),
                        timeout_s=timeout_s, results=results, mechanism_seed=mechanism_seed, server_kwargs=dict(
                            parent_run_id=parent_run_id, run_tags=run_tags))
    procs = [ctx.Process(target=_call, args=(job, os.getpid()), daemon=True, name=f"gswgan-federated-rank{rank}")
             for rank, job in enumerate(jobs)]
    messages, result = [], None
    try:
        for p in procs:
            p.start()
        while True:
            try:
                kind, rank, payload = results.get(timeout=0.2)
                messages.append((kind, rank, payload))
                if kind == "result":
                    result = payload
            except queue.Empty:
                pass
            failed = [(rank, p.exitcode) for rank, p in enumerate(procs) if p.exitcode not in (None, 0)]
            errors = [m for m in messages if m[0] == "error"]
            if failed or errors:
                time.sleep(0.5)  # let the failing process's traceback arrive
                while True:
                    try:
                        messages.append(results.get_nowait())
                    except queue.Empty:
                        break
                errors = sorted(m for m in messages if m[0] == "error")
                exits = ", ".join(f"{_role(r)} (rank {r}) exit code {p.exitcode}"
                                  for r, p in enumerate(procs) if p.exitcode not in (None, 0))
                raise DpsynthError(f"federated GS-WGAN: a process failed ({exits or 'no exit yet'}); " + "; ".join(
                    f"{_role(r)} (rank {r}) failed:\n{tb}" for _, r, tb in errors) if errors else
                    f"federated GS-WGAN: a process died without a traceback ({exits})")
            if all(p.exitcode == 0 for p in procs):
                while result is None:  # the server's result may still be in the pipe
                    kind, rank, payload = results.get(timeout=10)
                    if kind == "result":
                        result = payload
                break
            multiprocessing.connection.wait([p.sentinel for p in procs if p.exitcode is None], timeout=0.2)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    if result is None:
        raise DpsynthError("federated GS-WGAN: the server finished without a result")
    return result


class FederatedProcesses:
    """What ``train.method=gswgan_federated`` runs (the registry's trainer): :func:`train_federated`
    behind the trainer interface, ``FederatedProcesses(cfg, shards, warm=…, **run options).train()``."""

    MLFLOW_KEYS = FederatedServer.MLFLOW_KEYS  # the server process logs the run

    def __init__(self, cfg: RunConfig, shards: list[ImageDataset], *, warm: dict[int, bytes] | None = None,
                 **kwargs):
        self.cfg, self.shards, self.warm, self.kwargs = cfg, shards, warm, kwargs

    def train(self) -> TrainResult:
        return TrainResult(**train_federated(self.cfg, self.shards, warm=self.warm, **self.kwargs))


# --- the audit ------------------------------------------------------------------------------------


def audit_invariants(cfg: RunConfig, trace: MechanismTrace, n: int) -> list[dict]:
    """Checks that a federated GS-WGAN trace is the mechanism this config describes (n_dis·B folded)."""
    g, p = cfg.gswgan, cfg.privacy
    releases = registry.n_d(cfg) * g.batch_size
    checks = _gswgan_invariants(replace(cfg, gswgan=replace(g, batch_size=releases)), trace, n)
    for c in checks:
        c["name"] = c["name"].replace("gswgan.", "gswgan_federated.", 1)
        if c["name"] == "gswgan_federated.noise_multiplier" and p.noise_multiplier is not None:
            folded = fold_releases(p.noise_multiplier, releases)
            c["detail"] = (f"every event folds the n_dis·B = {registry.n_d(cfg)}·{g.batch_size} releases of σ = "
                           f"{p.noise_multiplier}: σ/√{releases} = {folded:.6g}")
    return checks


def audit_plan(cfg: RunConfig, n: int) -> PrivacyPlan:
    """The plan the audit recomputes: :func:`plan_federated_privacy` with K = partition.num_shards clients."""
    return plan_federated_privacy(cfg, n=n, num_shards=cfg.partition.num_shards)


def privacy_statement(cfg: RunConfig, plan: PrivacyPlan, n: int) -> dict:
    """Two guarantees: against everyone but the server (the released generator; rate 1/K amplification,
    under the shard-state assumption), and against the server, which picks the client each iteration and
    so sees the choice: no 1/K amplification (:func:`revealed_choice_account`)."""
    from dpsynth.methods.gswgan import SHARD_STATE_ASSUMPTION, noise_convention, shard_adjacency
    from dpsynth.privacy.statement import revealed_choice_account, statement

    K = cfg.partition.num_shards
    server = revealed_choice_account(plan.event, plan.steps, num_shards=K, delta=cfg.privacy.delta)
    return statement(
        adjacency=shard_adjacency(K, "client") + " The audited ε is the guarantee against everyone except the "
        "server (who sees only the released generator and what is sampled from it).",
        noise=noise_convention(plan.releases, plan),
        assumptions=[SHARD_STATE_ASSUMPTION.replace("shard's discriminator", "client's discriminator")],
        accounts=[{"against": "the server (it picks the client of every iteration, so the choice gives no "
                              "amplification; it also sees every sanitized release)", **server}])


__all__ = [
    "Client",
    "FederatedGSWGANTrainer",
    "FederatedProcesses",
    "FederatedServer",
    "audit_invariants",
    "audit_plan",
    "message_bytes",
    "plan_federated_privacy",
    "privacy_statement",
    "process_jobs",
    "server_main",
    "train_federated",
]
