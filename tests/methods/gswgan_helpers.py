"""Helpers of the GS-WGAN family's tests (gswgan, dpac, gswgan_federated): their tiny configuration, warm
starts of the ``shards`` fixture (tests/methods/conftest.py), and spies on what each module reads."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from dpsynth.methods.registry import load_config  # the configuration with its method's rules

MNIST = Path(__file__).resolve().parents[2] / "data" / "mnist"
K = 3  # shards of the ``shards`` fixture


def tiny(tmp_path, *extra, method="gswgan"):
    return load_config(overrides=[
        f"output.dir={tmp_path}", "tracking.enabled=false", f"train.method={method}", f"partition.num_shards={K}",
        "gswgan.d_width=4", "gswgan.g_width=4", "gswgan.latent_dim=8", "gswgan.batch_size=16", "train.n_d=2",
        "gswgan.pretrain_iterations=2", "gswgan.ema_decay=0.9", "train.steps=6", "privacy.epsilon=50",
        "privacy.delta=1e-4", "output.log_every=0", "output.sample_every=0", "output.checkpoint_every=0",
        "dpac.c_width=4", "dpac.n_f=2", "dpac.n_r=2", "dpac.start_iteration=2", *extra,
    ])


def warm_files(cfg, shards, tmp_path) -> dict[int, bytes]:
    """Shard index → the bytes of its pre-trained D_k file (as the pretrain stage writes them)."""
    from dpsynth.methods.pretraining import pretrain_shard

    out = {}
    for k, shard in enumerate(shards):
        path = tmp_path / f"warm-{k}.pt"
        pretrain_shard(cfg, shard, shard_index=k, out_path=str(path))
        out[k] = path.read_bytes()
    return out


@contextlib.contextmanager
def shards_drawn():
    """The shard k of every critic step run in this process (by the rank holding k), in order."""
    from dpsynth.methods import gswgan

    drawn, critic_step = [], gswgan.critic_step
    gswgan.critic_step = lambda state, k, *args, **kwargs: (drawn.append(k), critic_step(state, k, *args, **kwargs))[1]
    try:
        yield drawn
    finally:
        gswgan.critic_step = critic_step


def record_owner(shards) -> dict[bytes, int]:
    """Image bytes → the index of the shard holding that record."""
    return {row.numpy().tobytes(): k for k, s in enumerate(shards) for row in s.to_tensors()[0]}


def watch_inputs(module_types):
    """Record the first input of every forward of the given module types (a global pre-hook)."""
    seen = []

    def hook(module, args):
        if isinstance(module, module_types):
            seen.append((type(module).__name__, args[0].detach().clone()))

    return seen, torch.nn.modules.module.register_module_forward_pre_hook(hook)


def run_federated(cfg, shards, *, warm: dict[int, bytes] | None = None, stop_after: int | None = None,
                  mechanism_seed: int | None = None, **server_kwargs):
    """The federated GS-WGAN's K + 1 ranks, started here as one gloo job (a file store; what torchrun does for
    ``dpsynth train --run-dir``): rank 0 the server, :class:`dpsynth.methods.federated_processes.FederatedProcesses` given n only,
    rank k + 1 client k (:func:`dpsynth.methods.federated_processes.client_main` with shard k and D_k). Returns the server's
    result (None when stopped part-way). ``mechanism_seed``: the master seed of
    :func:`~dpsynth.methods.gswgan_federated.mechanism_seeds` (None: every rank draws its own from OS entropy).
    (The harness hands every rank the same arguments; what the stage gives each rank is checked in
    test_gswgan_federated.py.)"""
    import pickle
    import tempfile

    from tests.methods.distributed_workers import run_ranks

    with tempfile.TemporaryDirectory(prefix="federated-") as tmp:
        out = Path(tmp) / "result.pickle"
        run_ranks(len(shards) + 1, Path(tmp), _federated_rank, cfg, shards, warm or {}, stop_after, mechanism_seed,
                  server_kwargs, str(out))
        return pickle.loads(out.read_bytes())


def _federated_rank(rank, cfg, shards, warm, stop_after, mechanism_seed, server_kwargs, out):
    import pickle

    from dpsynth.distributed.federation import CLIENT_CHECKPOINTS
    from dpsynth.methods.federated_processes import FederatedProcesses, client_main
    from dpsynth.methods.gswgan_federated import mechanism_seeds

    choice, noise = mechanism_seeds(mechanism_seed, len(shards)) if mechanism_seed is not None else (None, None)
    if rank == 0:
        n = sum(len(s) for s in shards)
        result = FederatedProcesses(cfg, n, mechanism_seed=choice, **server_kwargs).train(stop_after=stop_after)
        Path(out).write_bytes(pickle.dumps(result))
    else:
        k = rank - 1
        client_main(cfg, shards[k], warm=warm.get(k), mechanism_seed=None if noise is None else noise[k],
                    checkpoints=Path(cfg.output.dir) / "checkpoints" / CLIENT_CHECKPOINTS)


def stage_rank_reads(rank, run_dir, overrides, out):
    """Rank ``rank`` of a federated train stage job (rank 0: :func:`dpsynth.stages.train.run`, the others
    :func:`~dpsynth.stages.train.follow`, as ``torchrun -m dpsynth train --run-dir`` runs them), recording every
    file the process opens (Python's ``open`` audit events) and every dataset it reads (``read_parquet``, whose
    reader opens files natively) into ``out/rank<rank>.json``."""
    import json
    import sys

    import dpsynth.data
    import dpsynth.data.dataset
    from dpsynth.stages import train as train_stage
    from dpsynth.stages.protocol import StageContext

    opened = []

    def hook(event, args):
        if event == "open" and isinstance(args[0], (str, Path)):
            opened.append(str(Path(args[0]).resolve()))

    sys.addaudithook(hook)
    real = dpsynth.data.dataset.read_parquet

    def read_parquet(uri):
        opened.append(str(Path(uri).resolve()))
        return real(uri)

    for module in (dpsynth.data, dpsynth.data.dataset, train_stage):
        module.read_parquet = read_parquet
    ctx = StageContext.create(load_config(overrides=list(overrides)), run_dir=str(run_dir), pipeline_run_id="reads")
    if rank == 0:
        train_stage.run(ctx)
    else:
        train_stage.follow(ctx)
    Path(out, f"rank{rank}.json").write_text(json.dumps(opened))
