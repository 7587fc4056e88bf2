"""Helpers of the GS-WGAN family's tests (gswgan, dpac, gswgan_federated): their tiny configuration, warm
starts of the ``shards`` fixture (tests/methods/conftest.py), and spies on what each module reads."""

from __future__ import annotations

from pathlib import Path

import torch

from dpsynth.config import load_config

MNIST = Path(__file__).resolve().parents[2] / "data" / "mnist"
K = 3  # shards of the ``shards`` fixture


def tiny(tmp_path, *extra, method="gswgan"):
    return load_config(overrides=[
        f"output.dir={tmp_path}", "tracking.enabled=false", f"train.method={method}", f"partition.num_shards={K}",
        "gswgan.d_width=4", "gswgan.g_width=4", "gswgan.latent_dim=8", "gswgan.batch_size=16", "train.n_d=2",
        "gswgan.warmstart_iterations=2", "gswgan.ema_decay=0.9", "train.steps=6", "privacy.epsilon=50",
        "privacy.delta=1e-4", "output.log_every=0", "output.sample_every=0", "output.checkpoint_every=0",
        "dpac.c_width=4", "dpac.n_f=2", "dpac.n_r=2", "dpac.start_iteration=2", *extra,
    ])


def warm_files(cfg, shards, tmp_path) -> dict[int, bytes]:
    """Shard index → the bytes of its warm-started D_k file (as the warmstart stage writes them)."""
    from dpsynth.methods.gswgan import warm_start_shard

    out = {}
    for k, shard in enumerate(shards):
        path = tmp_path / f"warm-{k}.pt"
        warm_start_shard(cfg, shard, shard_index=k, out_path=str(path))
        out[k] = path.read_bytes()
    return out


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
