"""CPU benchmark: one DPGAN discriminator step, non-private vs. DP-SGD variants.

One step (Bie et al., Algorithm 1, lines 4-8): B real + B fake examples through D, the
non-saturating loss, per-example gradients clipped to C, summed, Gaussian noise sigma*C
added, divided by 2B, one Adam step. The same input batch is reused for every step and
every variant, so only the step itself is timed (no data sampling, no generator step).

Variants are timed round-robin (one step each per round, the starting variant rotated
every round) in one process, so background load hits all of them alike. Reported: the
median seconds per step, and the median over rounds of (variant time / non-private time
in the same round).

    python benchmarks/dp_discriminator_step.py [--batch-size 128] [--width 128]
        [--repeats 5] [--warmup 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import platform
import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import opacus
import torch
import torch.nn.functional as F
from opacus import PrivacyEngine
from opacus.grad_sample.utils import prepare_module
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpsynth.models.dcgan import Discriminator, Generator, count_parameters
from dpsynth.privacy.dpsgd import GradientSanitizer

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
    """As DPGANTrainer.discriminator_step: prepare_module + GradientSanitizer + Adam."""
    def factory(D, x, y, r):
        model = prepare_module(D, mode, loss_reduction="sum")
        opt = torch.optim.Adam(D.parameters(), lr=LR, betas=BETAS)
        sanitizer = GradientSanitizer(list(D.parameters()), max_grad_norm=C, noise_multiplier=SIGMA,
                                      expected_batch_size=len(x))

        def step():
            ns_loss(model(x, y), r).sum().backward()
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
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-size", type=int, default=128, help="B: real examples; as many fake (2B in all)")
    ap.add_argument("--width", type=int, default=128, help="discriminator width (128: the paper's 1.72M-param D)")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds (one step per variant per round)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()

    torch.set_num_threads(2)
    warnings.filterwarnings("ignore")  # Opacus warns about secure RNG, full backward hooks, ...
    started = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    x, y, r, source = make_batch(args.batch_size, gen)
    torch.manual_seed(0)
    D0 = Discriminator(num_classes=10, channels=1, image_size=28, width=args.width)

    steps, errors = {}, {}
    for name, factory in VARIANTS.items():
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

    ref = times.get("non-private (autograd + Adam)")
    rows = []
    for name in VARIANTS:
        if name in times:
            ratio = statistics.median(t / t_ref for t, t_ref in zip(times[name], ref)) if ref else None
            rows.append({"variant": name, "median_s": statistics.median(times[name]), "ratio": ratio,
                         "times_s": times[name]})
        else:
            rows.append({"variant": name, "error": errors[name]})
    wall = time.perf_counter() - started

    print(f"D: width {args.width}, {count_parameters(D0):,} params; batch {args.batch_size} real + "
          f"{args.batch_size} fake, 28x28; input: {source}")
    print(f"torch {torch.__version__}, opacus {opacus.__version__}, {torch.get_num_threads()} threads, "
          f"{args.repeats} timed rounds after {args.warmup} warm-up")
    print(f"{'variant':<36}{'median s/step':>14}{'x non-private':>15}")
    for row in rows:
        if "error" in row:
            print(f"{row['variant']:<36}{'FAILED':>14}   {row['error'][:200]}")
        else:
            ratio = f"{row['ratio']:.2f}" if row["ratio"] is not None else "n/a"
            print(f"{row['variant']:<36}{row['median_s']:>14.3f}{ratio:>15}")
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
