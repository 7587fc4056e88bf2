"""``dpsynth audit``: recompute ε from the mechanism trace with independent accountants; pass or fail the release.

The audit reads the trace the train manifest lists and the config, never the ε the trainer
claims (it compares with that claim, but the decision rests on its own numbers). It passes
only when every check holds:

* integrity: the trace and the generator have the sha256 the train manifest recorded, and the
  generator file is bound to the trace (``generator_trace``: the trace's sha256 and step count that
  the trainer wrote into the generator file equal the audited trace's);
* ``delta``: δ < 1/n for the n training records the partition manifest counts;
* ``noise``: every event of the trace adds noise (σ > 0, finite);
* ``sampling``: every event pairs its sampling scheme with the adjacency its accountant assumes
  (Poisson or full batch ↔ add/remove; without replacement, i.e. fixed-size batches or shards ↔
  replace-one), and the trainer's accountant is one that applies to it;
* ``accounting``: the run used sound accounting — a config, trace or result marked
  ``as_published`` (a paper's own, unsound account) never passes;
* ``plan``: the trace equals the privacy plan recomputed from the config and n by the method's
  mechanism (the registry's ``mechanism``, :mod:`dpsynth.mechanisms`;
  :attr:`~dpsynth.privacy.plan.PrivacyPlan.trace`) — every event's sampling, adjacency and step
  count exactly, its rate and σ to 1e-9 relative (calibration recomputed), including the warm-up
  releases that open the trace — so a trace cannot understate its sampling rate, its noise or its steps;
* ``epsilon``: every accountant that applies bounds ε within the target. Poisson events have
  two independent ones, RDP (ε_RDP ≤ target·(1 + 1e-9), floating-point rounding only) and PRV
  (ε_PRV,upper ≤ target + eps_error, its own grid error: soundness rests on the RDP bound, a
  rigorous upper bound). PRV runs in a child process stopped after
  :data:`~dpsynth.privacy.accountants.PRV_TIME_LIMIT_S`; when it fails or runs out of time the
  RDP bound stands in for it (a valid upper bound on the same trace), and the report says so.
  Without-replacement events have one, the Wang–Balle–Kasiviswanathan
  bound ("wor": RDP and PRV assume Poisson sampling and do not apply — the report says so);
* ``claim``: the trainer's claimed ε agrees with the audit's recomputation by the same
  accountant within :data:`CLAIM_TOLERANCE` (relative, RDP curves) or PRV's eps_error;
* ``mlflow``: the pipeline's MLflow runs (parent and children) hold only the metrics and
  parameters their stage declares (each stage's ``MLFLOW_KEYS``, a trainer's for the train run:
  an allow-list with the reason each key is data-independent or accounted), so no actual batch
  size, shard index, per-example norm or loss on real data can slip through under a new name;
* ``mlflow_values``: nor does any of those runs hold, in a param or metric value, a tag or an artifact, the raw
  sha256 of a sensitive-zone file the stages recorded (a pre-trained discriminator's hash, say, is a membership
  test for anyone who can retrain it): outside the sensitive zone they are named by keyed version ids.

Every report also *states* what its ε means (the statement of the method's mechanism,
:mod:`dpsynth.privacy.statement`): the adjacency and the rate that matches it, the σ convention,
the assumptions the account makes (GS-WGAN's shard-state assumption), other accounts beside it
(the shard choice revealed; federated: against the server), and any records used without privacy.
``audit.md``, the release record and the MLflow tags (``dpsynth.privacy.*``) carry the statement.

Outputs (sensitive zone, because a failed audit must release nothing): ``audit.json`` and
``audit.md``, also logged to the audit's MLflow run (there with the raw hashes of sensitive-zone files, the
generator's and the trace's among them, replaced by keyed version ids: the MLflow copy is written before the gate);
the decision is tagged ``dpsynth.audit`` on
the audit, train and parent runs. ``sample`` copies the report into the release zone once the
audit passed. A failed audit writes its report and manifest (status "failed") and exits
non-zero. ε consumed: 0.
"""

from __future__ import annotations

import hashlib
import json
import math

from dpsynth import egress, storage, tracking
from dpsynth.config import RunConfig
from dpsynth.errors import AuditFailed, DpsynthError
from dpsynth.methods import registry
from dpsynth.training.artifacts import generator_privacy
from dpsynth.privacy import MechanismTrace, check_delta, get_accountant
from dpsynth.audit import empirical
from dpsynth.audit import report as empirical_report
from dpsynth.privacy.accountants import PRV_TIME_LIMIT_S, prv_bounds_or_rdp
from dpsynth.stages import protocol, manifest

STAGE = "audit"
SECTIONS = ("data", "partition", "privacy", "train", "warmup", "audit")
FORMAT = "dpsynth.audit/2"
RDP_RELATIVE_TOLERANCE = 1e-9  # floating-point rounding only
_BOUND = "ε recomputed from the mechanism trace (data-independent: the trace records the mechanism only)"
MLFLOW_KEYS = protocol.STAGE_RUN_KEYS | tracking.LoggedKeys(metrics={
    "target_epsilon": "privacy.epsilon (configuration)", "epsilon_upper_bound": _BOUND, "epsilon_rdp": _BOUND,
    "epsilon_wor": _BOUND, "epsilon_prv_upper": _BOUND, "epsilon_prv_lower": _BOUND,
    **empirical_report.MLFLOW_METRICS})
CLAIM_TOLERANCE = 1e-6  # relative: the trainer's RDP/WOR claim vs the audit's recomputation
# The adjacency each sampling scheme needs, and the accountants that bound it (first: the rigorous one).
SAMPLING_ADJACENCY = {"poisson": "add_remove", "full_batch": "add_remove", "without_replacement": "replace_one"}
PLAN_RELATIVE_TOLERANCE = 1e-9  # a recomputed rate or calibrated σ against the trace's
# MLflow tags that carry the statement (audit, train and parent runs)
TAG_ADJACENCY, TAG_ASSUMPTIONS, TAG_UNPROTECTED = "dpsynth.privacy.adjacency", "dpsynth.privacy.assumptions", \
    "dpsynth.privacy.unprotected"


def _check(name: str, ok: bool, detail: str) -> dict:
    return {"name": name, "passed": bool(ok), "detail": detail}


def recompute_plan(cfg: RunConfig, n: int):
    """(the mechanism of ``cfg``'s method, its privacy plan recomputed from ``cfg`` and n); DpsynthError (a
    ConfigError or PrivacyError naming the setting) when the configuration allows no plan."""
    mechanism = registry.get(cfg.train.method).mechanism
    return mechanism, mechanism.plan(cfg, n)


def mechanism_check(cfg: RunConfig, trace: MechanismTrace, n: int) -> dict:
    """The ``plan`` check: ``trace`` against the plan its method's mechanism recomputes from ``cfg`` and n."""
    try:
        _, plan = recompute_plan(cfg, n)
    except DpsynthError as exc:
        return _check("plan", False, f"cannot recompute the privacy plan from the config and n: {exc}")
    return plan_check(plan.trace, trace)


def accountants_for(trace: MechanismTrace) -> tuple[str, ...]:
    """The registered accountants that support every event of ``trace`` (each says so itself); () if none."""
    from dpsynth.privacy.registry import ACCOUNTANTS

    return tuple(name for name, cls in ACCOUNTANTS.items() if all(cls().supports(e) for e in trace.events))


def recompute(trace: MechanismTrace, *, delta: float, accountants: tuple[str, ...] | None = None,
              prv_time_limit_s: float = PRV_TIME_LIMIT_S) -> dict:
    """ε upper bounds of ``trace`` by each applicable accountant (PRV also its lower bound and estimate;
    past its time limit or on failure, the RDP bound marked ``"fallback": "rdp"``)."""
    out = {}
    for name in accountants if accountants is not None else accountants_for(trace):
        if name == "prv":
            out["prv"] = prv_bounds_or_rdp(trace, delta=delta, time_limit_s=prv_time_limit_s)
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
    if isinstance(value, dict) and value.get("fallback"):
        return f"ε_{name.upper()}≤{value['upper']:.6g} (the {value['fallback'].upper()} fallback: {value['reason']})"
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
    if isinstance(value, dict) and value.get("fallback"):  # PRV not recomputed: the claim must not exceed the bound
        ok = isinstance(eps, (int, float)) and eps <= value["upper"] * (1 + CLAIM_TOLERANCE)
        return _check("claim", ok, f"trainer claimed ε={eps} ({name}); {name} could not be recomputed "
                      f"({value['reason']}); the claim is {'within' if ok else 'above'} that bound {value['upper']:.6g}")
    if isinstance(value, dict):
        ref, tol = value["upper"], value["eps_error"]
    else:
        ref, tol = value, CLAIM_TOLERANCE * max(abs(value), 1e-12)
    ok = isinstance(eps, (int, float)) and abs(eps - ref) <= tol
    return _check("claim", ok, f"trainer claimed ε={eps} ({name}); recomputed {ref:.6g}, tolerance ±{tol:.3g}")


def plan_check(planned: MechanismTrace, trace: MechanismTrace) -> dict:
    """The trace equals the recomputed plan: the same events in order, each with the same sampling,
    adjacency and count, and the same rate and σ up to :data:`PLAN_RELATIVE_TOLERANCE`."""
    want, got = planned.events, trace.events

    def same(a, b) -> bool:
        return (a.sampling == b.sampling and a.sensitivity == b.sensitivity and a.count == b.count
                and math.isclose(a.sample_rate, b.sample_rate, rel_tol=PLAN_RELATIVE_TOLERANCE)
                and math.isclose(a.noise_multiplier, b.noise_multiplier, rel_tol=PLAN_RELATIVE_TOLERANCE))

    def show(e) -> str:
        return f"{e.sampling}/{e.sensitivity} q={e.sample_rate:.6g} σ={e.noise_multiplier:.6g} ×{e.count}"

    bad = [i for i, (a, b) in enumerate(zip(want, got)) if not same(a, b)]
    if len(want) != len(got):
        bad.append(min(len(want), len(got)))
    if not bad:
        return _check("plan", True, "the trace is the plan recomputed from the config and n: "
                      + "; ".join(show(e) for e in want))
    i = bad[0]
    return _check("plan", False, f"the trace is not the recomputed plan (event[{i}]: trace "
                  f"{show(got[i]) if i < len(got) else 'none'}, plan {show(want[i]) if i < len(want) else 'none'}; "
                  f"{trace.steps} steps recorded, {planned.steps} planned)")


def generator_trace_check(generator_record: dict | None, trace_text: str) -> dict:
    """The generator file is bound to the audited trace: its recorded trace sha256 and step count match."""
    sha = hashlib.sha256(trace_text.encode()).hexdigest()
    try:
        steps = MechanismTrace.from_json(trace_text).steps
    except DpsynthError:
        steps = None
    rec = generator_record or {}
    ok = rec.get("trace_sha256") == sha and rec.get("trace_steps") == steps and steps is not None
    same = "the same" if rec.get("trace_sha256") == sha else "another"  # no hash in a check's detail (#52 item 3)
    return _check("generator_trace", ok,
                  f"the generator file records {same} trace sha256 as the audited trace's, and "
                  f"{rec.get('trace_steps')} steps; the audited trace has {steps}")


def pipeline_runs(tracking_uri: str, *, run_ids: list[str], parent_run_id: str | None):
    """(client, {run id: run}): ``run_ids``, the parent and every child of ``parent_run_id``."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    runs = {rid: client.get_run(rid) for rid in dict.fromkeys(r for r in (*run_ids, parent_run_id) if r)}
    if parent_run_id:
        exp = runs[parent_run_id].info.experiment_id
        for r in client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{parent_run_id}'", max_results=1000):
            runs.setdefault(r.info.run_id, r)
    return client, runs


def logged_keys(stage: str, method: str) -> tracking.LoggedKeys | None:
    """The allow-list of an MLflow run of ``stage`` (``"pipeline"``: the parent run); None: unknown stage."""
    from dpsynth.stages import evaluate, partition, sample, train, pretrain

    if stage == "pipeline":
        return protocol.PARENT_RUN_KEYS
    if stage == "train":
        return train.logged_keys(method)
    if stage == STAGE:
        return MLFLOW_KEYS
    module = {m.STAGE: m for m in (partition, pretrain, sample, evaluate)}.get(stage)
    return module.MLFLOW_KEYS if module is not None else None


def mlflow_check(cfg: RunConfig, *, tracking_uri: str | None, run_ids: list[str], parent_run_id: str | None) -> dict:
    """Every run of the pipeline (``run_ids``, and every child of ``parent_run_id``) holds only the
    metrics and parameters its stage declares (``MLFLOW_KEYS``: an allow-list, each key with why it is
    data-independent or accounted); a run of an unknown stage fails."""
    if not cfg.tracking.enabled or not (run_ids or parent_run_id):
        return _check("mlflow", True, "MLflow tracking is off for this pipeline run: no runs to inspect")
    try:
        _, runs = pipeline_runs(tracking_uri, run_ids=run_ids, parent_run_id=parent_run_id)
    except Exception as exc:  # cannot verify: fail closed
        return _check("mlflow", False, f"cannot read the pipeline's MLflow runs at {tracking_uri} ({exc})")
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


# --- no raw hash of a sensitive-zone file in MLflow (issue #33) -------------------------------------------


def sensitive_hashes(ctx: protocol.StageContext, stages=("partition", "pretrain", "train")) -> dict[str, str]:
    """Raw sha256 → what it names, for every sensitive-zone file the stages before the audit recorded: each entry
    of their manifests outside the release zone (its ``sha256`` and ``content_sha256``: the source, shards,
    held-out records, pre-trained discriminators, generator, trace …) and the manifest files themselves."""
    found: dict[str, str] = {}
    for stage in stages:
        uri = ctx.manifest_uri(stage)
        if not storage.exists(uri):
            continue
        found[storage.sha256(uri)] = f"the {stage} manifest"
        m = manifest.read(uri)
        for item in (*m.get("inputs", []), *m.get("outputs", [])):
            if ctx.zones.zone_of(item["uri"]) != "release":
                for field in ("sha256", "content_sha256"):
                    if item.get(field):
                        found.setdefault(item[field], f"{stage}'s {item['role']} ({field})")
    return found


def leaked_hashes(texts: dict[str, str], hashes: dict[str, str]) -> list[str]:
    """``where: what`` for every raw hash of ``hashes`` found in ``texts`` ({where: text})."""
    return [f"{where}: {what}" for where, text in texts.items() for h, what in hashes.items() if h in text]


def run_texts(client, run, scratch: str) -> dict[str, str]:
    """What one MLflow run holds, as text by place: its param and metric values, its tags, and every artifact."""
    import pathlib

    rid = run.info.run_id
    texts = {f"run {rid} param {k}": str(v) for k, v in run.data.params.items()}
    texts.update({f"run {rid} metric {k}": repr(v) for k, v in run.data.metrics.items()})
    texts.update({f"run {rid} tag {k}": str(v) for k, v in run.data.tags.items()})
    if client.list_artifacts(rid):
        local = pathlib.Path(client.download_artifacts(rid, "", scratch))
        for f in sorted(p for p in local.rglob("*") if p.is_file()):
            texts[f"run {rid} artifact {f.relative_to(local)}"] = f.read_bytes().decode("latin-1")
    return texts


def mlflow_values_check(ctx: protocol.StageContext, *, run_ids: list[str], parent_run_id: str | None) -> dict:
    """``mlflow_values``: no MLflow run of the pipeline holds, in a param or metric value, a tag or an artifact, the
    raw sha256 of a sensitive-zone file (:func:`sensitive_hashes`): the keys are on allow-lists
    (:func:`mlflow_check`), this reads what they hold. Outside the sensitive zone such files are named by keyed
    version ids only (:func:`~dpsynth.stages.protocol.outside_view`)."""
    import tempfile

    if not ctx.cfg.tracking.enabled or not (run_ids or parent_run_id):
        return _check("mlflow_values", True, "MLflow tracking is off for this pipeline run: no runs to inspect")
    hashes = sensitive_hashes(ctx)
    try:
        client, runs = pipeline_runs(ctx.tracking_uri, run_ids=run_ids, parent_run_id=parent_run_id)
        with tempfile.TemporaryDirectory(prefix="dpsynth-audit-") as scratch:
            found = [hit for i, r in enumerate(runs.values())
                     for hit in leaked_hashes(run_texts(client, r, f"{scratch}/{i}"), hashes)]
    except Exception as exc:  # cannot verify: fail closed
        return _check("mlflow_values", False, f"cannot read the pipeline's MLflow runs at {ctx.tracking_uri} ({exc})")
    return _check("mlflow_values", not found,
                  f"{len(runs)} MLflow runs: no param, metric, tag or artifact holds the raw sha256 of any of "
                  f"{len(hashes)} sensitive-zone files" if not found else
                  "raw sha256 of sensitive-zone files in MLflow: " + "; ".join(found))


def outside_text(ctx: protocol.StageContext, text: str, hashes) -> str:
    """``text`` with every raw hash of ``hashes`` replaced by its keyed version id: what the audit logs to MLflow
    (before the gate: a failed audit's generator and trace are not released, so neither are their hashes)."""
    for h in hashes:
        text = text.replace(h, protocol.dataset_version(ctx, h))
    return text


def evaluate(cfg, *, trace_text: str, n: int, integrity: list[dict], claimed: dict | None = None,
             marks: tuple[dict, ...] = (), extra: list[dict] = (), prv_time_limit_s: float = PRV_TIME_LIMIT_S) -> dict:
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
    epsilons, note, statement = None, None, None
    try:
        trace = MechanismTrace.from_json(trace_text)
        try:
            mechanism, plan = recompute_plan(cfg, n)
            checks.append(plan_check(plan.trace, trace))
            statement = mechanism.statement(cfg, plan, n)
        except DpsynthError as exc:
            checks.append(_check("plan", False, f"cannot recompute the privacy plan from the config and n: {exc}"))
        names = accountants_for(trace)
        if not names:
            raise DpsynthError("no accountant applies to a trace that mixes sampling schemes "
                               f"{sorted({e.sampling for e in trace.events})}")
        if names == ("wor",):
            note = ("without-replacement (shard / fixed-size) sampling: only the Wang–Balle–Kasiviswanathan "
                    "bound ('wor') applies; RDP and PRV of the Poisson-subsampled Gaussian do not")
        elif all(e.sampling == "full_batch" for e in trace.events):
            note = ("full-batch Gaussian releases (no sampling): every accountant applies, RDP and the "
                    "without-replacement bound (rigorous upper bounds, at their own orders) and PRV")
        else:
            note = "Poisson sampling: two independent accountants, RDP (rigorous upper bound) and PRV"
        epsilons = recompute(trace, delta=p.delta, accountants=names, prv_time_limit_s=prv_time_limit_s)
        ok = all(_within(k, v, p.epsilon) for k, v in epsilons.items())
        checks.append(_check("epsilon", ok, ", ".join(_fmt_eps(k, v) for k, v in epsilons.items())
                             + f"; target {p.epsilon:g} at δ={p.delta:g}"))
    except DpsynthError as exc:
        checks.append(_check("epsilon", False, f"cannot account the trace: {exc}"))
    if claimed is not None:
        checks.append(claim_check(claimed, epsilons))
    checks += list(extra)
    bound = upper_bound(epsilons) if epsilons else None  # None: not accountable
    return {"format": FORMAT, "decision": decision(checks),
            "target": {"epsilon": p.epsilon, "delta": p.delta}, "epsilon_upper_bound": bound,
            "epsilons": epsilons, "accountants_note": note, "training_records": n, "checks": checks,
            "statement": statement or {"adjacency": "not stated: the privacy plan could not be recomputed",
                                       "noise": "not stated", "assumptions": [], "accounts": [], "unprotected": None}}


def decision(checks: list[dict]) -> str:
    """passed when no check failed: an inconclusive check (``passed`` None, ``verdict`` inconclusive: the
    empirical audit could not have failed) neither passes nor fails the release, and the report says so."""
    return "passed" if all(c["passed"] or protocol.inconclusive(c) for c in checks) else "failed"


def _shown(check: dict) -> str:
    return "**inconclusive**" if protocol.inconclusive(check) else "yes" if check["passed"] else "**no**"


def markdown(report: dict) -> str:
    claimed = report.get("claimed") or {}
    measured = report.get("empirical") or {}
    lines = [f"# Privacy audit: {report['decision'].upper()}"
             + (f" (empirical audit {measured['verdict']})" if measured.get("verdict") else ""), "",
             f"Target (ε, δ) = ({report['target']['epsilon']:g}, {report['target']['delta']:g}); "
             f"recomputed upper bound ε ≤ {_num(report['epsilon_upper_bound'])} "
             f"(the trainer claimed {_num(claimed.get('epsilon'))} with {claimed.get('accountant')}, "
             "compared but not used for the decision).", ""]
    if report.get("epsilons"):
        lines += ["| accountant | ε |", "|---|---|"]
        lines += [f"| {k} | {_fmt_eps(k, v)} |" for k, v in report["epsilons"].items()]
        lines += ["", report.get("accountants_note") or "", ""]
    lines += statement_markdown(report["statement"], delta=report["target"]["delta"])
    lines += [f"Generator sha256: `{report['generator']['sha256']}`", "", "## Checks", ""]
    lines += [check_line(c) for c in report["checks"]]
    lines += ["", *trace_markdown((report.get("trace") or {}).get("events"))]
    return "\n".join(lines) + "\n" + empirical_report.markdown(report.get("empirical"))


# What a passed check established, in plain words (a failed one shows its detail: why it failed).
PLAIN = {
    "trace_sha256": "the trace is the file the train stage recorded (its sha256 is the one in the train manifest)",
    "generator_sha256": "the generator is the file the train stage recorded (its sha256 is the one in the train manifest)",
    "generator_trace": "the generator file is bound to this trace (it records the trace's sha256 and step count)",
    "sampling": "every event's sampling matches the adjacency its accountant assumes",
    "accounting": "the accounting is sound (not a paper's own account reproduced for comparison)",
    "plan": "the trace is exactly the privacy plan recomputed from the configuration and n (the trace is below)",
}


def check_line(c: dict) -> str:
    """One check as one line of plain words: what it established, or why it failed."""
    name = c["name"]
    plain = PLAIN.get(name)
    if protocol.inconclusive(c):
        return f"- ? **inconclusive** — {name}: {' '.join(str(c['detail']).split())}"
    text = plain if c["passed"] and plain else " ".join(str(c["detail"]).split())
    return f"- {'✔ passed' if c['passed'] else '✘ **FAILED**'} — {name}: {text}"


def trace_markdown(events: list[dict] | None) -> list[str]:
    """The audited mechanism trace as its own section: one row per event."""
    if not events:
        return []
    lines = ["## The mechanism trace", "", "| # | sampling | adjacency | q | σ | count |", "|---|---|---|---|---|---|"]
    lines += [f"| {i} | {e['sampling']} | {e['sensitivity']} | {e['sample_rate']:.6g} | {e['noise_multiplier']:.6g} "
              f"| {e['count']} |" for i, e in enumerate(events)]
    return lines + ["", f"{sum(e['count'] for e in events)} private steps in {len(events)} event(s).", ""]


def statement_markdown(st: dict, *, delta: float) -> list[str]:
    """The statement of what the ε means, as audit.md shows it."""
    lines = ["## What this ε means", "", f"**Adjacency.** {st['adjacency']}", "", f"**Noise (σ convention).** {st['noise']}", ""]
    lines += [f"**Assumption.** {a}" for a in st.get("assumptions") or []]
    for acc in st.get("accounts") or []:
        lines += ["", f"**Against {acc['against']}:** ε ≤ {_num(acc['epsilon'])} at δ = {acc['delta']:g} ({acc['how']})."]
    if st.get("unprotected"):
        lines += ["", f"**UNPROTECTED RECORDS.** {st['unprotected']}"]
    return lines + [""]


def statement_tags(st: dict) -> dict[str, str]:
    """The statement as MLflow tags (values cut to MLflow's 5000 characters)."""
    tags = {TAG_ADJACENCY: st["adjacency"], TAG_ASSUMPTIONS: " | ".join(st.get("assumptions") or []) or "none"}
    accounts = [f"against {a['against']}: ε ≤ {_num(a['epsilon'])} at δ = {a['delta']:g}" for a in st.get("accounts") or []]
    if accounts:
        tags[TAG_ASSUMPTIONS] += " | other accounts: " + "; ".join(accounts)
    if st.get("unprotected"):
        tags[TAG_UNPROTECTED] = st["unprotected"]
    return {k: v[:5000] for k, v in tags.items()}


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


def _trace_events(trace_text: str) -> list[dict] | None:
    try:
        return [e.to_dict() for e in MechanismTrace.from_json(trace_text).events]
    except DpsynthError:
        return None


def _tag_runs(ctx: protocol.StageContext, run_ids: list[str | None], decision: str, statement: dict) -> None:
    """``dpsynth.audit`` = the decision, and the statement's tags, on the runs the audit judged (train, parent)."""
    for rid in dict.fromkeys(r for r in run_ids if r):
        tracking.log_run(None, tags={tracking.TAG_AUDIT: decision, **statement_tags(statement)}, run_id=rid,
                         tracking_uri=ctx.tracking_uri)


def run(ctx: protocol.StageContext) -> protocol.Outcome:
    cfg = ctx.cfg
    partition, partition_entry = protocol.upstream(ctx, "partition")
    trained, train_entry = protocol.upstream(ctx, "train")
    recorded = {role: manifest.output(trained, role) for role in ("trace", "generator")}
    current = {role: ctx.entry(item["uri"], role=role) for role, item in recorded.items()}
    inputs = [partition_entry, train_entry, *current.values()]
    fp = protocol.fingerprint(cfg, SECTIONS)
    if (reused := protocol.reuse(ctx, STAGE, fingerprint=fp, inputs=inputs)) is not None:
        return reused
    integrity = [_check(f"{role}_sha256", current[role]["sha256"] == recorded[role]["sha256"],
                        f"{current[role]['uri']}: its sha256 "  # neither hash: the detail reaches stderr (#52 item 3)
                        + ("is the one the train manifest records" if current[role]["sha256"] == recorded[role]["sha256"]
                           else "differs from the one the train manifest records (the file changed after training)"))
                 for role in recorded]
    n = sum(s["rows"] for s in manifest.outputs(partition, "shard"))
    trace_text = storage.read_bytes(recorded["trace"]["uri"]).decode()
    try:
        bound = generator_privacy(current["generator"]["uri"])
    except Exception:  # noqa: BLE001 — not a generator file: the check fails
        bound = None
    integrity.append(generator_trace_check(bound, trace_text))
    claimed = {k: trained["privacy"].get(k) for k in ("epsilon", "accountant")}
    result_items = manifest.outputs(trained, "result")
    marks = (trained["privacy"], trained.get("details") or {},
             _json_or_empty(result_items[0]["uri"] if result_items else None))
    train_run = trained.get("mlflow_run_id")
    extra = [mlflow_check(cfg, tracking_uri=ctx.tracking_uri if cfg.tracking.enabled else None,
                          run_ids=[train_run] if train_run else [], parent_run_id=ctx.parent_run_id),
             mlflow_values_check(ctx, run_ids=[train_run] if train_run else [], parent_run_id=ctx.parent_run_id)]
    # the empirical audit (audit.empirical, on by default): ε_lower from canaries on public stand-ins; its checks
    measured = empirical.stage_audit(cfg, partition)
    extra += measured.pop("checks") if measured else []
    report = evaluate(cfg, trace_text=trace_text, n=n,
                      integrity=integrity, claimed=claimed, marks=marks, extra=extra)
    report["generator"] = {"uri": current["generator"]["uri"], "sha256": current["generator"]["sha256"]}
    report["trace"] = {"uri": recorded["trace"]["uri"], "sha256": hashlib.sha256(trace_text.encode()).hexdigest(),
                       "events": _trace_events(trace_text)}
    report["claimed"] = claimed
    report["empirical"] = measured
    report["runs"] = {"train": train_run, "parent": ctx.parent_run_id, "pipeline_run_id": ctx.pipeline_run_id}
    status = "succeeded" if report["decision"] == "passed" else "failed"
    with protocol.child_run(ctx, STAGE) as run:
        storage.write_text(ctx.uri(STAGE, "audit.json"), json.dumps(report, indent=2) + "\n")
        # rendered from the gate's view: the sample stage copies this page into the release zone as it is
        storage.write_text(ctx.uri(STAGE, "audit.md"), markdown(egress.let_out(report, "audit")))
        if run is not None:
            import mlflow

            metrics = {"target_epsilon": cfg.privacy.epsilon}
            if report["epsilons"]:
                e = report["epsilons"]
                metrics["epsilon_upper_bound"] = report["epsilon_upper_bound"]
                metrics.update({f"epsilon_{k}": v for k, v in e.items() if not isinstance(v, dict)})
                if "prv" in e:
                    metrics["epsilon_prv_upper"] = e["prv"]["upper"]
                    if "lower" in e["prv"]:
                        metrics["epsilon_prv_lower"] = e["prv"]["lower"]
            tracking.log_run(MLFLOW_KEYS, metrics=metrics,
                             tags={tracking.TAG_AUDIT: report["decision"], **statement_tags(report["statement"])})
            empirical_report.log_mlflow(measured, tracking_uri=ctx.tracking_uri, also=[ctx.parent_run_id])
            # the MLflow copy: through the egress gate (dpsynth.egress.AUDIT: the generator's and the trace's hashes
            # keyed, a field it does not name dropped); a raw hash a check's text might quote is keyed too
            view = egress.let_out(report, "audit", key=protocol.key_of(ctx))
            hidden = {*sensitive_hashes(ctx), current["generator"]["sha256"], report["trace"]["sha256"]}
            mlflow.log_text(outside_text(ctx, markdown(view), hidden), "audit.md")
            mlflow.log_text(outside_text(ctx, json.dumps(view, indent=2, sort_keys=True), hidden), "audit.json")
            _tag_runs(ctx, [train_run, ctx.parent_run_id], report["decision"], report["statement"])
        outputs = [ctx.entry(ctx.uri(STAGE, "audit.json"), role="report"),
                   ctx.entry(ctx.uri(STAGE, "audit.md"), role="report_markdown")]
        privacy = {**manifest.no_privacy(delta=cfg.privacy.delta, note="recomputes ε; touches no data"),
                   "accountant": "+".join(report["epsilons"]) if report["epsilons"] else "none"}
        outcome = protocol.finish(ctx, STAGE, run, status=status, fingerprint=fp, inputs=inputs, outputs=outputs,
                                dataset_sha256=partition["dataset_sha256"], privacy=privacy,
                                details={"decision": report["decision"], "epsilon_upper_bound": report["epsilon_upper_bound"],
                                         "epsilon_lower": measured["epsilon_lower"] if measured else None,
                                         "empirical": measured["verdict"] if measured else "not run"})
        if status == "failed":
            failed = "; ".join(f"{c['name']}: {c['detail']}" for c in report["checks"] if c["passed"] is False)
            raise AuditFailed(f"audit failed, nothing may be released ({failed}); report: {ctx.uri(STAGE, 'audit.md')}")
        return outcome
