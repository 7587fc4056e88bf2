"""CPU benchmark: the per-layer choice of ghost clipping, measured against what it predicts.

For every weight of a discriminator step (DPGAN's D on B real + B fake, or dp-GAN's critic with its
gradient penalty on B units), the per-example weight-gradient norms can be had three ways
(``dpsynth.mechanisms.ghost``):

* ``ghost``: the Gram matrices ⟨A Aᵀ, G Gᵀ⟩, then, for the clipped sum, the layer's weight-gradient
  kernel on the rescaled output gradients (``wgrad``);
* ``instantiate``: each example's d × p gradient, built and dropped chunk by chunk, then ``wgrad``;
* ``keep``: the per-example gradients built once and kept, the clipped sum a matrix-vector product
  (``mv``) — allowed by :func:`~dpsynth.mechanisms.ghost.keep_instantiated` only when they take no more memory
  than the layer's stored inputs and output gradients.

The script records one step's layer calls (forward, then the engine's one backward pass for the output
gradients), then times each way on the same records: CPU seconds (``time.process_time``), the minimum over
``repeats``. It prints the engine's choice (the cost model of Bu et al. plus the keep rule) beside the
measured cheapest way, and each way's total for the layer (norm + clipped sum).

    .venv/stage/bin/python benchmarks/run.py ghost-layer-costs   # the suite in benchmarks/suites.toml; arguments: measure()
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch
import torch.nn.functional as F

from dpsynth.methods.wgan_gp import unit_losses
from dpsynth.models.dcgan import Discriminator
from dpsynth.mechanisms import ghost

WAYS = ("ghost", "instantiate", "keep")


def cpu_seconds(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        c0 = time.process_time()
        fn()
        best = min(best, time.process_time() - c0)
    return best


def forced(way: str):
    """Patch the engine's choice so that ``_weight_sq_norms`` takes ``way``."""
    return mock.patch.multiple(ghost, use_ghost_norm=lambda T, p, d: way == "ghost",
                               keep_instantiated=lambda n, p, d, stored: way == "keep")


def records(args):
    """The wrapped D and its recorded layer calls with their output gradients, for one batch."""
    gen = torch.Generator().manual_seed(0)
    D = Discriminator(num_classes=10, width=args.width)
    B = args.batch_size
    y = torch.randint(0, 10, (B,), generator=gen)
    if args.critic == "dpgan":
        model = ghost.GhostClipping(D)
        x = torch.rand(2 * B, 1, 28, 28, generator=gen) * 2 - 1
        losses = F.softplus(model(x, torch.cat([y, y])))
    else:
        model = ghost.GhostClipping(D, second_order=True)
        real, fake = (torch.rand(B, 1, 28, 28, generator=gen) * 2 - 1 for _ in range(2))
        losses = unit_losses(model, real, fake, y, torch.rand(B, generator=gen), gp_weight=10.0)
    n = model._output_grads(losses, keep_graph=False)
    return model, n


def measure(*, width: int = 32, batch_size: int = 128, critic: str = "dpgan", threads: int = 1,
            repeats: int = 5) -> dict:
    """Per layer of the ``critic``'s D (dpgan: B real + B fake examples; zhang: B units), CPU seconds of each way
    to the per-example norms and the weight gradient (min of ``repeats``), the engine's choice and the fastest."""
    args = SimpleNamespace(width=width, batch_size=batch_size, critic=critic, threads=threads, repeats=repeats)
    torch.set_num_threads(args.threads)

    model, n = records(args)
    rows = []
    for layer, recs in model._by_layer().items():
        if not isinstance(layer, (torch.nn.Linear, torch.nn.Conv2d, torch.nn.ConvTranspose2d)):
            continue
        dims = [ghost._dims(layer, r) for r in recs]
        T, p, d = sum(t for t, _, _ in dims), dims[0][1], dims[0][2]
        stored = sum(r.input.numel() + r.grad.numel() for r in recs)
        keep = ghost.keep_instantiated(n, p, d, stored)
        chosen = "keep" if keep else "ghost" if ghost.use_ghost_norm(T, p, d) else "instantiate"
        c = torch.rand(n)
        norm_s = {}
        for way in WAYS:
            with forced(way):
                norm_s[way] = cpu_seconds(lambda: ghost._weight_sq_norms(layer, recs, n), args.repeats)
        with forced("keep"):
            _, kept = ghost._weight_sq_norms(layer, recs, n)
        mv_s = cpu_seconds(lambda: ghost._to_weight(layer, torch.mv(kept.T, c)), args.repeats)
        wgrad_s = cpu_seconds(lambda: [ghost._weight_grad(layer, r, ghost._scale(r.grad, c)) for r in recs], args.repeats)
        total = {"ghost": norm_s["ghost"] + wgrad_s, "instantiate": norm_s["instantiate"] + wgrad_s,
                 "keep": norm_s["keep"] + mv_s}
        rows.append({"layer": repr(layer), "calls": len(recs), "T": T, "p": p, "d": d,
                     "kept_MB": n * p * d * 4 / 2**20, "stored_MB": stored * 4 / 2**20, "chosen": chosen,
                     "fastest": min(total, key=total.get), "norm_s": norm_s, "wgrad_s": wgrad_s, "mv_s": mv_s,
                     "total_s": total})

    print(f"{args.critic} D width {args.width}, n = {n} per-example losses, {args.threads} thread(s), "
          f"CPU s (min of {args.repeats}); load average {__import__('os').getloadavg()[0]:.1f}")
    print(f"{'layer':<44}{'T':>5}{'p':>6}{'d':>5}{'keep MB':>9}{'stored':>8}  "
          + "".join(f"{w + ' (norm+sum)':>24}" for w in WAYS) + f"{'chosen':>13}{'fastest':>13}")
    for row in rows:
        cells = "".join(f"{row['total_s'][w] * 1e3:>9.1f} ({row['norm_s'][w] * 1e3:.1f}+"
                        f"{(row['mv_s'] if w == 'keep' else row['wgrad_s']) * 1e3:.1f})".rjust(24) for w in WAYS)
        print(f"{row['layer'][:43]:<44}{row['T']:>5}{row['p']:>6}{row['d']:>5}{row['kept_MB']:>9.1f}"
              f"{row['stored_MB']:>8.1f}  {cells}{row['chosen']:>13}{row['fastest']:>13}")
    print("ms; a 'keep' the engine did not choose would take 'keep MB' instead of the 'stored' MB it replaces")
    return {"n": n, "rows": rows}
