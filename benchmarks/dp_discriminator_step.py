"""CPU benchmark: one DPGAN discriminator step, non-private vs. DP-SGD variants.

One step (Bie et al., Algorithm 1, lines 4-8): B real + B fake examples through D, the
non-saturating loss, per-example gradients clipped to C, summed, Gaussian noise sigma*C
added, divided by 2B, one Adam step. The same input batch is reused for every step and
every variant, so only the step itself is timed (no data sampling, no generator step).

Variants are timed round-robin (one step each per round, the starting variant rotated
every round) in one process, so background load hits all of them alike. Each step's wall time
(``time.perf_counter``) and the process's CPU time (``time.process_time``, all threads: less
disturbed by other processes taking the cores) are recorded. Reported: the median seconds per
step, and the median over rounds of (variant time / reference time in the same round), with the
quartiles of those per-round ratios as their spread.

    .venv/stage/bin/python benchmarks/run.py speed   # the suite in benchmarks/suites.toml; arguments: measure()

``memory`` also runs each variant alone in a fresh process: after one step (first-call
allocations, optimizer state) it measures (1) the step's own allocation peak: the running sum of
torch's CPU allocations and frees during one step, recorded by ``torch.profiler`` with
``profile_memory=True`` (the tensors the step creates, temporaries included; not the model, the
batch or the optimizer state that exist before it); (2) the process's peak RSS over three more
steps after resetting the high-water mark (``/proc/self/clear_refs``), and its growth over the
RSS before them. ``profile`` prints each variant's top operators (torch.profiler, one step).
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import opacus
import torch
import torch.nn.functional as F
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpsynth.methods.wgan_gp import per_unit_gradients, unit_losses, wgan_gp_loss
from dpsynth.models.dcgan import Discriminator, Generator, count_parameters
from dpsynth.mechanisms import grouping
from dpsynth.mechanisms.dpsgd import GradientSanitizer, private_module
from dpsynth.mechanisms.ghost import GhostClipping

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
    """As methods/dpgan.d_step: private_module + GradientSanitizer + Adam."""
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
    rho = torch.rand(len(real), generator=torch.Generator().manual_seed(1)).view(-1, 1, 1, 1).to(x.device)
    return real, fake, y[r.bool()], rho


def zhang_nonprivate(D, x, y, r):
    """The critic's WGAN-GP step without privacy (as the pre-training): batch loss, backward, Adam."""
    opt = torch.optim.Adam(D.parameters(), lr=LR, betas=BETAS)
    real, fake, yy, rho = zhang_units(x, y, r)

    def step():
        opt.zero_grad(set_to_none=True)
        wgan_gp_loss(D, real, fake, yy, rho, gp_weight=10.0).backward()
        opt.step()
    return step


def zhang_private(mode: str):
    """As methods/zhang.d_step: per-unit gradients (penalty included; torch.func, or ghost clipping),
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


def add_baseline(rev: str) -> None:
    """Add the ghost variants with ``dpsynth/mechanisms/ghost.py`` as it was at git revision ``rev`` (before/after in
    one process). That engine's sums go to the sanitizer's running sums directly (its class is not the one
    ``GradientSanitizer.accumulate`` recognises); noise, division and Adam are as in the other variants."""
    import importlib.util
    import tempfile

    root = Path(__file__).resolve().parents[1]
    text = subprocess.run(["git", "show", f"{rev}:components/dpsynth/mechanisms/ghost.py"], cwd=root, check=True,
                          capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "ghost_at_rev.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("ghost_at_rev", path)
    engine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engine)

    def dpgan(D, x, y, r):
        model = engine.GhostClipping(D)
        opt = torch.optim.Adam(D.parameters(), lr=LR, betas=BETAS)
        sanitizer = GradientSanitizer(list(D.parameters()), max_grad_norm=C, noise_multiplier=SIGMA,
                                      expected_batch_size=len(x))

        def step():
            sanitizer._sums = model.clipped_sums(ns_loss(model(x, y), r), sanitizer.groups, sanitizer.bounds)
            sanitizer.finalize()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    def zhang(D, x, y, r):
        opt = torch.optim.Adam(D.parameters(), lr=LR, betas=BETAS)
        real, fake, yy, rho = zhang_units(x, y, r)
        params = dict(D.named_parameters())
        groups = grouping.fixed_groups(list(params), strategy="per_layer")
        model = engine.GhostClipping(D, second_order=True)
        sanitizer = GradientSanitizer([[params[n] for n in g] for g in groups], max_grad_norm=[C] * len(groups),
                                      noise_multiplier=SIGMA, expected_batch_size=len(real))

        def step():
            losses = unit_losses(model, real, fake, yy, rho, gp_weight=10.0)
            sanitizer._sums = model.clipped_sums(losses, sanitizer.groups, sanitizer.bounds)
            sanitizer.finalize()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    VARIANTS[f"dpsynth GradientSanitizer, ghost @{rev}"] = dpgan
    VARIANTS[f"zhang critic + GP, per-layer groups, ghost @{rev}"] = zhang
    REFERENCE[f"zhang critic + GP, per-layer groups, ghost @{rev}"] = "zhang critic + GP, non-private"


def ratio_stats(samples: list[float], reference: list[float]) -> tuple[float, tuple[float, float]]:
    """Median and quartiles of the per-round ratios samples[i] / reference[i]."""
    ratios = [s / r for s, r in zip(samples, reference)]
    if len(ratios) < 2:
        return ratios[0], (ratios[0], ratios[0])
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return statistics.median(ratios), (q1, q3)


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def allocation_peak(step) -> int:
    """Bytes: the peak of (torch CPU allocations − frees) during one call of ``step``, from the profiler's
    memory events in time order (allocations made before the call and freed in it count as negative)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return peak


def memory_child(name: str, batch_size: int, width: int, threads: int, baseline: str | None = None) -> None:
    """Build one variant, take one step (first-call allocations), measure the allocation peak of the next
    step, then reset the RSS high-water mark (``/proc/self/clear_refs``) and take 3 more; print JSON.
    Run in a fresh process by :func:`measure_memory` (``benchmarks/run.py --call``)."""
    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    if baseline:
        add_baseline(baseline)
    gen = torch.Generator().manual_seed(0)
    x, y, r, _ = make_batch(batch_size, gen)
    torch.manual_seed(0)
    step = VARIANTS[name](Discriminator(num_classes=10, channels=1, image_size=28, width=width), x, y, r)
    step()
    alloc = allocation_peak(step)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_kb("VmRSS")
    for _ in range(3):
        step()
    print(json.dumps({"alloc_peak_kb": alloc // 1024, "before_kb": before, "peak_kb": _status_kb("VmHWM")}))


def profile_variant(name: str, step) -> None:
    """Print the step's top operators by self CPU time (one step, torch.profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    print(f"--- {name}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=50))


def measure_memory(names, args) -> dict:
    out = {}
    for name in names:
        child = {"name": name, "batch_size": args.batch_size, "width": args.width, "threads": args.threads,
                 "baseline": args.baseline}
        cmd = [sys.executable, str(Path(__file__).with_name("run.py")), "--call", "dp_discriminator_step:memory_child",
               json.dumps(child)]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            out[name] = json.loads(res.stdout.strip().splitlines()[-1])
        except (subprocess.CalledProcessError, ValueError) as e:
            out[name] = {"error": str(getattr(e, "stderr", e))[-300:]}
    return out


def measure(*, batch_size: int = 128, width: int = 128, repeats: int = 5, warmup: int = 2, threads: int = 2,
            device: str = "cpu", only: list[str] | None = None, memory: bool = False, profile: bool = False,
            baseline: str | None = None) -> dict:
    """Time one discriminator step of every variant (``only``: those whose names contain one of these substrings,
    and their references) on B = ``batch_size`` real + B fake examples, D of ``width``; ``memory``: also each
    variant's allocation peak and peak RSS in its own process; ``baseline``: also the ghost variants with
    mechanisms/ghost.py from that git revision. Returns the settings and one row per variant."""
    args = SimpleNamespace(batch_size=batch_size, width=width, repeats=repeats, warmup=warmup, threads=threads,
                           device=device, only=only, memory=memory, profile=profile, baseline=baseline)
    torch.set_num_threads(args.threads)
    if args.baseline:
        add_baseline(args.baseline)
    chosen = [n for n in VARIANTS if not args.only or n in REFERENCE.values() or n == DEFAULT_REF
              or any(s in n for s in args.only)]
    warnings.filterwarnings("ignore")  # Opacus warns about secure RNG, full backward hooks, ...
    started, load = time.perf_counter(), os.getloadavg()
    gen = torch.Generator().manual_seed(0)
    x, y, r, source = make_batch(args.batch_size, gen)
    device = torch.device(args.device)
    x, y, r = x.to(device), y.to(device), r.to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    torch.manual_seed(0)
    D0 = Discriminator(num_classes=10, channels=1, image_size=28, width=args.width).to(device)

    steps, errors = {}, {}
    for name in chosen:
        factory = VARIANTS[name]
        try:
            steps[name] = factory(copy.deepcopy(D0), x, y, r)
        except Exception as e:  # a variant that cannot run with this model is reported, not fatal
            errors[name] = f"{type(e).__name__}: {e}"
    times = {name: [] for name in steps}
    cpu = {name: [] for name in steps}
    for rnd in range(args.warmup + args.repeats):
        names = list(steps)
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                steps[name]()
                sync()
            except Exception as e:
                errors[name] = f"{type(e).__name__}: {e}"
                del steps[name], times[name], cpu[name]
                continue
            if rnd >= args.warmup:
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
    if args.profile:
        for name, step in steps.items():
            profile_variant(name, step)

    mem = measure_memory(chosen, args) if args.memory else {}
    rows = []
    for name in chosen:
        ref_name = REFERENCE.get(name, DEFAULT_REF)
        if name in times:
            row = {"variant": name, "reference": ref_name, "median_s": statistics.median(times[name]),
                   "median_cpu_s": statistics.median(cpu[name]), "times_s": times[name], "cpu_s": cpu[name]}
            for key, samples in (("ratio", times), ("cpu_ratio", cpu)):
                if ref_name in samples:
                    row[key], row[key + "_quartiles"] = ratio_stats(samples[name], samples[ref_name])
            rows.append(row)
        else:
            rows.append({"variant": name, "error": errors[name]})
        if name in mem:
            rows[-1]["memory"] = mem[name]
            ref_mem = mem.get(ref_name, {})
            if "peak_kb" in mem[name] and "peak_kb" in ref_mem:
                rows[-1]["alloc_peak_ratio"] = mem[name]["alloc_peak_kb"] / ref_mem["alloc_peak_kb"]
                rows[-1]["rss_peak_ratio"] = mem[name]["peak_kb"] / ref_mem["peak_kb"]
    wall = time.perf_counter() - started

    print(f"D: width {args.width}, {count_parameters(D0):,} params; batch {args.batch_size} real + "
          f"{args.batch_size} fake, 28x28; input: {source}")
    print(f"device {device_name}; "
          f"torch {torch.__version__}, opacus {opacus.__version__}, {torch.get_num_threads()} threads, "
          f"{args.repeats} timed rounds after {args.warmup} warm-up; load average before {load[0]:.1f}, "
          f"after {os.getloadavg()[0]:.1f}")
    print(f"{'variant':<56}{'wall s':>8}{'x ref (quartiles)':>20}{'cpu s':>8}{'x ref (quartiles)':>20}"
          + (f"{'alloc MB':>10}{'x ref':>7}{'RSS MB':>8}{'x ref':>7}" if mem else ""))
    for row in rows:
        if "error" in row:
            print(f"{row['variant']:<56}{'FAILED':>8}   {row['error'][:200]}")
            continue

        def fmt(key):
            if key not in row:
                return f"{'n/a':>20}"
            q1, q3 = row[key + "_quartiles"]
            return f"{row[key]:>8.2f} ({q1:.2f}-{q3:.2f})"
        m = row.get("memory", {})
        extra = ""
        if mem:
            extra = (f"{m['alloc_peak_kb'] / 1024:>10.1f}{row.get('alloc_peak_ratio', float('nan')):>7.2f}"
                     f"{m['peak_kb'] / 1024:>8.0f}{row.get('rss_peak_ratio', float('nan')):>7.2f}" if "peak_kb" in m
                     else f"{'n/a':>10}")
        print(f"{row['variant']:<56}{row['median_s']:>8.3f}{fmt('ratio')}{row['median_cpu_s']:>8.3f}{fmt('cpu_ratio')}{extra}")
    print("ratios: median over rounds of (variant / reference in the same round), quartiles in brackets; reference: "
          "the zhang non-private critic step (WGAN-GP) for the zhang rows, else the DPGAN non-private step; "
          "alloc: the step's own allocation peak (torch.profiler), RSS: the process's peak RSS (fresh process each)")
    print(f"wall time {wall:.1f} s")
    return {
        "batch_size": args.batch_size, "width": args.width, "params": count_parameters(D0),
        "repeats": args.repeats, "warmup": args.warmup, "input": source, "threads": torch.get_num_threads(),
        "torch": torch.__version__, "opacus": opacus.__version__, "machine": platform.processor() or platform.machine(),
        "device": device_name,
        "load_average": [load[0], os.getloadavg()[0]],
        "ratio": "median over rounds of (variant s / reference s in the same round); quartiles of those ratios",
        "results": rows, "wall_s": wall}

