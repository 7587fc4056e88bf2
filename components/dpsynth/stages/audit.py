"""``dpsynth audit``: recompute ε from the mechanism trace with independent accountants; pass or fail the release.

The audit reads the trace the train manifest lists and the config, never the ε the trainer
claims (it reports that claim only for comparison). It passes only when every check holds:

* integrity: the trace and the generator have the sha256 the train manifest recorded;
* ``delta``: δ < 1/n for the n training records the partition manifest counts;
* the method's invariants (DPGAN: every event is Poisson / add-remove at q = batch_size/n, at
  most ``train.steps`` steps, at the configured noise multiplier when one is set), so a trace
  cannot understate its sampling rate;
* ``epsilon``: both accountants' upper bounds are within the target:
  ε_RDP ≤ target·(1 + 1e-9) and ε_PRV,upper ≤ target + eps_error. The PRV tolerance is the
  PRV accountant's own eps_error (0.01): its upper bound is its estimate plus that grid error,
  and soundness rests on the RDP bound, a rigorous upper bound, staying within the target.
  (A run calibrated with ``privacy.accountant=prv`` therefore fails when RDP, the looser
  bound, exceeds the target: the audit takes the stricter view on purpose.)

Outputs (sensitive zone, because a failed audit must release nothing): ``audit.json`` and
``audit.md``; ``sample`` copies them into the release zone once the audit passed. A failed
audit writes its report and manifest (status "failed") and exits non-zero. ε consumed: 0.
"""

from __future__ import annotations

import json
import math

from dpsynth import storage, tracking
from dpsynth.errors import AuditFailed, DpsynthError
from dpsynth.privacy import MechanismTrace, PRVAccountant, check_delta, get_accountant
from dpsynth.stages import common, manifest

STAGE = "audit"
SECTIONS = ("data", "partition", "privacy", "train")
FORMAT = "dpsynth.audit/1"
RDP_RELATIVE_TOLERANCE = 1e-9  # floating-point rounding only


def _check(name: str, ok: bool, detail: str) -> dict:
    return {"name": name, "passed": bool(ok), "detail": detail}


def _dpgan_invariants(cfg, trace: MechanismTrace, n: int) -> list[dict]:
    q = cfg.train.batch_size / n
    checks = []
    for i, e in enumerate(trace.events):
        ok = (e.sampling == "poisson" and e.sensitivity == "add_remove"
              and math.isclose(e.sample_rate, q, rel_tol=1e-9)
              and (cfg.privacy.noise_multiplier is None
                   or math.isclose(e.noise_multiplier, cfg.privacy.noise_multiplier, rel_tol=1e-12)))
        checks.append(_check(f"event[{i}]", ok, f"{e.sampling}/{e.sensitivity} q={e.sample_rate:.6g} "
                             f"σ={e.noise_multiplier:.6g} × {e.count}; expected poisson/add_remove q=B/n={q:.6g}"))
    checks.append(_check("steps", trace.steps <= cfg.train.steps, f"{trace.steps} steps, train.steps={cfg.train.steps}"))
    return checks


# method -> fn(cfg, trace, n_training_records) -> list of checks
INVARIANTS = {"dpgan": _dpgan_invariants}


def recompute(trace: MechanismTrace, *, delta: float) -> dict:
    """ε upper bounds of ``trace`` by both accountants (and PRV's lower bound and estimate)."""
    prv = PRVAccountant()
    low, est, up = prv.bounds(trace, delta=delta)
    return {"rdp": get_accountant("rdp").epsilon(trace, delta=delta),
            "prv": {"lower": low, "estimate": est, "upper": up, "eps_error": prv.eps_error}}


def evaluate(cfg, *, trace_text: str, n: int, integrity: list[dict]) -> dict:
    """The audit report of a trace (the decision and every check behind it)."""
    p = cfg.privacy
    checks = list(integrity)
    try:
        check_delta(p.delta, n)
        checks.append(_check("delta", True, f"δ={p.delta:g} < 1/n = {1 / n:.3g} (n = {n} training records)"))
    except DpsynthError as exc:
        checks.append(_check("delta", False, str(exc)))
    epsilons = None
    try:
        trace = MechanismTrace.from_json(trace_text)
        checks += INVARIANTS[cfg.train.method](cfg, trace, n)
        epsilons = recompute(trace, delta=p.delta)
        rdp, prv = epsilons["rdp"], epsilons["prv"]
        ok = rdp <= p.epsilon * (1 + RDP_RELATIVE_TOLERANCE) and prv["upper"] <= p.epsilon + prv["eps_error"]
        checks.append(_check("epsilon", ok, f"ε_RDP={rdp:.6g}, ε_PRV≤{prv['upper']:.6g} (±{prv['eps_error']}); "
                             f"target {p.epsilon:g} at δ={p.delta:g}"))
    except DpsynthError as exc:
        checks.append(_check("epsilon", False, f"cannot account the trace: {exc}"))
    bound = max(epsilons["rdp"], epsilons["prv"]["upper"]) if epsilons else None  # None: not accountable
    return {"format": FORMAT, "decision": "passed" if all(c["passed"] for c in checks) else "failed",
            "target": {"epsilon": p.epsilon, "delta": p.delta}, "epsilon_upper_bound": bound,
            "epsilons": epsilons, "training_records": n, "checks": checks}


def markdown(report: dict) -> str:
    lines = [f"# Privacy audit: {report['decision'].upper()}", "",
             f"Target (ε, δ) = ({report['target']['epsilon']:g}, {report['target']['delta']:g}); "
             f"recomputed upper bound ε ≤ {_num(report['epsilon_upper_bound'])} "
             f"(the trainer claimed {report['claimed']['epsilon']:.6g} with {report['claimed']['accountant']}, "
             "not used for the decision).", "", f"Generator sha256: `{report['generator']['sha256']}`", "",
             "| check | passed | detail |", "|---|---|---|"]
    lines += [f"| {c['name']} | {'yes' if c['passed'] else '**no**'} | {c['detail']} |" for c in report["checks"]]
    return "\n".join(lines) + "\n"


def _num(x) -> str:
    return "(none)" if x is None else f"{x:.6g}"


def run(ctx: common.StageContext) -> common.Outcome:
    cfg = ctx.cfg
    partition, partition_entry = common.upstream(ctx, "partition")
    trained, train_entry = common.upstream(ctx, "train")
    recorded = {role: manifest.output(trained, role) for role in ("trace", "generator")}
    current = {role: ctx.entry(item["uri"], role=role) for role, item in recorded.items()}
    inputs = [partition_entry, train_entry, *current.values()]
    fp = common.fingerprint(cfg, SECTIONS)
    if (reused := common.reuse(ctx, STAGE, fingerprint=fp, inputs=inputs)) is not None:
        return reused
    integrity = [_check(f"{role}_sha256", current[role]["sha256"] == recorded[role]["sha256"],
                        f"{current[role]['sha256']} (train manifest: {recorded[role]['sha256']})") for role in recorded]
    n = sum(s["rows"] for s in manifest.outputs(partition, "shard"))
    report = evaluate(cfg, trace_text=storage.read_bytes(recorded["trace"]["uri"]).decode(), n=n, integrity=integrity)
    report["generator"] = {"uri": current["generator"]["uri"], "sha256": current["generator"]["sha256"]}
    report["claimed"] = {k: trained["privacy"][k] for k in ("epsilon", "accountant")}
    status = "succeeded" if report["decision"] == "passed" else "failed"
    with common.child_run(ctx, STAGE) as run:
        storage.write_text(ctx.uri(STAGE, "audit.json"), json.dumps(report, indent=2) + "\n")
        storage.write_text(ctx.uri(STAGE, "audit.md"), markdown(report))
        if run is not None:
            import mlflow

            mlflow.set_tag(tracking.TAG_AUDIT, report["decision"])
            mlflow.log_metric("target_epsilon", cfg.privacy.epsilon)
            if report["epsilons"]:
                e = report["epsilons"]
                mlflow.log_metrics({"epsilon_upper_bound": report["epsilon_upper_bound"], "epsilon_rdp": e["rdp"],
                                    "epsilon_prv_upper": e["prv"]["upper"], "epsilon_prv_lower": e["prv"]["lower"]})
            mlflow.log_text(markdown(report), "audit.md")
        outputs = [ctx.entry(ctx.uri(STAGE, "audit.json"), role="report"),
                   ctx.entry(ctx.uri(STAGE, "audit.md"), role="report_markdown")]
        privacy = {**manifest.no_privacy(delta=cfg.privacy.delta, note="recomputes ε; touches no data"),
                   "accountant": "rdp+prv"}
        outcome = common.finish(ctx, STAGE, run, status=status, fingerprint=fp, inputs=inputs, outputs=outputs,
                                dataset_sha256=partition["dataset_sha256"], privacy=privacy,
                                details={"decision": report["decision"], "epsilon_upper_bound": report["epsilon_upper_bound"]})
        if status == "failed":
            failed = "; ".join(f"{c['name']}: {c['detail']}" for c in report["checks"] if not c["passed"])
            raise AuditFailed(f"audit failed, nothing may be released ({failed}); report: {ctx.uri(STAGE, 'audit.md')}")
        return outcome
