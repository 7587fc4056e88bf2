"""``dpsynth audit``: recompute ε from the mechanism trace with independent accountants; pass or fail the release.

The audit reads the trace the train manifest lists and the config, never the ε the trainer
claims (it compares with that claim, but the decision rests on its own numbers). It passes
only when every check holds:

* integrity: the trace and the generator have the sha256 the train manifest recorded;
* ``delta``: δ < 1/n for the n training records the partition manifest counts;
* ``noise``: every event of the trace adds noise (σ > 0, finite);
* ``sampling``: every event pairs its sampling scheme with the adjacency its accountant assumes
  (Poisson or full batch ↔ add/remove; without replacement, i.e. fixed-size batches or shards ↔
  replace-one), and the trainer's accountant is one that applies to it;
* ``accounting``: the run used sound accounting — a config, trace or result marked
  ``as_published`` (a paper's own, unsound account) never passes;
* the method's invariants (each method's own, named by :mod:`dpsynth.methods.registry`, imported
  when used), so a trace cannot understate its sampling rate or steps;
* ``epsilon``: every accountant that applies bounds ε within the target. Poisson events have
  two independent ones, RDP (ε_RDP ≤ target·(1 + 1e-9), floating-point rounding only) and PRV
  (ε_PRV,upper ≤ target + eps_error, its own grid error: soundness rests on the RDP bound, a
  rigorous upper bound); without-replacement events have one, the Wang–Balle–Kasiviswanathan
  bound ("wor": RDP and PRV assume Poisson sampling and do not apply — the report says so);
* ``claim``: the trainer's claimed ε agrees with the audit's recomputation by the same
  accountant within :data:`CLAIM_TOLERANCE` (relative, RDP curves) or PRV's eps_error;
* ``mlflow``: the pipeline's MLflow runs (parent and children) hold only the metrics and
  parameters their stage declares (each stage's ``MLFLOW_KEYS``, a trainer's for the train run:
  an allow-list with the reason each key is data-independent or accounted), so no actual batch
  size, shard index, per-example norm or loss on real data can slip through under a new name.

Outputs (sensitive zone, because a failed audit must release nothing): ``audit.json`` and
``audit.md``, also logged to the audit's MLflow run; the decision is tagged ``dpsynth.audit`` on
the audit, train and parent runs. ``sample`` copies the report into the release zone once the
audit passed. A failed audit writes its report and manifest (status "failed") and exits
non-zero. ε consumed: 0.
"""

from __future__ import annotations

import json
import math

from dpsynth import storage, tracking
from dpsynth.config import RunConfig
from dpsynth.errors import AuditFailed, DpsynthError
from dpsynth.methods import registry
from dpsynth.privacy import MechanismTrace, PRVAccountant, check_delta, empirical, get_accountant
from dpsynth.stages import common, manifest

STAGE = "audit"
SECTIONS = ("data", "partition", "privacy", "train", "warmup", "audit")
FORMAT = "dpsynth.audit/2"
RDP_RELATIVE_TOLERANCE = 1e-9  # floating-point rounding only
_BOUND = "ε recomputed from the mechanism trace (data-independent: the trace records the mechanism only)"
MLFLOW_KEYS = common.STAGE_RUN_KEYS | tracking.LoggedKeys(metrics={
    "target_epsilon": "privacy.epsilon (configuration)", "epsilon_upper_bound": _BOUND, "epsilon_rdp": _BOUND,
    "epsilon_wor": _BOUND, "epsilon_prv_upper": _BOUND, "epsilon_prv_lower": _BOUND,
    **empirical.MLFLOW_METRICS})
CLAIM_TOLERANCE = 1e-6  # relative: the trainer's RDP/WOR claim vs the audit's recomputation
# The adjacency each sampling scheme needs, and the accountants that bound it (first: the rigorous one).
SAMPLING_ADJACENCY = {"poisson": "add_remove", "full_batch": "add_remove", "without_replacement": "replace_one"}
SAMPLING_ACCOUNTANTS = {"poisson": ("rdp", "prv"), "full_batch": ("rdp", "prv"), "without_replacement": ("wor",)}


def _check(name: str, ok: bool, detail: str) -> dict:
    return {"name": name, "passed": bool(ok), "detail": detail}


def invariants(method: str):
    """The audit invariants of ``method`` (the method registry's ``invariants``); DpsynthError when
    there are none or they cannot be loaded (the audit then fails closed)."""
    spec = registry.get(method)
    try:
        return spec.audit_invariants()
    except (ImportError, AttributeError) as exc:
        raise DpsynthError(f"train.method: the audit invariants of {method!r} ({spec.invariants}) "
                           f"cannot be loaded ({exc})") from None


def accountants_for(trace: MechanismTrace) -> tuple[str, ...]:
    """The accountants that apply to every event of ``trace`` (by its sampling schemes); () if none."""
    schemes = {e.sampling for e in trace.events}
    names = [set(SAMPLING_ACCOUNTANTS.get(s, ())) for s in schemes]
    common_names = set.intersection(*names) if names else {"rdp", "prv"}
    return tuple(a for a in ("rdp", "prv", "wor") if a in common_names)


def recompute(trace: MechanismTrace, *, delta: float, accountants: tuple[str, ...] | None = None) -> dict:
    """ε upper bounds of ``trace`` by each applicable accountant (PRV also its lower bound and estimate)."""
    out = {}
    for name in accountants if accountants is not None else accountants_for(trace):
        if name == "prv":
            prv = PRVAccountant()
            low, est, up = prv.bounds(trace, delta=delta)
            out["prv"] = {"lower": low, "estimate": est, "upper": up, "eps_error": prv.eps_error}
        else:
            out[name] = get_accountant(name).epsilon(trace, delta=delta)
    return out


def upper_bound(epsilons: dict) -> float:
    return max(v["upper"] if isinstance(v, dict) else v for v in epsilons.values())


def _within(name: str, value, target: float) -> bool:
    if isinstance(value, dict):  # PRV: its upper bound, up to its own grid error
        return value["upper"] <= target + value["eps_error"]
    return value <= target * (1 + RDP_RELATIVE_TOLERANCE)


def _fmt_eps(name: str, value) -> str:
    if isinstance(value, dict):
        return f"ε_{name.upper()}≤{value['upper']:.6g} (±{value['eps_error']})"
    return f"ε_{name.upper()}={value:.6g}"


def _raw_checks(trace_text: str) -> list[dict]:
    """Checks on the trace as written (before parsing refuses it): noise > 0, sampling ↔ adjacency."""
    try:
        events = json.loads(trace_text).get("events")
        events = [e for e in events if isinstance(e, dict)]
    except (json.JSONDecodeError, AttributeError, TypeError):
        return []
    bad_noise = [i for i, e in enumerate(events)
                 if not (isinstance(e.get("noise_multiplier"), (int, float)) and 0 < e["noise_multiplier"] < math.inf)]
    mismatched = [f"event[{i}] {e.get('sampling')}/{e.get('sensitivity')}" for i, e in enumerate(events)
                  if SAMPLING_ADJACENCY.get(e.get("sampling")) != e.get("sensitivity")]
    return [
        _check("noise", events and not bad_noise,
               f"σ > 0 on all {len(events)} events" if events and not bad_noise else
               (f"no noise (σ ≤ 0 or not a number) on events {bad_noise}" if events else "the trace has no events")),
        _check("sampling", not mismatched,
               "every event pairs its sampling with the adjacency of its accountant "
               "(poisson/full_batch ↔ add_remove, without_replacement ↔ replace_one)" if not mismatched else
               f"sampling does not match the adjacency its accountant assumes: {', '.join(mismatched)}"),
    ]


def accounting_check(cfg: RunConfig, *marks: dict) -> dict:
    """Passes only for sound accounting: neither the config nor any of ``marks`` (the trace, the
    trainer's result, the train manifest) says ``"accounting": "as_published"``."""
    found = [cfg.privacy.accounting, *(m.get("accounting") for m in marks if isinstance(m, dict))]
    unsound = [a for a in found if a not in (None, "sound")]
    return _check("accounting", not unsound,
                  "sound accounting (docs/privacy.md)" if not unsound else
                  f"accounting {unsound[0]!r}: a paper's own account, reproduced for comparison; marked unsound, "
                  "it can never be released")


def claim_check(claimed: dict | None, epsilons: dict | None) -> dict:
    """The trainer's ε against the audit's recomputation by the trainer's own accountant."""
    if not claimed:
        return _check("claim", False, "the train manifest records no claimed ε")
    name, eps = claimed.get("accountant"), claimed.get("epsilon")
    if not epsilons or name not in epsilons:
        applicable = ", ".join(epsilons or ()) or "none"
        return _check("claim", False, f"the trainer accounted with {name!r}, which does not apply to this trace "
                      f"(applicable: {applicable})")
    value = epsilons[name]
    if isinstance(value, dict):
        ref, tol = value["upper"], value["eps_error"]
    else:
        ref, tol = value, CLAIM_TOLERANCE * max(abs(value), 1e-12)
    ok = isinstance(eps, (int, float)) and abs(eps - ref) <= tol
    return _check("claim", ok, f"trainer claimed ε={eps} ({name}); recomputed {ref:.6g}, tolerance ±{tol:.3g}")


def mlflow_check(cfg: RunConfig, *, tracking_uri: str | None, run_ids: list[str], parent_run_id: str | None) -> dict:
    """Every run of the pipeline (``run_ids``, and every child of ``parent_run_id``) holds only the
    metrics and parameters its stage declares (``MLFLOW_KEYS``: an allow-list, each key with why it is
    data-independent or accounted); a run of an unknown stage fails."""
    if not cfg.tracking.enabled or not (run_ids or parent_run_id):
        return _check("mlflow", True, "MLflow tracking is off for this pipeline run: no runs to inspect")
    try:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri)
        runs = {rid: client.get_run(rid) for rid in dict.fromkeys(r for r in (*run_ids, parent_run_id) if r)}
        if parent_run_id:
            exp = runs[parent_run_id].info.experiment_id
            for r in client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{parent_run_id}'", max_results=1000):
                runs.setdefault(r.info.run_id, r)
    except Exception as exc:  # cannot verify: fail closed
        return _check("mlflow", False, f"cannot read the pipeline's MLflow runs at {tracking_uri} ({exc})")
    from dpsynth.stages.pipeline import logged_keys  # the pipeline module knows every stage's module

    found = []
    for rid, r in runs.items():
        stage = r.data.tags.get(tracking.TAG_STAGE, "?")
        declared = logged_keys(stage, cfg.train.method)
        if declared is None:
            found.append(f"run {rid} of unknown stage {stage!r}")
            continue
        found += [f"{stage} run {rid}: {k}" for k in declared.undeclared(metrics=r.data.metrics, params=r.data.params)]
    return _check("mlflow", not found,
                  f"{len(runs)} MLflow runs hold only the metrics and parameters their stages declare" if not found else
                  "undeclared MLflow keys (not on their stage's allow-list): " + "; ".join(found))


def evaluate(cfg, *, trace_text: str, n: int, integrity: list[dict], claimed: dict | None = None,
             marks: tuple[dict, ...] = (), extra: list[dict] = ()) -> dict:
    """The audit report of a trace (the decision and every check behind it)."""
    p = cfg.privacy
    checks = list(integrity)
    try:
        check_delta(p.delta, n)
        checks.append(_check("delta", True, f"δ={p.delta:g} < 1/n = {1 / n:.3g} (n = {n} training records)"))
    except DpsynthError as exc:
        checks.append(_check("delta", False, str(exc)))
    checks += _raw_checks(trace_text)
    try:
        raw = json.loads(trace_text)
    except json.JSONDecodeError:
        raw = {}
    checks.append(accounting_check(cfg, raw if isinstance(raw, dict) else {}, *marks))
    epsilons, note = None, None
    try:
        trace = MechanismTrace.from_json(trace_text)
        try:
            checks += invariants(cfg.train.method)(cfg, trace, n)
        except DpsynthError as exc:
            checks.append(_check("invariants", False, str(exc)))
        names = accountants_for(trace)
        if not names:
            raise DpsynthError("no accountant applies to a trace that mixes sampling schemes "
                               f"{sorted({e.sampling for e in trace.events})}")
        if names == ("wor",):
            note = ("without-replacement (shard / fixed-size) sampling: only the Wang–Balle–Kasiviswanathan "
                    "bound ('wor') applies; RDP and PRV of the Poisson-subsampled Gaussian do not")
        else:
            note = "Poisson sampling: two independent accountants, RDP (rigorous upper bound) and PRV"
        epsilons = recompute(trace, delta=p.delta, accountants=names)
        ok = all(_within(k, v, p.epsilon) for k, v in epsilons.items())
        checks.append(_check("epsilon", ok, ", ".join(_fmt_eps(k, v) for k, v in epsilons.items())
                             + f"; target {p.epsilon:g} at δ={p.delta:g}"))
    except DpsynthError as exc:
        checks.append(_check("epsilon", False, f"cannot account the trace: {exc}"))
    if claimed is not None:
        checks.append(claim_check(claimed, epsilons))
    checks += list(extra)
    bound = upper_bound(epsilons) if epsilons else None  # None: not accountable
    return {"format": FORMAT, "decision": "passed" if all(c["passed"] for c in checks) else "failed",
            "target": {"epsilon": p.epsilon, "delta": p.delta}, "epsilon_upper_bound": bound,
            "epsilons": epsilons, "accountants_note": note, "training_records": n, "checks": checks}


def markdown(report: dict) -> str:
    claimed = report.get("claimed") or {}
    lines = [f"# Privacy audit: {report['decision'].upper()}", "",
             f"Target (ε, δ) = ({report['target']['epsilon']:g}, {report['target']['delta']:g}); "
             f"recomputed upper bound ε ≤ {_num(report['epsilon_upper_bound'])} "
             f"(the trainer claimed {_num(claimed.get('epsilon'))} with {claimed.get('accountant')}, "
             "compared but not used for the decision).", ""]
    if report.get("epsilons"):
        lines += ["| accountant | ε |", "|---|---|"]
        lines += [f"| {k} | {_fmt_eps(k, v)} |" for k, v in report["epsilons"].items()]
        lines += ["", report.get("accountants_note") or "", ""]
    lines += [f"Generator sha256: `{report['generator']['sha256']}`", "",
              "| check | passed | detail |", "|---|---|---|"]
    lines += [f"| {c['name']} | {'yes' if c['passed'] else '**no**'} | {c['detail']} |" for c in report["checks"]]
    return "\n".join(lines) + "\n" + empirical.markdown(report.get("empirical"))


def _num(x) -> str:
    return "(none)" if not isinstance(x, (int, float)) else f"{x:.6g}"


def _json_or_empty(uri: str | None) -> dict:
    if not uri:
        return {}
    try:
        data = json.loads(storage.read_bytes(uri))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _tag_runs(ctx: common.StageContext, run_ids: list[str | None], decision: str) -> None:
    """``dpsynth.audit`` = the decision on the runs the audit judged (train, parent)."""
    from mlflow import MlflowClient

    client = MlflowClient(ctx.tracking_uri)
    for rid in dict.fromkeys(r for r in run_ids if r):
        client.set_tag(rid, tracking.TAG_AUDIT, decision)


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
    claimed = {k: trained["privacy"].get(k) for k in ("epsilon", "accountant")}
    result_items = manifest.outputs(trained, "result")
    marks = (trained["privacy"], trained.get("details") or {},
             _json_or_empty(result_items[0]["uri"] if result_items else None))
    train_run = trained.get("mlflow_run_id")
    extra = [mlflow_check(cfg, tracking_uri=ctx.tracking_uri if cfg.tracking.enabled else None,
                          run_ids=[train_run] if train_run else [], parent_run_id=ctx.parent_run_id)]
    # the optional empirical audit (audit.empirical): ε_lower from canaries on a public stand-in; its gate
    measured = empirical.stage_audit(cfg, partition)
    extra += [measured["check"]] if measured else []
    report = evaluate(cfg, trace_text=storage.read_bytes(recorded["trace"]["uri"]).decode(), n=n,
                      integrity=integrity, claimed=claimed, marks=marks, extra=extra)
    report["generator"] = {"uri": current["generator"]["uri"], "sha256": current["generator"]["sha256"]}
    report["claimed"] = claimed
    report["empirical"] = measured
    report["runs"] = {"train": train_run, "parent": ctx.parent_run_id, "pipeline_run_id": ctx.pipeline_run_id}
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
                metrics = {"epsilon_upper_bound": report["epsilon_upper_bound"]}
                metrics.update({f"epsilon_{k}": v for k, v in e.items() if not isinstance(v, dict)})
                if "prv" in e:
                    metrics.update(epsilon_prv_upper=e["prv"]["upper"], epsilon_prv_lower=e["prv"]["lower"])
                mlflow.log_metrics(metrics)
            empirical.log_mlflow(measured, tracking_uri=ctx.tracking_uri, also=[ctx.parent_run_id])
            mlflow.log_text(markdown(report), "audit.md")
            tracking.log_json(report, "audit.json")
            _tag_runs(ctx, [train_run, ctx.parent_run_id], report["decision"])
        outputs = [ctx.entry(ctx.uri(STAGE, "audit.json"), role="report"),
                   ctx.entry(ctx.uri(STAGE, "audit.md"), role="report_markdown")]
        privacy = {**manifest.no_privacy(delta=cfg.privacy.delta, note="recomputes ε; touches no data"),
                   "accountant": "+".join(report["epsilons"]) if report["epsilons"] else "none"}
        outcome = common.finish(ctx, STAGE, run, status=status, fingerprint=fp, inputs=inputs, outputs=outputs,
                                dataset_sha256=partition["dataset_sha256"], privacy=privacy,
                                details={"decision": report["decision"], "epsilon_upper_bound": report["epsilon_upper_bound"],
                                         "epsilon_lower": measured["epsilon_lower"] if measured else None})
        if status == "failed":
            failed = "; ".join(f"{c['name']}: {c['detail']}" for c in report["checks"] if not c["passed"])
            raise AuditFailed(f"audit failed, nothing may be released ({failed}); report: {ctx.uri(STAGE, 'audit.md')}")
        return outcome
