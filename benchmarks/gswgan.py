"""GS-WGAN / DPAC speed on CPU: pre-training iterations/s, private iterations/s, and the D_k swap cost.

    .venv/stage/bin/python benchmarks/run.py gswgan-speed   # the suite in benchmarks/suites.toml; arguments: measure()

Each round runs, interleaved in one process: ``iterations`` pre-training iterations (non-private:
n_dis critic steps + one generator step, :func:`pretrain_shard` on one shard, file write
included), then ``iterations`` private iterations (draw k, load D_k, n_dis critic steps,
store D_k, the sanitized generator step, EMA), then one D_k load + store alone. Reported: the
median seconds per iteration of each, iterations/s, and the median over rounds of
private / pre-training (the ratio is the figure to compare across machines).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from dpsynth.config import load_config
from dpsynth.data import import_source
from dpsynth.methods.dpac import DPACTrainer
from dpsynth.methods.gswgan import GSWGANTrainer, load_discriminator, store_discriminator
from dpsynth.methods.pretraining import pretrain_shard
from dpsynth.stages.partition import assign

ROOT = Path(__file__).resolve().parents[1]


def measure(*, method: str = "gswgan", width: int = 64, batch_size: int = 32, n_dis: int = 5, shards: int = 8,
            per_shard: int = 60, rounds: int = 5, warmup: int = 1, iterations: int = 2, threads: int = 2) -> dict:
    """Pre-training and private iterations/s of ``method`` (gswgan or dpac), d_width = g_width = ``width`` (paper:
    64), ``per_shard`` records per shard (paper: 60k / 1000), ``iterations`` of each kind per round."""
    args = SimpleNamespace(method=method, width=width, batch_size=batch_size, n_dis=n_dis, shards=shards,
                           per_shard=per_shard, rounds=rounds, warmup=warmup, iterations=iterations, threads=threads)
    torch.set_num_threads(args.threads)

    ds = import_source(str(ROOT / "data" / "mnist")).subset(np.arange(args.shards * args.per_shard))
    where = assign(ds.record_ids, key="bench", heldout_fraction=0.0, num_shards=args.shards)
    shards = [ds.subset(np.flatnonzero(where == k)) for k in range(args.shards)]
    out = Path(tempfile.mkdtemp(prefix="dpsynth-bench-gswgan-"))
    common = [f"output.dir={out}", "tracking.enabled=false", f"train.method={args.method}",
              f"partition.num_shards={args.shards}", f"gswgan.d_width={args.width}", f"gswgan.g_width={args.width}",
              f"gswgan.batch_size={args.batch_size}", f"train.n_d={args.n_dis}", "train.steps=1000000",
              "privacy.noise_multiplier=1.07", "privacy.accounting=as_published", "privacy.epsilon=1e9",
              "privacy.delta=1e-6", "dpac.start_iteration=0", "output.checkpoint_every=0", "output.log_every=0",
              "output.sample_every=0", "train.device=cpu"]
    cfg = load_config(overrides=common + [f"gswgan.pretrain_iterations={args.iterations}"])
    trainer = (DPACTrainer if args.method == "dpac" else GSWGANTrainer)(cfg, shards)

    warm, private, swap, ratios = [], [], [], []
    for r in range(args.warmup + args.rounds):
        t0 = time.perf_counter()
        pretrain_shard(cfg, shards[r % args.shards], shard_index=r % args.shards, out_path=str(out / "d.pt"))
        t1 = time.perf_counter()
        for _ in range(args.iterations):
            trainer.train_step()
        t2 = time.perf_counter()
        store_discriminator(trainer.state, r % args.shards,  # D_k in and out of the working discriminator
                            load_discriminator(trainer.state, r % args.shards, cfg=cfg, spec=trainer.spec))
        t3 = time.perf_counter()
        if r >= args.warmup:
            w, p = (t1 - t0) / args.iterations, (t2 - t1) / args.iterations
            warm.append(w)
            private.append(p)
            swap.append(t3 - t2)
            ratios.append(p / w)

    med = statistics.median
    report = {
        "method": args.method, "width": args.width, "batch_size": args.batch_size, "n_dis": args.n_dis,
        "shards": args.shards, "threads": args.threads, "rounds": args.rounds,
        "pretrain_seconds_per_iteration": med(warm), "pretrain_iterations_per_second": 1 / med(warm),
        "private_seconds_per_iteration": med(private), "private_iterations_per_second": 1 / med(private),
        "private_over_pretrain": med(ratios), "discriminator_swap_seconds": med(swap),
        "raw": {"warm": warm, "private": private, "swap": swap},
    }
    print(f"{args.method} width {args.width}, B {args.batch_size}, n_dis {args.n_dis}, {args.threads} threads:")
    print(f"  pre-training  {report['pretrain_iterations_per_second']:.2f} it/s  ({med(warm) * 1e3:.0f} ms/it)")
    print(f"  private     {report['private_iterations_per_second']:.2f} it/s  ({med(private) * 1e3:.0f} ms/it)"
          f"  = {med(ratios):.2f} × pre-training")
    print(f"  D_k swap    {med(swap) * 1e3:.1f} ms (load state + Adam state, store copies)")
    return report
