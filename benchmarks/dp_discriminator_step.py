"""CPU benchmark: one DPGAN discriminator step, non-private vs. DP-SGD variants.

One step (Bie et al., Algorithm 1, lines 4-8): B real + B fake examples through D, the
non-saturating loss, per-example gradients clipped to C, summed, Gaussian noise sigma*C
added, divided by 2B, one Adam step. The same input batch is reused for every step and
every variant, so only the step itself is timed (no data sampling, no generator step).

Variants are timed round-robin (one step each per round, the starting variant rotated
every round) in one process, so background load hits all of them alike. Reported: the
median seconds per step, and the median over rounds of (variant time / non-private time
in the same round).

    python benchmarks/dp_discriminator_step.py [--batch-size 128] [--width 128] [--threads 2]
        [--repeats 5] [--warmup 2] [--only SUBSTRING ...] [--memory] [--json PATH]

``--memory`` also runs each variant alone in a fresh process: after one step it resets the RSS
high-water mark, takes three more steps and reports their peak RSS and its growth over the RSS
before them (what the steps themselves allocate).
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import opacus
import torch
import torch.nn.functional as F
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpsynth.methods.zhang import per_unit_gradients, unit_losses, wgan_gp_loss
from dpsynth.models.dcgan import Discriminator, Generator, count_parameters
from dpsynth.privacy import grouping
from dpsynth.privacy.dpsgd import GradientSanitizer, private_module
from dpsynth.privacy.ghost import GhostClipping

MNIST = Path(__file__).resolve().parents[1] / "data" / "mnist"
C, SIGMA, LR, BETAS = 1.0, 1.0, 2e-4, (0.5, 0.999)  # values do not affect speed


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzip): big-endian header of dims, then uint8 data."""
    raw = gzip.decompress(path.read_bytes())
    ndim = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def make_batch(B: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
    """B real records (MNIST t10k, or random if absent) then B samples of an untrained G."""
    images, labels = MNIST / "t10k-images-idx3-ubyte.gz", MNIST / "t10k-labels-idx1-ubyte.gz"
    if images.exists() and labels.exists():
        real_x = torch.from_numpy(read_idx(images)[:B].copy()).float().div(127.5).sub(1).unsqueeze(1)
        real_y = torch.from_numpy(read_idx(labels)[:B].copy()).long()
        source = "MNIST t10k (first B images) + untrained-G samples"
    else:
        real_x = torch.rand(B, 1, 28, 28, generator=gen) * 2 - 1
        real_y = torch.randint(0, 10, (B,), generator=gen)
        source = "random tensors + untrained-G samples"
    with torch.no_grad():
        fake_x, fake_y = Generator(num_classes=10).sample(B, generator=gen)
    is_real = torch.cat([torch.ones(B), torch.zeros(B)])
    return torch.cat([real_x, fake_x]), torch.cat([real_y, fake_y]), is_real, source


def ns_loss(logits: torch.Tensor, is_real: torch.Tensor) -> torch.Tensor:
    """Per-example non-saturating loss: -log D(x) for real, -log(1 - D(x)) for fake."""
    return F.softplus(torch.where(is_real.bool(), -logits, logits))


# --- variants: each factory takes a fresh copy of D and returns a zero-argument step() ----

def nonprivate(D, x, y, r):
    opt = torch.optim.Adam(D.parameters(), lr=LR, betas=BETAS)

    def step():
        opt.zero_grad(set_to_none=True)
        ns_loss(D(x, y), r).mean().backward()
        opt.step()
    return step


def opacus_engine(mode: str):
    """PrivacyEngine.make_private: GradSampleModule + DPOptimizer (+ DPLoss for ghost)."""
    def factory(D, x, y, r):
        opt = torch.optim.Adam(D.parameters(), lr=LR, betas=BETAS)
        loader = DataLoader(TensorDataset(x, y, r), batch_size=len(x))  # only sets expected batch size 2B
        out = PrivacyEngine(accountant="rdp").make_private(
            module=D, optimizer=opt, data_loader=loader, noise_multiplier=SIGMA, max_grad_norm=C,
            poisson_sampling=False, grad_sample_mode=mode, criterion=nn.BCEWithLogitsLoss())
        model, dp_opt = out[0], out[1]
        # BCE-with-logits against is_real is exactly the non-saturating loss above.
        criterion = out[2] if mode == "ghost" else F.binary_cross_entropy_with_logits

        def step():
            dp_opt.zero_grad(set_to_none=True)
            criterion(model(x, y), r).backward()
            dp_opt.step()
        return step
    return factory


def ours(mode: str):
    """As DPGANTrainer.discriminator_step: private_module + GradientSanitizer + Adam."""
    def factory(D, x, y, r):
        model = private_module(D, mode)
        opt = torch.optim.Adam(D.parameters(), lr=LR, betas=BETAS)
        sanitizer = GradientSanitizer(list(D.parameters()), max_grad_norm=C, noise_multiplier=SIGMA,
                                      expected_batch_size=len(x), module=model)

        def step():
            sanitizer.accumulate(ns_loss(model(x, y), r))
            sanitizer.finalize()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step
    return factory


def zhang_units(x, y, r):
    """dp-GAN's units: the B real records, each with one fake (the other half of the batch) and ρ."""
    real, fake = x[r.bool()], x[~r.bool()]
    rho = torch.rand(len(real), generator=torch.Generator().manual_seed(1)).view(-1, 1, 1, 1)
    return real, fake, y[r.bool()], rho


def zhang_nonprivate(D, x, y, r):
    """The critic's WGAN-GP step without privacy (as the warm start): batch loss, backward, Adam."""
    opt = torch.optim.Adam(D.parameters(), lr=LR, betas=BETAS)
    real, fake, yy, rho = zhang_units(x, y, r)

    def step():
        opt.zero_grad(set_to_none=True)
        wgan_gp_loss(D, real, fake, yy, rho, gp_weight=10.0).backward()
        opt.step()
    return step


def zhang_private(mode: str):
    """As ZhangTrainer.critic_step: per-unit gradients (penalty included; torch.func, or ghost clipping),
    the 5 per-layer groups, Adam."""
    def factory(D, x, y, r):
        opt = torch.optim.Adam(D.parameters(), lr=LR, betas=BETAS)
        real, fake, yy, rho = zhang_units(x, y, r)
        params = dict(D.named_parameters())
        groups = grouping.fixed_groups(list(params), strategy="per_layer")
        model = GhostClipping(D, second_order=True) if mode == "ghost" else None
        sanitizer = GradientSanitizer([[params[n] for n in g] for g in groups], max_grad_norm=[C] * len(groups),
                                      noise_multiplier=SIGMA, expected_batch_size=len(real), module=model)

        def step():
            if model is not None:
                sanitizer.accumulate(unit_losses(model, real, fake, yy, rho, gp_weight=10.0))
            else:
                for name, g in per_unit_gradients(D, real, fake, yy, rho, gp_weight=10.0).items():
                    params[name].grad_sample = g
                sanitizer.accumulate()
            sanitizer.finalize()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step
    return factory


VARIANTS = {
    "non-private (autograd + Adam)": nonprivate,
    "opacus make_private, hooks": opacus_engine("hooks"),
    "opacus make_private, ew": opacus_engine("ew"),
    "opacus make_private, ghost": opacus_engine("ghost"),
    "dpsynth GradientSanitizer, hooks": ours("hooks"),
    "dpsynth GradientSanitizer, ew": ours("ew"),
    "dpsynth GradientSanitizer, ghost": ours("ghost"),
    "dpsynth GradientSanitizer, ghost_two_pass": ours("ghost_two_pass"),
    "zhang critic + GP, non-private": zhang_nonprivate,
    "zhang critic + GP, per-layer groups, torch.func": zhang_private("func"),
    "zhang critic + GP, per-layer groups, ghost": zhang_private("ghost"),
}
REFERENCE = {name: "zhang critic + GP, non-private" for name in VARIANTS if name.startswith("zhang critic + GP, per")}  # else the DPGAN step
DEFAULT_REF = "non-private (autograd + Adam)"


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def memory_child(name: str, args) -> None:
    """Build one variant, take one step (first-call allocations), reset the RSS high-water mark
    (``/proc/self/clear_refs``), take 3 more; print JSON: RSS before them and their peak RSS."""
    gen = torch.Generator().manual_seed(0)
    x, y, r, _ = make_batch(args.batch_size, gen)
    torch.manual_seed(0)
    step = VARIANTS[name](Discriminator(num_classes=10, channels=1, image_size=28, width=args.width), x, y, r)
    step()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_kb("VmRSS")
    for _ in range(3):
        step()
    print(json.dumps({"before_kb": before, "peak_kb": _status_kb("VmHWM")}))


def memory(names, args) -> dict:
    out = {}
    for name in names:
        cmd = [sys.executable, __file__, "--memory-child", name, "--batch-size", str(args.batch_size),
               "--width", str(args.width), "--threads", str(args.threads)]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            out[name] = json.loads(res.stdout.strip().splitlines()[-1])
        except (subprocess.CalledProcessError, ValueError) as e:
            out[name] = {"error": str(getattr(e, "stderr", e))[-300:]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-size", type=int, default=128, help="B: real examples; as many fake (2B in all)")
    ap.add_argument("--width", type=int, default=128, help="discriminator width (128: the paper's 1.72M-param D)")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds (one step per variant per round)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--only", nargs="+", metavar="SUBSTRING",
                    help="run only the variants whose names contain one of these (the references always run)")
    ap.add_argument("--memory", action="store_true", help="also measure each variant's peak RSS in its own process")
    ap.add_argument("--memory-child", help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    if args.memory_child:
        warnings.filterwarnings("ignore")
        return memory_child(args.memory_child, args)
    chosen = [n for n in VARIANTS if not args.only or n in REFERENCE.values() or n == DEFAULT_REF
              or any(s in n for s in args.only)]
    warnings.filterwarnings("ignore")  # Opacus warns about secure RNG, full backward hooks, ...
    started = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    x, y, r, source = make_batch(args.batch_size, gen)
    torch.manual_seed(0)
    D0 = Discriminator(num_classes=10, channels=1, image_size=28, width=args.width)

    steps, errors = {}, {}
    for name in chosen:
        factory = VARIANTS[name]
        try:
            steps[name] = factory(copy.deepcopy(D0), x, y, r)
        except Exception as e:  # a variant that cannot run with this model is reported, not fatal
            errors[name] = f"{type(e).__name__}: {e}"
    times = {name: [] for name in steps}
    for rnd in range(args.warmup + args.repeats):
        names = list(steps)
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:
            t0 = time.perf_counter()
            try:
                steps[name]()
            except Exception as e:
                errors[name] = f"{type(e).__name__}: {e}"
                del steps[name], times[name]
                continue
            if rnd >= args.warmup:
                times[name].append(time.perf_counter() - t0)

    mem = memory(chosen, args) if args.memory else {}
    rows = []
    for name in chosen:
        ref = times.get(REFERENCE.get(name, DEFAULT_REF))
        if name in times:
            ratio = statistics.median(t / t_ref for t, t_ref in zip(times[name], ref)) if ref else None
            rows.append({"variant": name, "median_s": statistics.median(times[name]), "ratio": ratio,
                         "times_s": times[name]})
        else:
            rows.append({"variant": name, "error": errors[name]})
        if name in mem:
            rows[-1]["memory"] = mem[name]
    wall = time.perf_counter() - started

    print(f"D: width {args.width}, {count_parameters(D0):,} params; batch {args.batch_size} real + "
          f"{args.batch_size} fake, 28x28; input: {source}")
    print(f"torch {torch.__version__}, opacus {opacus.__version__}, {torch.get_num_threads()} threads, "
          f"{args.repeats} timed rounds after {args.warmup} warm-up")
    print(f"{'variant':<44}{'median s/step':>14}{'x non-private':>15}" + (f"{'peak RSS MB':>13}{'step +MB':>10}" if mem else ""))
    for row in rows:
        if "error" in row:
            print(f"{row['variant']:<44}{'FAILED':>14}   {row['error'][:200]}")
            continue
        ratio = f"{row['ratio']:.2f}" if row["ratio"] is not None else "n/a"
        m = row.get("memory", {})
        extra = (f"{m['peak_kb'] / 1024:>13.0f}{(m['peak_kb'] - m['before_kb']) / 1024:>10.0f}" if "peak_kb" in m
                 else f"{'n/a':>13}" if mem else "")
        print(f"{row['variant']:<44}{row['median_s']:>14.3f}{ratio:>15}{extra}")
    print("zhang rows: ratio to the zhang non-private critic step (WGAN-GP); others: to the DPGAN non-private step")
    print(f"wall time {wall:.1f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "batch_size": args.batch_size, "width": args.width, "params": count_parameters(D0),
            "repeats": args.repeats, "warmup": args.warmup, "input": source, "threads": torch.get_num_threads(),
            "torch": torch.__version__, "opacus": opacus.__version__, "machine": platform.processor() or platform.machine(),
            "ratio": "median over rounds of (variant s / non-private s in the same round)",
            "results": rows, "wall_s": wall}, indent=2))


if __name__ == "__main__":
    main()
