"""ε_lower of the empirical audit (one-run canary audit) vs the accounted ε, and its CPU time.

For the default recipe (configs/dpgan-mnist-cpu.yaml) at each ε of --eps and each m of --canaries, one
audit run in ``quick`` and one in ``full`` mode (``dpsynth.privacy.empirical.run_audit``) on a public
stand-in of the bundled MNIST's training split (n = --records, 28×28×1, 10 classes), plus positive
controls with the sanitizer's noise removed. ``--steps`` sets ``train.steps`` (the recipe's 1,000 take
~4.5 CPU-minutes per full audit here; the noise is calibrated for whatever ``train.steps`` is).

    OMP_NUM_THREADS=1 .venv/stage/bin/python benchmarks/empirical_audit.py --steps 300 \\
        --json benchmarks/results/empirical_audit.json --markdown benchmarks/results/empirical_audit.md
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from dpsynth.config import load_config
from dpsynth.privacy import empirical
from dpsynth.privacy.randomness import MechanismRandomness

REPO = Path(__file__).resolve().parents[1]


def one(cfg, *, n: int, mode: str, m: int, control: str | None = None) -> dict:
    original = MechanismRandomness.standard_normal
    if control == "no noise":
        MechanismRandomness.standard_normal = lambda self, shape, dtype=None: torch.zeros(shape, dtype=dtype)
    try:
        r = empirical.run_audit(cfg, n=n, image_shape=(28, 28, 1), num_classes=10, mode=mode, canaries=m)
    finally:
        MechanismRandomness.standard_normal = original
    keep = ("epsilon_lower", "accounted_epsilon", "ceiling", "canaries", "guesses", "correct", "steps", "mode",
            "noise_multiplier", "sample_rate", "cpu_seconds", "confidence")
    return {**{k: r[k] for k in keep}, "control": control or "real sanitizer", "gate": empirical.gate(r)["passed"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "configs" / "dpgan-mnist-cpu.yaml"))
    ap.add_argument("--eps", type=float, nargs="+", default=[1.0, 4.0, 10.0])
    ap.add_argument("--canaries", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--steps", type=int, default=1000, help="train.steps of the recipe (full audits them all)")
    ap.add_argument("--quick-steps", type=int, default=100)
    ap.add_argument("--records", type=int, default=9015, help="n: the default run's training records")
    ap.add_argument("--controls", action="store_true", help="also the no-noise control at every ε, quick")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--render", type=Path, metavar="JSON", help="only write --markdown from an earlier --json")
    args = ap.parse_args()
    if args.render:
        args.markdown.write_text(markdown(json.loads(args.render.read_text())))
        return
    torch.set_num_threads(1)
    rows = []
    started = time.process_time()
    for eps in args.eps:
        cfg = load_config(args.config, overrides=[f"privacy.epsilon={eps}", f"train.steps={args.steps}",
                                                  f"audit.quick_steps={args.quick_steps}", "tracking.enabled=false"])
        for m in args.canaries:
            for mode in ("quick", "full"):
                rows.append({"epsilon": eps, **one(cfg, n=args.records, mode=mode, m=m)})
                print(json.dumps(rows[-1]), flush=True)
        if args.controls:
            for m in args.canaries:
                rows.append({"epsilon": eps, **one(cfg, n=args.records, mode="quick", m=m, control="no noise")})
                print(json.dumps(rows[-1]), flush=True)
    out = {"benchmark": "empirical_audit", "config": args.config, "train_steps": args.steps,
           "quick_steps": args.quick_steps, "records": args.records, "attack": empirical.ATTACK,
           "machine": f"{platform.processor() or platform.machine()}, torch threads 1",
           "measured": time.strftime("%Y-%m-%d"), "total_cpu_seconds": time.process_time() - started, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(markdown(out))
    if args.markdown:
        args.markdown.write_text(markdown(out))


def markdown(out: dict) -> str:
    table = ["| ε (target) | sanitizer | mode | steps | m | ε_lower (95 %) | accounted ε of the audited steps | "
             "largest provable ε | correct / guesses | gate | CPU-s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in out["rows"]:
        ceiling = r.get("ceiling") or empirical.guess_and_bound([0.0] * r["canaries"], [True] * r["canaries"],
                                                                delta=1e-5)["ceiling"]  # δ of the recipe
        table.append(f"| {r['epsilon']:g} | {r['control']} | {r['mode']} | {r['steps']} | {r['canaries']:,} | "
                     f"{r['epsilon_lower']:.3f} | {r['accounted_epsilon']:.3f} | {ceiling:.2f} | "
                     f"{r['correct']} / {r['guesses']} | {'pass' if r['gate'] else '**fail**'} | {r['cpu_seconds']:.0f} |")
    return (f"Empirical audit, default recipe with train.steps={out['train_steps']} (quick: {out['quick_steps']} "
            f"steps), n={out['records']}, measured {out['measured']} on the shared 2-core CPU, one torch thread; "
            f"total {out['total_cpu_seconds'] / 60:.1f} CPU-minutes.\n\n" + "\n".join(table) + "\n")


if __name__ == "__main__":
    main()
