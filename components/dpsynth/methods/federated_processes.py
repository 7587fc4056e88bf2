"""The federated GS-WGAN's processes and their transport: the server (rank 0) and K clients (client k is rank k + 1) of one
``torchrun`` job, talking over torch.distributed/gloo.

    torchrun --standalone --nproc-per-node K+1 -m dpsynth train --run-dir RUN_DIR ...

torch's elastic launcher starts the K + 1 processes, gives them the rendezvous, and supervises them: a rank
that fails (an exception, a signal) makes torchrun stop the others and exit non-zero with that rank's error.
A plain ``dpsynth train --run-dir`` (or ``dpsynth pipeline run``) in one process starts that job itself
(:func:`dpsynth.stages.train.run`): the train stage is then rank 0 of the job, as for the data-parallel methods.

* Rank 0 is the stage (:func:`dpsynth.stages.train.run`: the reuse decision, the ledger attempt, the MLflow
  run, ``sensitive/train/``, the manifest) and the server (:class:`FederatedProcesses`): it is given
  metadata only — n from the partition manifest, the image shape from client 0 — never a shard or a D_k.
* Rank k + 1 is client k (:func:`dpsynth.stages.train.follow`): it reads and verifies its own shard and its own warm D_k
  only, answers the server's requests (:func:`serve`) and writes nothing but its own checkpoint.

The algorithm (:class:`~dpsynth.methods.gswgan_federated.FederatedServer`,
:class:`~dpsynth.methods.gswgan_federated.Client`, the accounting) is in
:mod:`dpsynth.methods.gswgan_federated`; this module only moves its messages and places its processes.
The messages of a round are the protocol in :mod:`dpsynth.methods.gswgan_federated`'s docstring;
:class:`GlooClients` counts every byte of them (checkpoint messages are counted apart).

Checkpoints: the server's (``checkpoints/last.pt``, written by rank 0 through the training loop) holds
the round at which every client saved its own state — D_k, its optimizer, its RNGs and its secret noise
coins — to ``checkpoints/clients/client-<k>-<round>.pt`` (written by client k only; the server never sees
it). Each client keeps its last two, so whichever of the server's checkpoints is on disk, the clients'
of the same round are too. On resume the server tells every client the round to load.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from dpsynth.config import RunConfig
from dpsynth.data import ImageDataset
from dpsynth.errors import ConfigError, DpsynthError
from dpsynth.training.result import TrainResult
from dpsynth.methods.networks import image_spec
from dpsynth.methods.gswgan_federated import Client, FederatedServer, FederationMeta, client_update, make_client
from dpsynth.mechanisms import distributed
from dpsynth.mechanisms.generator_gradient import FEDERATED
from dpsynth.methods.warm_starts import warm_start_shard
from dpsynth.methods.method import Method, require

NAME = "gswgan_federated"
CONTINUE, STOP, CHECKPOINT, RESUME = 1, 0, 2, 3
CLIENT_CHECKPOINTS = "clients"  # under checkpoints/: client-<k>-<round>.pt, each written by its client only


def world_size(cfg: RunConfig) -> int:
    """The job's ranks: the server and K = partition.num_shards clients."""
    return cfg.partition.num_shards + 1


def launch(cfg: RunConfig) -> distributed.Ranks:
    """Join the torchrun job (when there is one) for ``dpsynth train``: gloo on every rank, whatever
    ``train.device`` (the messages travel as CPU tensors); a job of any other size than K + 1 is refused."""
    ranks = distributed.env_ranks()
    if not ranks.distributed:
        return distributed.SINGLE
    if ranks.world_size != world_size(cfg):
        raise ConfigError(
            f"partition.num_shards: {NAME} runs the server and K = {cfg.partition.num_shards} clients as "
            f"{world_size(cfg)} ranks, but torchrun started WORLD_SIZE={ranks.world_size} (--nproc-per-node); "
            f"launch it with --nproc-per-node {world_size(cfg)}, or run `dpsynth train --run-dir` in one process "
            "and it starts the job itself")
    return distributed.init_process_group(torch.device("cpu"))


# --- the transport ---------------------------------------------------------------------------


class GlooClients:
    """Client k is rank k + 1 of the gloo process group; counts every byte of the protocol sent and received
    (``sent``, ``received``; the checkpoint and resume messages apart, in ``checkpoint_bytes``)."""

    transport = "torch.distributed/gloo"

    def __init__(self, *, spec: dict, batch_size: int):
        self.shape = (batch_size, spec["channels"], spec["image_size"], spec["image_size"])
        self.sent = self.received = self.checkpoint_bytes = 0
        self.rounds = 0  # requests answered so far, over the whole run (names the clients' checkpoints)

    def _send(self, t: torch.Tensor, rank: int) -> int:
        torch.distributed.send(t.contiguous(), dst=rank)
        return t.element_size() * t.numel()

    def ask(self, k: int, fake_x: torch.Tensor, fake_y: torch.Tensor) -> torch.Tensor:
        self.sent += self._send(torch.tensor([CONTINUE], dtype=torch.int64), k + 1)
        self.sent += self._send(fake_x.detach().to("cpu", torch.float32), k + 1)
        self.sent += self._send(fake_y.to("cpu", torch.int64), k + 1)
        reply = torch.empty(self.shape, dtype=torch.float32)
        torch.distributed.recv(reply, src=k + 1)
        self.received += reply.element_size() * reply.numel()
        self.rounds += 1
        return reply.to(fake_x.device)

    def _all_clients(self, control: int) -> None:
        """``control`` (CHECKPOINT or RESUME) and the round to every client; then each one's acknowledgement."""
        world = torch.distributed.get_world_size()
        for rank in range(1, world):
            self.checkpoint_bytes += self._send(torch.tensor([control], dtype=torch.int64), rank)
            self.checkpoint_bytes += self._send(torch.tensor([self.rounds], dtype=torch.int64), rank)
        for rank in range(1, world):
            ack = torch.empty(1, dtype=torch.int64)
            torch.distributed.recv(ack, src=rank)
            self.checkpoint_bytes += 8

    def close(self, steps: int = 0) -> tuple[int, int, int]:
        """STOP to every client; the bytes per iteration (of ``steps``) to and from the clients, and at the STOP."""
        sent_before, received_before = self.sent, self.received
        for rank in range(1, torch.distributed.get_world_size()):
            self.sent += self._send(torch.tensor([STOP], dtype=torch.int64), rank)
        steps = max(steps, 1)
        to_clients, from_clients = sent_before // steps, received_before // steps
        if to_clients * steps != sent_before or from_clients * steps != received_before:
            raise DpsynthError("federated transport: bytes per iteration are not constant; protocol broken")
        return to_clients, from_clients, self.sent - sent_before

    def state_dict(self) -> dict:
        """Every client checkpoints its own state at this round (acknowledged before the server's checkpoint
        is written); the server's holds the round and its own byte counts, nothing of a client's."""
        self._all_clients(CHECKPOINT)
        return {"rounds": self.rounds, "sent": self.sent, "received": self.received}

    def load_state_dict(self, state: dict) -> None:
        if "rounds" not in state:
            raise ConfigError("output.resume: this checkpoint holds no clients' round (written in one process); "
                              "clear the checkpoints or set output.resume=false")
        self.rounds, self.sent, self.received = state["rounds"], state["sent"], state["received"]
        self._all_clients(RESUME)


def serve(client: Client, *, cfg: RunConfig, spec: dict, noise_multiplier: float, checkpoints: Path | None,
          shard_index: int) -> int:
    """Client side of the protocol: answer requests from rank 0 until STOP; returns the requests answered.
    CHECKPOINT / RESUME, then the round r: save / load this client's state of round r under ``checkpoints``
    (None: a run that cannot resume, e.g. a remote run directory), then acknowledge."""
    batch_size = cfg.gswgan.batch_size
    shape = (batch_size, spec["channels"], spec["image_size"], spec["image_size"])
    device = client.images.device
    rounds = 0
    while True:
        control = torch.empty(1, dtype=torch.int64)
        torch.distributed.recv(control, src=0)
        if int(control) == STOP:
            return rounds
        if int(control) in (CHECKPOINT, RESUME):
            round_ = torch.empty(1, dtype=torch.int64)
            torch.distributed.recv(round_, src=0)
            (_save if int(control) == CHECKPOINT else _load)(client, checkpoints, shard_index, int(round_))
            torch.distributed.send(torch.ones(1, dtype=torch.int64), dst=0)
            continue
        fake_x, fake_y = torch.empty(shape, dtype=torch.float32), torch.empty(batch_size, dtype=torch.int64)
        torch.distributed.recv(fake_x, src=0)
        torch.distributed.recv(fake_y, src=0)
        released = client_update(client, fake_x.to(device), fake_y.to(device), cfg=cfg,
                                 noise_multiplier=noise_multiplier)
        torch.distributed.send(released.detach().to("cpu", torch.float32).contiguous(), dst=0)
        rounds += 1


def _client_file(checkpoints: Path, shard_index: int, round_: int) -> Path:
    return checkpoints / f"client-{shard_index}-{round_}.pt"


def _save(client: Client, checkpoints: Path | None, shard_index: int, round_: int) -> None:
    """Client k's state at ``round_``, written atomically; its older files but the previous one removed (the
    server's checkpoint on disk is of this round or of the previous one), and any of a later round (left by
    an earlier run: rounds only grow within a run)."""
    if checkpoints is None:
        return
    checkpoints.mkdir(parents=True, exist_ok=True)
    path = _client_file(checkpoints, shard_index, round_)
    tmp = path.with_suffix(".tmp")
    torch.save(client.state_dict(), tmp)
    os.replace(tmp, path)
    mine = sorted((int(p.stem.rsplit("-", 1)[1]), p) for p in checkpoints.glob(f"client-{shard_index}-*.pt"))
    earlier = [p for r, p in mine if r <= round_]
    for old in earlier[:-2] + [p for r, p in mine if r > round_]:
        old.unlink()


def _load(client: Client, checkpoints: Path | None, shard_index: int, round_: int) -> None:
    path = None if checkpoints is None else _client_file(checkpoints, shard_index, round_)
    if path is None or not path.exists():
        raise ConfigError(f"output.resume: client {shard_index} has no checkpoint of round {round_} ({path}); "
                          "clear the checkpoints or set output.resume=false")
    client.load_state_dict(torch.load(path, map_location="cpu", weights_only=False))


# --- the ranks ----------------------------------------------------------------------------------


class FederatedProcesses:
    """What ``train.method=gswgan_federated`` runs (the registry's trainer) on rank 0 of the job: the server.

    ``FederatedProcesses(cfg, n, parent_run_id=…, run_tags=…).train()``: ``n``, the number of training records
    (the partition manifest's), is all it is given of the data; the image spec comes from client 0. The clients
    (:func:`client_main`) run on ranks 1 … K. ``mechanism_seed``: tests only (the seed of the server's client
    choice, :func:`~dpsynth.methods.gswgan_federated.mechanism_seeds`); None: drawn from OS entropy."""

    MLFLOW_KEYS = FederatedServer.MLFLOW_KEYS  # the server logs the run

    def __init__(self, cfg: RunConfig, n: int, *, parent_run_id: str | None = None,
                 run_tags: dict[str, str] | None = None, mechanism_seed: int | None = None):
        ranks = distributed.current()
        if not isinstance(n, int):
            raise TypeError("FederatedProcesses: the server is given the number of records, never the data")
        if ranks.world_size != world_size(cfg) or not ranks.is_main:
            raise ConfigError(f"train.method: {NAME} runs as rank 0 of a torchrun job of K + 1 = {world_size(cfg)} "
                              "ranks; `dpsynth train --run-dir` in one process starts that job")
        spec = ranks.from_rank(1, None)  # client 0's image spec: the server holds no records
        meta = FederationMeta(spec=spec, n=n, num_clients=cfg.partition.num_shards)
        self.server = FederatedServer(cfg, GlooClients(spec=spec, batch_size=cfg.gswgan.batch_size), meta=meta,
                                      parent_run_id=parent_run_id, run_tags=run_tags, mechanism_seed=mechanism_seed)
        ranks.from_main(self.server.plan.noise_multiplier)  # every client sanitizes with the server's plan's σ

    def train(self, *, stop_after: int | None = None) -> TrainResult | None:
        result = self.server.train(stop_after=stop_after)
        if result is None:  # stopped part-way (tests): the clients stop too (at the end, finish() tells them)
            self.server.state.clients.close()
        return result


def client_main(cfg: RunConfig, shard: ImageDataset, *, warm: bytes | None,
                checkpoints: Path | None, mechanism_seed: int | None = None) -> int:
    """Rank k + 1: client k with its own shard and D_k only, until the server says STOP; the requests answered.
    ``mechanism_seed``: tests only (the seed of its noise); None: drawn from OS entropy."""
    ranks = distributed.current()
    k = ranks.rank - 1
    spec = ranks.from_rank(1, image_spec(cfg, shard) if k == 0 else None)  # client 0's, on every rank
    sigma = ranks.from_main(None)  # the server's plan's
    client = make_client(cfg, shard.to_tensors(), spec=spec, shard_index=k, warm=warm, mechanism_seed=mechanism_seed)
    return serve(client, cfg=cfg, spec=spec, noise_multiplier=sigma, checkpoints=checkpoints, shard_index=k)


def validate(cfg: RunConfig) -> None:  # its rules across sections
    require(not cfg.warmup.central_images, "warmup.central_images",
            "the federated GS-WGAN server holds no records to release; set warmup.central_images=false")


METHOD = Method(
    NAME, trainer=FederatedProcesses, mechanism=FEDERATED, warm_start="shard", warm_start_function=warm_start_shard,
    sections=("gswgan",), default_n_d=FEDERATED.n_dis, networks="gswgan.generator", federated=True, validate=validate)

__all__ = ["METHOD", "FederatedProcesses", "GlooClients", "client_main", "launch", "serve", "world_size"]
