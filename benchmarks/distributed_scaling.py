"""CPU benchmark: DPGAN or dp-GAN (Zhang) data-parallel, or GS-WGAN with its shards spread, on 1 vs W gloo
ranks (issue #18), steps/s and bytes all-reduced per step.

Each rank is a spawned process with ``threads`` torch threads that builds the method's trainer on the first
``records`` bundled MNIST images (the real code path: its Poisson part, per-example clipping, the sanitizer's
all-reduce with rank 0's noise, the same Adam and generator steps on every rank; DPGAN: its share of the B
fakes; dp-GAN: its units' fakes, and the clip groups and adaptive bounds that rank 0 computes from public data
— scikit-learn's digits, as configs/zhang-mnist-cpu.yaml — and broadcasts), takes ``warmup`` private steps
untimed, then times ``steps`` (generator steps included: n_D = 5, n_critic = 4). Reported per world size:
steps/s (rank 0's wall clock), the bytes one rank sends into the all-reduce per step, and the scaling
efficiency (steps/s at W) / (W · steps/s at 1).

    .venv/stage/bin/python benchmarks/run.py scaling   # the suite in benchmarks/suites.toml; arguments: measure()

What does not scale with W: DPGAN's ranks each draw all B fakes (no gradient); every rank takes the same
generator step, so the models stay equal without being sent; dp-GAN's clip bounds (rank 0 alone, every step
with adaptive clipping, the others wait for them). Only the per-example work is divided.

GS-WGAN (``method=gswgan``, K = ``shards`` contiguous shards of the records, fresh discriminators): one
iteration uses one discriminator, so nothing is divided — the rank owning the drawn shard runs the n_dis = 5
critic steps and the B per-sample gradients while the others wait, and every rank takes the generator step.
What W buys is memory: each rank holds K/W shards and discriminators (with their Adam states), reported per
rank as ``held_bytes`` after the timed steps (the discriminators drawn so far). Bytes per step: the release's
all-reduce (B × image floats) and, measured as their pickled size, the shard index and the owner's batch and
latent streams and G's buffers that the other ranks receive. Its ``undivided_share`` is the generator step's
share of rank 0's time (the critic steps are undivided too, run by one rank).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]


def _rank(rank: int, world: int, store: str, args: dict, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(args["threads"])
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        import numpy as np

        from dpsynth.config import load_config
        from dpsynth.data import import_source

        data = import_source(str(REPO / "data" / "mnist")).subset(np.arange(args["records"]))
        method = args.get("method", "dpgan")
        cfg = load_config(overrides=[
            f"output.dir={out}/w{world}", "tracking.enabled=false", f"train.method={method}",
            f"train.d_width={args['d_width']}", f"train.g_width={args['d_width']}",
            f"train.batch_size={args['batch_size']}", "train.steps=100000",
            f"train.n_d={4 if method == 'zhang' else 5}",  # n_critic = 4 (dp-GAN), n_D = 5 (DPGAN)
            "privacy.noise_multiplier=1.0", "privacy.epsilon=1000", "privacy.delta=1e-5",
            f"train.grad_sample_mode={args['mode']}", "data.public_source=sklearn:digits",
            *(["zhang.grouping=clustering", "zhang.num_groups=5", "zhang.adaptive_clipping=true"]
              if args.get("bounds", "adaptive") == "adaptive" else
              ["zhang.grouping=weight_bias", "zhang.adaptive_clipping=false"]), "zhang.public_batch_size=64"])
        if method == "gswgan":
            from dpsynth.methods.gswgan import GSWGANTrainer

            K = args["shards"]
            cfg = load_config(overrides=[
                f"output.dir={out}/w{world}", "tracking.enabled=false", "train.method=gswgan", "train.steps=100000",
                f"partition.num_shards={K}", f"gswgan.d_width={args['d_width']}", f"gswgan.g_width={args['d_width']}",
                f"gswgan.batch_size={args['batch_size']}", "train.n_d=5", "privacy.noise_multiplier=1.0",
                "privacy.epsilon=1000", "privacy.delta=1e-5"])
            cut = np.linspace(0, len(data), K + 1).astype(int)
            t = GSWGANTrainer(cfg, [data.subset(np.arange(cut[k], cut[k + 1])) for k in range(K)])
        elif method == "zhang":
            from dpsynth.data.public import load_public_source
            from dpsynth.methods.zhang import ZhangTrainer

            t = ZhangTrainer(cfg, data, public=load_public_source("sklearn:digits", shape=(28, 28, 1)))
        else:
            from dpsynth.methods.dpgan import DPGANTrainer

            t = DPGANTrainer(cfg, data)

        # the part of a step no rank divides: the generator step (every rank), dp-GAN's bounds (rank 0)
        fixed = {"seconds": 0.0}

        def timed(fn):
            def call(*a, **kw):
                begin = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    fixed["seconds"] += time.perf_counter() - begin
            return call

        if method == "gswgan":  # undivided: the whole iteration (one discriminator); the generator step is timed
            import dpsynth.methods.gswgan as gswgan

            gswgan.sanitized_generator_step = timed(gswgan.sanitized_generator_step)
        else:
            from dpsynth.methods import dpgan, zhang

            module = zhang if method == "zhang" else dpgan
            module.g_step = timed(module.g_step)
        if method == "zhang":
            t.update_bounds = timed(t.update_bounds)

        def run(k):
            for _ in range(k):
                t.train_step()

        run(args["warmup"])
        fixed["seconds"] = 0.0
        if world > 1:
            dist.barrier()
        start = time.perf_counter()
        run(args["steps"])
        seconds = time.perf_counter() - start
        extra = {}
        if method == "gswgan":
            import pickle

            def nbytes(obj):
                if isinstance(obj, torch.Tensor):
                    return obj.numel() * obj.element_size()
                if isinstance(obj, dict):
                    return sum(nbytes(v) for v in obj.values())
                if isinstance(obj, (list, tuple)):
                    return sum(nbytes(v) for v in obj)
                return 0

            held = nbytes(t.state.d_states) + nbytes(t.state.opt_states)
            Path(out, f"w{world}-rank{rank}-held.json").write_text(json.dumps(
                {"held_bytes": held, "discriminators": len(t.state.d_states), "shards_held": len(t.own)}))
            streams = (t.state.data_rng.get_state(), t.state.rng.get_state(),
                       {n: b.cpu() for n, b in t.state.G.named_buffers()})
            extra = {"broadcast_bytes_per_step": (len(pickle.dumps(streams)) + len(pickle.dumps(0))) if world > 1 else 0,
                     "shards": args["shards"]}
        if world > 1:
            dist.barrier()
        if rank == 0:
            reducer = t.sanitizer.reducer
            held = [json.loads(Path(out, f"w{world}-rank{r}-held.json").read_text())
                    for r in range(world)] if method == "gswgan" else None
            Path(out, f"w{world}.json").write_text(json.dumps({
                "world_size": world, "steps": args["steps"], "seconds": seconds,
                "steps_per_s": args["steps"] / seconds, "undivided_share": fixed["seconds"] / seconds,
                "allreduce_bytes_per_step": reducer.bytes_per_step if reducer is not None else 0,
                "d_parameters": sum(p.numel() for p in t.state.D.parameters()), **extra,
                **({"per_rank": held} if held else {})}))
    finally:
        if world > 1:
            dist.destroy_process_group()


def measure(*, method: str = "dpgan", bounds: str = "adaptive", worlds: tuple[int, ...] = (1, 2), batch_size: int = 64,
            d_width: int = 32, records: int = 6000, steps: int = 20, warmup: int = 3, threads: int = 1,
            mode: str = "ghost", shards: int = 10) -> dict:
    """Steps/s and bytes per step of ``method`` (dpgan, zhang or gswgan) on each world size of ``worlds``.
    ``bounds`` (zhang): clustered groups with adaptive bounds from public data every step (rank 0), or fixed
    weight/bias groups at privacy.max_grad_norm; ``mode``: train.grad_sample_mode; ``shards`` (gswgan): K."""
    import torch.multiprocessing as mp

    args = {"method": method, "bounds": bounds, "batch_size": batch_size, "d_width": d_width,
            "records": records, "steps": steps, "warmup": warmup, "threads": threads, "mode": mode,
            "shards": shards}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world in worlds:
            mp.spawn(_rank, args=(world, f"{tmp}/store-{world}", args, tmp), nprocs=world, join=True)
            rows.append(json.loads(Path(tmp, f"w{world}.json").read_text()))
    base = next((r["steps_per_s"] for r in rows if r["world_size"] == 1), None)
    for r in rows:
        r["efficiency"] = r["steps_per_s"] / (r["world_size"] * base) if base else None
    report = {"settings": args, "cpu_count": os.cpu_count(), "machine": platform.machine(),
              "torch": torch.__version__, "results": rows}
    for r in rows:
        eff = f"{r['efficiency']:.2f}" if r["efficiency"] is not None else "-"
        print(f"W={r['world_size']}: {r['steps_per_s']:.2f} steps/s, {r['allreduce_bytes_per_step']} B all-reduced "
              f"per step per rank, efficiency {eff}, undivided share of rank 0's time {r['undivided_share']:.2f}")
        if "per_rank" in r:
            print(f"     + {r['broadcast_bytes_per_step']} B broadcast per step; held per rank (shards, discriminators "
                  f"so far, bytes): {[(h['shards_held'], h['discriminators'], h['held_bytes']) for h in r['per_rank']]}")
    return report
