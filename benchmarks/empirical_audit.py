"""ε_lower of the empirical audit (one-run canary audit) vs the accounted ε, and its CPU time.

For each recipe of methods (``dpgan``: the default recipe, configs/dpgan-mnist-cpu.yaml; ``gswgan`` and
``dpac``: configs/gswgan-mnist-cpu.yaml, configs/dpac-mnist-cpu.yaml), at each ε of eps and each m of
canaries, one audit run per mode of modes (``dpsynth.audit.empirical.run_audit``) on a public
stand-in of the bundled MNIST's training split (n = --records, 28×28×1, 10 classes), at the recipe's
own step count (``full`` audits all of it; steps overrides it). Each run reports both attacks (white-box
canaries in the sanitizer, black-box input canaries). ``full_canaries`` restricts the ``full`` runs to
some m; ``full_eps`` to some ε. ``controls`` adds the positive control at every ε and m: a ``quick``
audit with the sanitizer's noise removed. ``reference`` times the same trainer for the ``quick`` steps
without canaries (same process, same stand-in), so the table can give the audit's CPU as a ratio.

Below ε = 8 the default recipe's variation release does not fit, below ε = 6 neither does the style
release (README): those ε run it with ``warmup.variations=0`` (and ``warmup.styles=0``), as the README says.

    .venv/stage/bin/python benchmarks/run.py empirical-audit   # the suite in benchmarks/suites.toml; arguments: measure()
"""

from __future__ import annotations

import json
import platform
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from dpsynth.config import load_config
from dpsynth.audit import empirical
from dpsynth.audit import canaries as audit_canaries
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
        trainer = audit_canaries.stand_in_trainer(cfg, n=n, image_shape=SHAPE, num_classes=10, directory=tmp)
        for _ in range(min(steps, trainer.total_steps)):
            trainer.train_step()
    return time.process_time() - started


def measure(*, methods: tuple[str, ...] = ("dpgan",), eps: tuple[float, ...] = (1.0, 4.0, 10.0),
            canaries: tuple[int, ...] = (1000, 10000), modes: tuple[str, ...] = ("quick", "full"),
            full_canaries: list[int] | None = None, full_eps: list[float] | None = None, steps: int | None = None,
            quick_steps: int = 100, records: int = 9015, controls: bool = False, reference: bool = False) -> dict:
    """The empirical audit of each of ``methods`` (of CONFIGS) at each ε and canary count m, in each mode; the
    full runs only at ``full_canaries``/``full_eps`` when given. ``steps``: train.steps (default: the recipe's
    own); ``records``: n, the default run's training records; ``controls``: also the no-noise control at every ε
    and m, quick; ``reference``: also the trainer alone for the quick steps, per ε. Returns the rows
    (:func:`markdown` renders them)."""
    unknown = sorted(set(methods) - set(CONFIGS))
    if unknown:
        raise ValueError(f"methods: {unknown} not of {sorted(CONFIGS)}")
    args = SimpleNamespace(methods=list(methods), eps=list(eps), canaries=list(canaries), modes=list(modes),
                           full_canaries=full_canaries, full_eps=full_eps, steps=steps, quick_steps=quick_steps,
                           records=records, controls=controls, reference=reference)
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
    print(markdown(out))
    return out


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

