"""Capture the OLD code's plans and statements for the shipped configs (before #35 item 1)."""
import json, sys, time
from pathlib import Path
from dpsynth.config import load_config
from dpsynth.methods import registry

REPO = Path.cwd()
CASES = []
for c in sorted((REPO / "configs").glob("*.yaml")):
    CASES.append((c.name, str(c.relative_to(REPO)), []))
CASES += [
    ("gswgan-as_published", "configs/gswgan-mnist-cpu.yaml", ["privacy.accounting=as_published", "privacy.noise_multiplier=1.07"]),
    ("gswgan-fixed-sigma", "configs/gswgan-mnist-cpu.yaml", ["privacy.noise_multiplier=30.0"]),
    ("gswgan-refused", "configs/gswgan-mnist-cpu.yaml", ["privacy.noise_multiplier=1.07"]),
    ("zhang-refused", "configs/zhang-mnist-cpu.yaml", ["privacy.noise_multiplier=0.01"]),
    ("dpgan-refused-delta", "configs/dpgan-digits-cpu.yaml", ["privacy.delta=0.001"]),
    ("zhang-as_published", "configs/zhang-mnist-cpu.yaml", ["privacy.accounting=as_published"]),
    ("zhang-fixed-sigma", "configs/zhang-mnist-cpu.yaml", ["privacy.noise_multiplier=3.0"]),
    ("dpgan-fixed-sigma", "configs/dpgan-digits-cpu.yaml", ["privacy.noise_multiplier=1.5", "warmup.central_images=false"]),
    ("federated", "configs/gswgan-mnist-cpu.yaml", ["train.method=gswgan_federated"]),
    ("federated-fixed-sigma", "configs/gswgan-mnist-cpu.yaml", ["train.method=gswgan_federated", "privacy.noise_multiplier=30.0", "train.n_d=3"]),
    ("federated-refused", "configs/gswgan-mnist-cpu.yaml", ["train.method=gswgan_federated", "privacy.noise_multiplier=2.0"]),
    ("federated-as_published", "configs/gswgan-mnist-cpu.yaml", ["train.method=gswgan_federated", "privacy.accounting=as_published", "privacy.noise_multiplier=1.07"]),
]
N = 54_000

def ev(e):
    return None if e is None else e.to_dict() if hasattr(e, "to_dict") else e.__dict__

out = {}
for name, path, overrides in CASES:
    t0 = time.time()
    cfg = load_config(path, overrides=overrides)
    spec = registry.get(cfg.train.method)
    try:
        plan = spec.audit_plan()(cfg, N)
    except Exception as exc:
        out[name] = {"config": path, "overrides": overrides, "n": N, "method": cfg.train.method,
                     "error": f"{type(exc).__name__}: {exc}"}
        print(name, "error", exc, file=sys.stderr)
        continue
    st = spec.audit_statement()(cfg, plan, N)
    out[name] = {"config": path, "overrides": overrides, "n": N, "method": cfg.train.method,
                 "trace": plan.trace.to_dict(), "steps": plan.steps, "noise_multiplier": plan.noise_multiplier,
                 "releases": plan.releases, "published_event": ev(plan.published_event),
                 "published_epsilon": plan.published_epsilon,
                 "guard_event": ev(plan.guard.event) if plan.guard else None,
                 "prefix": [ev(e) for e in plan.prefix], "statement": st}
    print(name, plan.steps, plan.noise_multiplier, f"{time.time()-t0:.1f}s", file=sys.stderr)
Path(sys.argv[1]).write_text(json.dumps(out, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
