"""ε_lower of the empirical audit (one-run canary audit) vs the accounted ε, and its CPU time.

For each recipe of --methods (``dpgan``: the default recipe, configs/dpgan-mnist-cpu.yaml; ``gswgan`` and
``dpac``: configs/gswgan-mnist-cpu.yaml, configs/dpac-mnist-cpu.yaml), at each ε of --eps and each m of
--canaries, one audit run per mode of --modes (``dpsynth.audit.empirical.run_audit``) on a public
stand-in of the bundled MNIST's training split (n = --records, 28×28×1, 10 classes), at the recipe's
own step count (``full`` audits all of it; --steps overrides it). Each run reports both attacks (white-box
canaries in the sanitizer, black-box input canaries). ``--full-canaries`` restricts the ``full`` runs to
some m; ``--full-eps`` to some ε. ``--controls`` adds the positive control at every ε and m: a ``quick``
audit with the sanitizer's noise removed. ``--reference`` times the same trainer for the ``quick`` steps
without canaries (same process, same stand-in), so the table can give the audit's CPU as a ratio.

Below ε = 8 the default recipe's variation release does not fit, below ε = 6 neither does the style
release (README): those ε run it with ``warmup.variations=0`` (and ``warmup.styles=0``), as the README says.

    OMP_NUM_THREADS=1 .venv/stage/bin/python benchmarks/empirical_audit.py --methods dpgan --controls --reference \\
        --json benchmarks/results/empirical-audit-dpgan-mnist-cpu.json
    OMP_NUM_THREADS=1 .venv/stage/bin/python benchmarks/empirical_audit.py --methods gswgan --controls --reference \\
        --full-eps 10 --full-canaries 1000 --json benchmarks/results/empirical-audit-gswgan-mnist-cpu.json
    .venv/stage/bin/python benchmarks/empirical_audit.py --render benchmarks/results/empirical-audit-*-mnist-cpu.json \\
        --markdown benchmarks/results/empirical-audit-dpgan-gswgan-mnist-cpu.md
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch

from dpsynth.config import load_config
from dpsynth.audit import empirical
from dpsynth.mechanisms.randomness import MechanismRandomness

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {"dpgan": "configs/dpgan-mnist-cpu.yaml", "gswgan": "configs/gswgan-mnist-cpu.yaml",
           "dpac": "configs/dpac-mnist-cpu.yaml"}
SHAPE = (28, 28, 1)


def recipe(method: str, eps: float, steps: int | None, quick_steps: int) -> list[str]:
    """The recipe's settings at ε (the default recipe drops the releases that do not fit, as the README says)."""
    sets = [f"privacy.epsilon={eps}", f"audit.quick_steps={quick_steps}", "tracking.enabled=false"]
    if steps:
        sets.append(f"train.steps={steps}")
    if method == "dpgan" and eps < 8:
        sets.append("warmup.variations=0")
    if method == "dpgan" and eps < 6:
        sets.append("warmup.styles=0")
    return sets


def one(cfg, *, n: int, mode: str, m: int, control: str | None = None) -> dict:
    original = MechanismRandomness.standard_normal
    if control == "no noise":
        MechanismRandomness.standard_normal = lambda self, shape, dtype=None: torch.zeros(shape, dtype=dtype)
    try:
        r = empirical.run_audit(cfg, n=n, image_shape=SHAPE, num_classes=10, mode=mode, canaries=m)
    finally:
        MechanismRandomness.standard_normal = original
    keep = ("method", "epsilon_lower", "accounted_epsilon", "accountant", "ceiling", "canaries", "steps", "mode",
            "noise_multiplier", "sample_rate", "cpu_seconds", "confidence")
    attacks = [{k: a[k] for k in ("name", "epsilon_lower", "canaries", "guesses", "correct", "ceiling")}
               for a in r["attacks"]]
    return {**{k: r[k] for k in keep}, "attacks": attacks, "control": control or "real sanitizer",
            "gate": empirical.gate(r)["verdict"]}  # passed | failed | inconclusive


def reference(cfg, *, n: int, steps: int) -> float:
    """CPU seconds of the same trainer on the same stand-in for ``steps`` steps, without canaries."""
    started = time.process_time()
    with tempfile.TemporaryDirectory(prefix="dpsynth-bench-") as tmp:
        trainer = empirical.stand_in_trainer(cfg, n=n, image_shape=SHAPE, num_classes=10, directory=tmp)
        for _ in range(min(steps, trainer.total_steps)):
            trainer.train_step()
    return time.process_time() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=["dpgan"], choices=sorted(CONFIGS))
    ap.add_argument("--eps", type=float, nargs="+", default=[1.0, 4.0, 10.0])
    ap.add_argument("--canaries", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--modes", nargs="+", default=["quick", "full"], choices=["quick", "full"])
    ap.add_argument("--full-canaries", type=int, nargs="+", help="m of the full runs (default: every --canaries)")
    ap.add_argument("--full-eps", type=float, nargs="+", help="ε of the full runs (default: every --eps)")
    ap.add_argument("--steps", type=int, help="train.steps (default: the recipe's own; full audits all of them)")
    ap.add_argument("--quick-steps", type=int, default=100)
    ap.add_argument("--records", type=int, default=9015, help="n: the default run's training records")
    ap.add_argument("--controls", action="store_true", help="also the no-noise control at every ε and m, quick")
    ap.add_argument("--reference", action="store_true", help="also the trainer alone for the quick steps, per ε")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--render", type=Path, nargs="+", metavar="JSON", help="only write --markdown from earlier --json")
    args = ap.parse_args()
    if args.render:
        text = "\n".join(markdown(json.loads(p.read_text())) for p in args.render)
        args.markdown.write_text(text) if args.markdown else print(text)
        return
    torch.set_num_threads(1)
    rows, references = [], []
    started = time.process_time()
    for method in args.methods:
        for eps in args.eps:
            cfg = load_config(str(REPO / CONFIGS[method]), overrides=recipe(method, eps, args.steps, args.quick_steps))
            for m in args.canaries:
                for mode in args.modes:
                    if mode == "full" and ((args.full_canaries and m not in args.full_canaries)
                                           or (args.full_eps and eps not in args.full_eps)):
                        continue
                    rows.append({"epsilon": eps, **one(cfg, n=args.records, mode=mode, m=m)})
                    print(json.dumps(rows[-1]), flush=True)
                if args.controls:
                    rows.append({"epsilon": eps, **one(cfg, n=args.records, mode="quick", m=m, control="no noise")})
                    print(json.dumps(rows[-1]), flush=True)
            if args.reference:  # after the audits: imports and caches as warm as theirs
                references.append({"method": method, "epsilon": eps, "steps": args.quick_steps,
                                   "cpu_seconds": reference(cfg, n=args.records, steps=args.quick_steps)})
                print(json.dumps(references[-1]), flush=True)
    out = {"benchmark": "empirical_audit", "methods": {m: CONFIGS[m] for m in args.methods},
           "train_steps": args.steps or "the recipe's", "quick_steps": args.quick_steps, "records": args.records,
           "machine": f"{platform.processor() or platform.machine()}, torch threads 1",
           "measured": time.strftime("%Y-%m-%d"), "total_cpu_seconds": time.process_time() - started,
           "references": references, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(markdown(out))
    if args.markdown:
        args.markdown.write_text(markdown(out))


def markdown(out: dict) -> str:
    refs = {(r["method"], r["epsilon"]): r["cpu_seconds"] for r in out.get("references", [])}
    table = ["| method | ε (target) | sanitizer | mode | steps | m (white / black) | ε_lower white-box "
             "| ε_lower black-box | accounted ε of the audited steps | largest provable ε "
             "| white-box correct / guesses | gate | CPU-s | × the trainer alone |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in out["rows"]:
        white, black = r["attacks"]
        ref = refs.get((r["method"], r["epsilon"]))
        same_steps = r["mode"] == "quick" and r["steps"] == out["quick_steps"]
        ratio = f"{r['cpu_seconds'] / ref:.2f}" if ref and same_steps else ""
        table.append(f"| {r['method']} | {r['epsilon']:g} | {r['control']} | {r['mode']} | {r['steps']} | "
                     f"{white['canaries']:,} / {black['canaries']:,} | {white['epsilon_lower']:.3f} | "
                     f"{black['epsilon_lower']:.3f} | {r['accounted_epsilon']:.3f} ({r['accountant']}) | "
                     f"{white['ceiling']:.2f} | {white['correct']} / {white['guesses']} | "
                     f"{ {'passed': 'pass', 'failed': '**fail**'}.get(r['gate'], r['gate'])} | "
                     f"{r['cpu_seconds']:.0f} | {ratio} |")
    lines = [f"- {r['method']} at ε = {r['epsilon']:g}: the trainer alone, {r['steps']} steps, "
             f"{r['cpu_seconds']:.0f} CPU-s" for r in out.get("references", [])]
    methods = ", ".join(f"{m} ({c})" for m, c in out["methods"].items())
    reference = "\nReference (same process, same stand-in, no canaries):\n\n" + "\n".join(lines) + "\n"
    return (f"Empirical audit of {methods}, train.steps = {out['train_steps']} (quick: {out['quick_steps']} "
            f"steps), n = {out['records']}, measured {out['measured']} on the shared 2-core CPU, one torch thread; "
            f"total {out['total_cpu_seconds'] / 60:.1f} CPU-minutes.\n\n" + "\n".join(table) + "\n"
            + (reference if lines else ""))


if __name__ == "__main__":
    main()
