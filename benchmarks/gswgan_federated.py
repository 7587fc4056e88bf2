"""Federated GS-WGAN on CPU: bytes moved per generator iteration and iterations/s, processes vs in-process.

    .venv/stage/bin/python benchmarks/run.py scaling gswgan-federated   # suites.toml; arguments: measure()

Runs the same configuration twice on real MNIST records: once as the K + 1 ranks of a torchrun job
over torch.distributed/gloo (``python -m torch.distributed.run --standalone --nproc-per-node K+1`` running
this script's ``rank`` mode: rank 0 :class:`dpsynth.methods.federated_processes.FederatedProcesses`, the server, given n only;
rank k + 1 :func:`dpsynth.methods.federated_processes.client_main` with shard k — what ``train.method=gswgan_federated`` runs)
and once in one process (:class:`FederatedGSWGANTrainer`, the reference). Reported per
transport: the bytes per generator iteration server → clients and back as counted by the transport
(element_size × numel of every tensor sent, control messages included; the in-process reference
reports the protocol's analytic count), the trainer's own seconds (training loop + writing the
outputs) and iterations/s from them, and for the processes also the wall time including process
start-up. For scale it also prints what one exchange of the discriminator's weights would move
(both directions), i.e. what a weight-averaging scheme would send per round instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from dpsynth.config import load_config
from dpsynth.data import import_source
from dpsynth.distributed import federation
from dpsynth.methods import federated_processes
from dpsynth.methods.gswgan_federated import FederatedGSWGANTrainer, message_bytes
from dpsynth.models.gswgan_networks import Discriminator, Generator, count_parameters
from dpsynth.stages.partition import assign

ROOT = Path(__file__).resolve().parents[1]


def measure(*, clients: int = 2, width: int = 64, batch_size: int = 32, n_dis: int = 5, per_client: int = 60,
            steps: int = 40, threads: int = 1, rank: str | None = None) -> dict | int:
    """Bytes per generator iteration and iterations/s of ``clients`` clients as torchrun ranks and in one process;
    d_width = g_width = ``width`` (paper: 64), ``per_client`` records each (paper: 60k / 1000), ``threads`` in the
    in-process run (clients use 1). ``rank``: the output folder of the torchrun job this call starts (its ranks
    call this function again, through ``benchmarks/run.py --call``)."""
    args = SimpleNamespace(clients=clients, width=width, batch_size=batch_size, n_dis=n_dis, per_client=per_client,
                           steps=steps, threads=threads, rank=rank)
    torch.set_num_threads(1 if args.rank else args.threads)

    def shards():
        ds = import_source(str(ROOT / "data" / "mnist")).subset(np.arange(args.clients * args.per_client))
        where = assign(ds.record_ids, key="bench", heldout_fraction=0.0, num_shards=args.clients)
        return [ds.subset(np.flatnonzero(where == k)) for k in range(args.clients)]

    out = Path(args.rank or tempfile.mkdtemp(prefix="dpsynth-bench-gswgan-federated-"))

    def cfg(name: str):
        return load_config(overrides=[
            f"output.dir={out / name}", "tracking.enabled=false", "train.method=gswgan_federated",
            f"partition.num_shards={args.clients}", f"gswgan.d_width={args.width}", f"gswgan.g_width={args.width}",
            f"gswgan.batch_size={args.batch_size}", f"train.n_d={args.n_dis}", f"train.steps={args.steps}",
            "privacy.noise_multiplier=1.07", "privacy.epsilon=1e6", "privacy.delta=1e-5", "output.log_every=0",
            "output.sample_every=0", "output.checkpoint_every=0"])

    if args.rank:  # rank 0 the server (given n only), rank k + 1 client k (its own shard)
        ranks = federation.launch(cfg("processes"))
        if ranks.is_main:
            result = federated_processes.FederatedProcesses(cfg("processes"), args.clients * args.per_client).train()
            (out / "processes.json").write_text(json.dumps(vars(result)))
        else:
            federated_processes.client_main(cfg("processes"), shards()[ranks.rank - 1], warm=None, checkpoints=None)
        federation.distributed.shutdown(barrier=True)
        return 0

    started = time.monotonic()
    child = {k: v for k, v in vars(args).items() if k != "rank"} | {"rank": str(out)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               str(args.clients + 1), str(Path(__file__).with_name("run.py")), "--call", "gswgan_federated:measure",
               json.dumps(child)]
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.monotonic() - started
    processes = json.loads((out / "processes.json").read_text())
    reference = FederatedGSWGANTrainer(cfg("in_process"), shards()).train()

    spec = {"num_classes": 10, "channels": 1, "image_size": 28}
    rows = {"torchrun ranks (gloo)": processes, "in-process": vars(reference)}
    d_params = count_parameters(Discriminator(num_classes=10, width=args.width))
    g_params = count_parameters(Generator(num_classes=10, width=args.width, latent_dim=cfg("x").gswgan.latent_dim))
    report = {"args": vars(args), "analytic": message_bytes(cfg("x"), spec), "process_wall_seconds": wall,
              "d_parameters": d_params, "g_parameters": g_params, "runs": {}}
    print(f"K = {args.clients} clients, width {args.width}, B = {args.batch_size}, n_dis = {args.n_dis}, "
          f"{args.steps} iterations, torch {torch.__version__}")
    print(f"{'transport':<22}{'→ clients B/it':>16}{'← clients B/it':>16}{'total B/it':>12}"
          f"{'seconds':>10}{'it/s':>8}")
    for name, r in rows.items():
        r = {**r, **r["details"]}  # the transport's counts are in the result's details
        its = r["steps"] / r["seconds"]
        report["runs"][name] = {k: r[k] for k in ("steps", "seconds", "bytes_per_iteration_to_clients",
                                                  "bytes_per_iteration_from_clients", "bytes_per_iteration")}
        report["runs"][name]["iterations_per_second"] = its
        print(f"{name:<22}{r['bytes_per_iteration_to_clients']:>16,}{r['bytes_per_iteration_from_clients']:>16,}"
              f"{r['bytes_per_iteration']:>12,}{r['seconds']:>10.2f}{its:>8.2f}")
    print(f"torchrun job wall time incl. start-up: {wall:.2f} s")
    print(f"for scale: D has {d_params:,} parameters; one exchange of D's weights both ways = "
          f"{2 * 4 * d_params:,} bytes")
    return report
