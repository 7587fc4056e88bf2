"""The federated GS-WGAN's processes: the server (rank 0) and K clients (ranks 1..K) over
torch.distributed/gloo on loopback, each in its own process.

The algorithm (:class:`~dpsynth.methods.gswgan_federated.FederatedServer`,
:class:`~dpsynth.methods.gswgan_federated.Client`, the accounting) is in
:mod:`dpsynth.methods.gswgan_federated`; this module only moves its messages and runs its processes.
The server process is given metadata only (n, K, image shape), never a shard; client k its own shard
and D_k only. The messages of a round are the protocol in :mod:`dpsynth.methods.gswgan_federated`'s
docstring; :class:`GlooClients` counts every byte of them.
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
from dataclasses import asdict, replace
from pathlib import Path

import torch

from dpsynth.config import RunConfig
from dpsynth.data import ImageDataset
from dpsynth.errors import ConfigError, DpsynthError
from dpsynth.methods.core import TrainResult
from dpsynth.methods.gswgan_federated import (
    Client,
    FederatedServer,
    FederationMeta,
    federation_meta,
    make_client,
    mechanism_seeds,
    plan_federated_privacy,
)

CONTINUE, STOP = 1, 0
IDLE_TIMEOUT_S = 7 * 24 * 3600.0  # how long a client may wait for its next request (see client_main)


# --- the transport ---------------------------------------------------------------------------


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


__all__ = ["FederatedProcesses", "GlooClients", "client_main", "process_jobs", "serve", "server_main",
           "train_federated"]
