"""Pre-training fan-out: wall time of `dpsynth pretrain` (GS-WGAN, K shards) with 1 and with N local
worker processes, on the bundled MNIST, in one process (the ratio is what to read).

    .venv/stage/bin/python benchmarks/run.py pretrain-fanout   # the suite in benchmarks/suites.toml; arguments: measure()

Each configuration pre-trains every shard from scratch in a fresh run directory (partition once,
copied); the fan-in is timed end to end: process start-up, data loading and training. With one
worker the shards run one after another on all cores; with N workers each process gets
cpu_count // N torch threads. The discriminator files of both runs are compared byte for byte.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]


def measure(*, shards: int = 4, iterations: int = 20, workers: int = 2, width: int = 32) -> dict:
    """The pre-training stage of ``shards`` shards × ``iterations`` iterations (gswgan.d_width = g_width = ``width``)
    on 1 worker and on ``workers``."""
    args = SimpleNamespace(shards=shards, iterations=iterations, workers=workers, width=width)

    from dpsynth.config import load_config
    from dpsynth.data import import_source, write_parquet
    from dpsynth.stages import partition, pretrain
    from dpsynth.stages.protocol import StageContext

    with tempfile.TemporaryDirectory(prefix="dpsynth-bench-") as tmp:
        source = Path(tmp) / "mnist.parquet"
        write_parquet(import_source(REPO / "data" / "mnist"), source)
        base = [f"data.uri={source}", "train.method=gswgan", f"partition.num_shards={args.shards}",
                f"gswgan.pretrain_iterations={args.iterations}", f"gswgan.d_width={args.width}",
                f"gswgan.g_width={args.width}", "tracking.enabled=false", "train.device=cpu",
                "data.num_classes=10", "partition.key=dpsynth-partition-v1"]  # MNIST's classes, the demo's public key
        first = Path(tmp) / "run-partitioned"
        partition.run(StageContext.create(load_config(overrides=base), run_dir=str(first)))
        results = {}
        for workers in (1, args.workers):
            run_dir = Path(tmp) / f"run-{workers}"
            shutil.copytree(first, run_dir)
            cfg = load_config(overrides=[*base, f"pretrain.workers={workers}"])
            started = time.perf_counter()
            outcome = pretrain.run(StageContext.create(cfg, run_dir=str(run_dir)))
            seconds = time.perf_counter() - started
            files = {o["shard"]: o["sha256"] for o in outcome.manifest["outputs"]}
            results[workers] = {"seconds": seconds, "files": files,
                                "shard_seconds_total": outcome.manifest["details"]["shard_seconds_total"]}
            print(f"workers={workers}: {seconds:.1f} s for {args.shards} shards × {args.iterations} iterations "
                  f"({args.shards * args.iterations / seconds:.2f} pre-training iterations/s)", file=sys.stderr)
    one, many = results[1], results[args.workers]
    report = {"shards": args.shards, "iterations": args.iterations, "width": args.width, "cpu_count": os.cpu_count(),
              "seconds": {str(w): r["seconds"] for w, r in results.items()},
              "iterations_per_second": {str(w): args.shards * args.iterations / r["seconds"] for w, r in results.items()},
              "speedup": one["seconds"] / many["seconds"],
              "identical_discriminators": one["files"] == many["files"]}
    print(json.dumps(report, indent=2))
    return report
