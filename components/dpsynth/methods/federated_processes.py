"""The federated GS-WGAN's processes: the server (rank 0) and K clients (client k is rank k + 1) of one ``torchrun``
job. Their transport — the messages, the byte counts, the clients' checkpoints, the job's size — is
:mod:`dpsynth.distributed.federation`'s; the algorithm is :mod:`dpsynth.methods.gswgan_federated`'s. This module
places the two on the job's ranks.
"""

from __future__ import annotations

from pathlib import Path

from dpsynth.config import RunConfig
from dpsynth.data import ImageDataset
from dpsynth.distributed import federation, ranks as distributed
from dpsynth.errors import ConfigError
from dpsynth.mechanisms.generator_gradient import FEDERATED
from dpsynth.methods.gswgan_federated import FederatedServer, FederationMeta, client_update, make_client
from dpsynth.methods.method import Method, require
from dpsynth.methods.networks import image_spec
from dpsynth.methods.pretraining import pretrain_shard
from dpsynth.training.result import TrainResult, resolve_device

NAME = "gswgan_federated"


class FederatedProcesses(FederatedServer):
    """What ``train.method=gswgan_federated`` runs (the registry's trainer) on rank 0 of the job: the server, a
    Trainer whose step is one round of the federation (client k drawn, its n_dis requests, G's update), driven by
    the one loop (:func:`dpsynth.training.loop.train`) as every method is; its clients are the transport's.

    ``FederatedProcesses(cfg, n, parent_run_id=…, run_tags=…)``: ``n``, the number of training records
    (the partition manifest's), is all it is given of the data; the image spec comes from client 0. The clients
    (:func:`client_main`) run on ranks 1 … K. ``mechanism_seed``: tests only (the seed of the server's client
    choice, :func:`~dpsynth.methods.gswgan_federated.mechanism_seeds`); None: drawn from OS entropy."""

    def __init__(self, cfg: RunConfig, n: int, *, parent_run_id: str | None = None,
                 run_tags: dict[str, str] | None = None, mechanism_seed: int | None = None):
        ranks = distributed.current()
        if not isinstance(n, int):
            raise TypeError("FederatedProcesses: the server is given the number of records, never the data")
        if ranks.world_size != federation.world_size(cfg) or not ranks.is_main:
            raise ConfigError(f"train.method: {NAME} runs as rank 0 of a torchrun job of "
                              f"K + 1 = {federation.world_size(cfg)} ranks; `dpsynth train --run-dir` in one process "
                              "starts that job")
        spec = ranks.from_rank(1, None)  # client 0's image spec: the server holds no records
        meta = FederationMeta(spec=spec, n=n, num_clients=cfg.partition.num_shards)
        super().__init__(cfg, federation.GlooClients(spec=spec, batch_size=cfg.gswgan.batch_size), meta=meta,
                         parent_run_id=parent_run_id, run_tags=run_tags, mechanism_seed=mechanism_seed)
        ranks.from_main(self.plan.noise_multiplier)  # every client sanitizes with the server's plan's σ

    def train(self, *, stop_after: int | None = None) -> TrainResult | None:
        result = super().train(stop_after=stop_after)
        if result is None:  # stopped part-way (tests): the clients stop too (at the end, finish() tells them)
            self.state.clients.close()
        return result


def client_main(cfg: RunConfig, shard: ImageDataset, *, warm: bytes | None,
                checkpoints: Path | None, mechanism_seed: int | None = None) -> int:
    """Rank k + 1: client k with its own shard and D_k only, until the server says STOP; the requests answered.
    ``mechanism_seed``: tests only (the seed of its noise); None: drawn from OS entropy."""
    ranks = distributed.current()
    k = ranks.rank - 1
    spec = ranks.from_rank(1, image_spec(cfg, shard) if k == 0 else None)  # client 0's, on every rank
    sigma = ranks.from_main(None)  # the server's plan's
    client = make_client(cfg, shard.to_tensors(), spec=spec, shard_index=k, warm=warm, mechanism_seed=mechanism_seed,
                         device=ranks.place(resolve_device(cfg.train.device)))  # a client rank: its local GPU
    shape = (cfg.gswgan.batch_size, spec["channels"], spec["image_size"], spec["image_size"])
    device = client.images.device

    def answer(fake_x, fake_y):  # ClientUpdate on this client's device
        return client_update(client, fake_x.to(device), fake_y.to(device), cfg=cfg, noise_multiplier=sigma)

    return federation.serve(client, answer, shape=shape, checkpoints=checkpoints, shard_index=k)


def validate(cfg: RunConfig) -> None:  # its rules across sections
    require(not cfg.warmup.central_images, "warmup.central_images",
            "the federated GS-WGAN server holds no records to release; set warmup.central_images=false")


METHOD = Method(
    NAME, trainer=FederatedProcesses, mechanism=FEDERATED, pretrain="shard", pretrain_function=pretrain_shard,
    sections=("gswgan",), default_n_d=FEDERATED.n_dis, networks="gswgan.generator", federated=True, validate=validate)

__all__ = ["METHOD", "FederatedProcesses", "client_main"]
