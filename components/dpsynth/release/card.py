"""The auditor's release card: one page per pipeline run saying what was released, under what guarantee,
how much of the population's budget it used, and how to re-verify every number.

Written by ``dpsynth pipeline finish`` (every orchestrator's last step: local, Airflow, KFP), after
evaluate, so it is the one writer and sees the utility report. From the files alone — the audit report,
the stage manifests, the trace, the evaluation report — and the lifetime ledger:

* a *passed* audit and a release (the sample manifest) give ``RUN_DIR/release/card/``: ``card.html``
  (rendered from ``templates/card.html.j2``), ``card.pdf`` (headless Chromium, when installed),
  ``trace.json`` (the audited mechanism trace: the plan recomputed from the config and n, so it is
  public once the audit passed; ``dpsynth release verify`` recomputes ε from it), ``SHA256SUMS``
  (every released file), ``card.json`` (the card's manifest: every number the page shows and every
  file's sha256) and, when ``$DPSYNTH_SIGNING_KEY`` names an ed25519 private key (PEM),
  ``card.json.sig``, a detached signature of ``card.json``, with ``signing-key.pub.pem``;
  the card is logged to the MLflow parent run (``card/``) and to the registered model version's
  logged model (``release_card/``, its URI and sha256 as version tags);
* a *failed* audit gives ``RUN_DIR/sensitive/card/card.html`` and ``card.json`` saying REFUSED and
  why: the sensitive zone only, never the release zone or MLflow.

Nothing is written when the audit did not run, or passed but nothing was released.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from dpsynth import commands, egress, storage, tracking
from dpsynth.errors import DpsynthError
from dpsynth.stages import protocol, manifest

log = logging.getLogger(__name__)

FORMAT = "dpsynth.release_card/1"
DIR = "card"  # RUN_DIR/release/card/ (released) or RUN_DIR/sensitive/card/ (refused)
SIGNING_KEY_ENV = "DPSYNTH_SIGNING_KEY"  # path of an ed25519 private key, PEM (PKCS#8, unencrypted)
SIGNED = "card.json"
UNSIGNED = (SIGNED, "card.json.sig", "signing-key.pub.pem", "SHA256SUMS")  # not listed in card.json's files
OUTSIDE_GUARANTEE = (
    "the choice of the recipe and its hyperparameters, when they were tuned on this data (the search is not accounted)",
    "the utility and quality metrics: exact statistics of held-out real records, not covered by (ε, δ)",
)
LABELS_PUBLIC = ("the number of training records n and the set of class labels ({k} classes) are treated as public: "
                 "the sampling rate q = B/n and the class-conditional generator depend on them")


def chromium() -> str | None:
    """The headless browser that prints the PDF (and the tests' screenshots), when installed."""
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


# --- what the card says ----------------------------------------------------------------------------


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _size(uri: str) -> int:
    return len(storage.read_bytes(uri))


def _manifest_or_none(ctx: protocol.StageContext, stage: str) -> dict | None:
    uri = ctx.manifest_uri(stage)
    return manifest.read(uri) if storage.exists(uri) else None


def events(trace, delta: float) -> list[dict]:
    """Each event of the trace with what it is and its own ε (alone, at δ): the events before the last are the
    warm-up's releases, the last the training steps (a passed audit's trace is its plan: prefix, then steps)."""
    from dpsynth.privacy import MechanismTrace, get_accountant
    from dpsynth.stages.audit import accountants_for

    rows = []
    for i, e in enumerate(trace.events):
        alone = MechanismTrace([e])
        name = (accountants_for(alone) or ("rdp",))[0]
        last = i == len(trace.events) - 1
        what = "training steps" if last else f"warm-up release{'s' if e.count > 1 else ''} (event {i + 1})"
        rows.append({"what": what, "sampling": e.sampling,
                     "adjacency": e.sensitivity, "sample_rate": e.sample_rate, "noise_multiplier": e.noise_multiplier,
                     "count": e.count, "epsilon_alone": get_accountant(name).epsilon(alone, delta=delta),
                     "accountant": name})
    return rows


def ledger_facts(ctx: protocol.StageContext, *, population_id: str, train_run_id: str | None) -> dict:
    """The population's lifetime ledger around the training run that made this release (``train_run_id``: the
    pipeline run whose train attempts are charged for it)."""
    from dpsynth.ledger import charging

    ledger = charging.run_ledger(ctx)
    history = ledger.history(population_id)
    mine = [r for r in history if r["pipeline_run_id"] == train_run_id]
    first = min((r["id"] for r in mine), default=None)

    def charged(r):
        return r["epsilon_spent"] if r["status"] == "committed" else r["epsilon_reserved"] if r["status"] == "reserved" else 0.0

    before = [r for r in history if first is None or r["id"] < first]
    since = [r for r in history if first is not None and r["id"] > first and r["pipeline_run_id"] != train_run_id]
    balance = ledger.balance(population_id)
    statuses = {}
    for r in history:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    return {"population_id": population_id, "budget": balance["budget"], "delta_budget": balance["delta"],
            "committed_before": sum(charged(r) for r in before if r["status"] == "committed"),
            "this_run": sum(charged(r) for r in mine), "charged_since": sum(charged(r) for r in since),
            "reserved_open": balance["reserved"], "remaining": balance["remaining"], "committed": balance["committed"],
            "attempts": [{"id": r["id"], "status": r["status"], "epsilon_reserved": r["epsilon_reserved"],
                          "epsilon_spent": r["epsilon_spent"], "note": r.get("note") or "", "stage": r["stage"],
                          "created_at": str(r["created_at"]), "blocks": r.get("blocks", [0]),
                          "resumes_id": r.get("resumes_id")} for r in mine],
            "lifetime_attempts": len(history), "lifetime_by_status": statuses,
            "pipeline_run_id": train_run_id, "blocks": _block_facts(mine, before, balance, charged)}


def _block_facts(mine: list[dict], before: list[dict], balance: dict, charged) -> list[dict]:
    """Per privacy block this run read (#54): ε this run charged it, ε committed on it before, and what is left."""
    now = {b["block"]: b for b in balance["blocks"]}
    return [{"block": b, "this_run": sum(charged(r) for r in mine if b in r.get("blocks", [0])),
             "committed_before": sum(charged(r) for r in before if r["status"] == "committed" and b in r.get("blocks", [0])),
             "remaining": now[b]["remaining"] if b in now else balance["budget"]}
            for b in sorted({b for r in mine for b in r.get("blocks", [0])})]


def utility_facts(report: dict | None) -> dict | None:
    if not report:
        return None
    u, q = report["utility"], report["quality"]
    return {"classifiers": [{"name": c["classifier"], "gen2real": c.get("gen2real"), "real": c.get("real")}
                            for c in u["classifiers"]],
            "records": u.get("records", {}), "frechet": {"name": q["frechet"]["name"], "value": q["frechet"]["value"],
                                                         "floor": q["frechet"]["real_vs_real"]},
            "inception_score": q["inception_score"]["mean"], "reference": report["reference"]["kind"],
            "status": report["reference"]["status"], "note": report.get("heldout_data")}


def public_sources(cfg) -> list[str]:
    d = cfg.data
    found = [f"data.public_source = {d.public_source}"] if d.public_source else []
    found += [f"data.public_split = {d.public_split}"] if d.public_split else []
    found += [f"data.public_fraction = {d.public_fraction} (acknowledged unprotected)"] if d.public_fraction else []
    return found


def facts(ctx: protocol.StageContext, *, release_files: list[dict] | None = None) -> dict | None:
    """Everything the card states, read from the run's files and the ledger; None when there is nothing to state
    (no audit ran, or it passed and nothing was released)."""
    from dpsynth.ledger import charging

    audited = _manifest_or_none(ctx, "audit")
    if audited is None:
        return None
    report = json.loads(storage.read_bytes(manifest.output(audited, "report")["uri"]))
    sampled = _manifest_or_none(ctx, "sample")
    refused = report["decision"] != "passed"
    if not refused and (sampled is None or sampled["status"] != "succeeded"):
        return None
    trained = _manifest_or_none(ctx, "train") or {}
    stages = []
    for stage in protocol.STAGES:
        m = _manifest_or_none(ctx, stage)
        stages.append({"stage": stage, "zone": protocol.ZONE[stage], "status": m["status"] if m else "not run",
                       "epsilon": m["privacy"]["epsilon"] if m else None,
                       "mlflow_run_id": (m or {}).get("mlflow_run_id"),
                       "code_version": (m or {}).get("code_version"), "image": (m or {}).get("image")})
    target = report["target"]
    out = {
        "format": FORMAT, "decision": "refused" if refused else "released",
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "pipeline_run_id": ctx.pipeline_run_id, "parent_run_id": ctx.parent_run_id,
        "method": ctx.cfg.train.method, **tracking.lineage(),  # code_version, git_sha, image (this process's)
        "dataset_version": audited["dataset_sha256"], "stages": stages,
        "target": target, "epsilon": report["epsilon_upper_bound"], "delta": target["delta"],
        "epsilons": report.get("epsilons"), "accountants_note": report.get("accountants_note"),
        "statement": report.get("statement"), "training_records": report.get("training_records"),
        "public": {"n": report.get("training_records"), "sources": public_sources(ctx.cfg),
                   "labels": LABELS_PUBLIC.format(k=((_manifest_or_none(ctx, "partition") or {}).get("details") or {})
                                                  .get("num_classes", "K"))},
        "outside_guarantee": list(OUTSIDE_GUARANTEE),
        "empirical": _empirical(report.get("empirical")),
        "checks": [{"name": c["name"], "passed": c["passed"]} for c in report["checks"]],
        "trace_sha256": report["trace"]["sha256"], "generator_sha256": report["generator"]["sha256"],
    }
    if out["image"] is None:  # this process ran outside a container (or its pod named none): the stages' image
        out["image"] = next((row["image"] for row in stages if row.get("image")), None)
    trace_text = storage.read_bytes(report["trace"]["uri"]).decode() if report.get("trace") else None
    if trace_text is not None and _sha256_bytes(trace_text.encode()) == report["trace"]["sha256"]:
        from dpsynth.privacy import MechanismTrace

        out["events"] = events(MechanismTrace.from_json(trace_text), target["delta"])
    try:
        out["ledger"] = ledger_facts(ctx, population_id=charging.population_id(ctx.cfg),
                                     train_run_id=trained.get("pipeline_run_id") or ctx.pipeline_run_id)
    except DpsynthError as exc:
        out["ledger"] = {"error": str(exc)}
    if refused:
        out["refused_because"] = [f"{c['name']}: {c['detail']}" for c in report["checks"] if c["passed"] is False]
        return egress.let_out(out, "card")
    details = sampled.get("details", {})
    rel = details.get("release", {})
    synthetic = manifest.output(sampled, "synthetic")
    generator = manifest.output(sampled, "generator")
    out["release"] = {
        "generator": {"path": "sample/generator.pt", "sha256": generator["sha256"],
                      "bytes": _size(generator["uri"])},
        "synthetic": {"path": "sample/synthetic.parquet", "sha256": synthetic["sha256"],
                      "bytes": _size(synthetic["uri"]), "rows": synthetic.get("rows")},
        "registered_model": rel.get("registered_model"), "num_classes": details.get("num_classes"),
    }
    evaluated = _manifest_or_none(ctx, "evaluate")
    report_items = manifest.outputs(evaluated, "report") if evaluated and evaluated["status"] == "succeeded" else []
    out["utility"] = utility_facts(json.loads(storage.read_bytes(report_items[0]["uri"])) if report_items else None)
    out["files"] = release_files or []
    return egress.let_out(out, "card")  # the card states only what the egress gate lets out (dpsynth.egress.CARD)


def _empirical(measured: dict | None) -> dict | None:
    if not measured:
        return None
    return {"epsilon_lower": measured.get("epsilon_lower"), "canaries": measured.get("canaries"),
            "confidence": measured.get("confidence"), "mode": measured.get("mode"),
            "verdict": measured.get("verdict"),
            "parts": [{"name": c.get("name"), "verdict": c.get("verdict"), "epsilon_lower": c.get("epsilon_lower"),
                       "accounted_epsilon": c.get("accounted_epsilon")} for c in measured.get("components") or []]}


# --- the page ----------------------------------------------------------------------------------------


def render(card: dict, *, grid_png: bytes | None = None, release_dir: str = "RELEASE_DIR",
           signed_by: str | None = None) -> str:
    """The card as one HTML page (Jinja2, autoescaped), the grid embedded."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("dpsynth.release", "templates"),
                             autoescape=jinja2.select_autoescape(("html", "j2")), undefined=jinja2.StrictUndefined)
    env.filters["num"] = lambda x, p=4: "—" if not isinstance(x, (int, float)) else f"{x:.{p}g}"
    env.filters["short"] = lambda s, n=12: (s or "")[:n]
    grid = base64.b64encode(grid_png).decode() if grid_png else None
    local = release_dir if not storage.is_remote(release_dir) else "RELEASE_DIR"  # sha256sum needs a local copy
    verify = [commands.dpsynth("release", "verify", release_dir) + (" --public-key PUBLISHED_KEY.pem" if signed_by else ""),
              f"cd {local} && sha256sum -c card/SHA256SUMS" + (f"   # RELEASE_DIR: a copy of {release_dir}" if local != release_dir else "")]
    if signed_by:
        verify.append(f"openssl pkeyutl -verify -pubin -inkey PUBLISHED_KEY.pem -rawin -in {local}/card/card.json "
                      f"-sigfile {local}/card/card.json.sig")
    return env.get_template("card.html.j2").render(card=card, grid=grid, verify=verify, signed_by=signed_by,
                                                   lineage=lineage(card))


def lineage(card: dict) -> list[dict]:
    """The boxes of the lineage picture: the dataset version, each stage, the release (or the refusal)."""
    boxes = [{"title": "dataset", "line": f"version {card['dataset_version'][:8]}…", "zone": "sensitive",
              "status": "input"}]
    for s in card["stages"]:
        eps = "ε ?" if s["epsilon"] is None else f"ε {s['epsilon']:.4g}"
        boxes.append({"title": s["stage"], "line": f"{s['status']}, {eps}", "zone": s["zone"], "status": s["status"]})
    boxes.append({"title": "release" if card["decision"] == "released" else "REFUSED",
                  "line": f"ε ≤ {card['epsilon']:.4g}" if isinstance(card["epsilon"], (int, float)) else "no ε",
                  "zone": "release" if card["decision"] == "released" else "sensitive", "status": card["decision"]})
    return boxes


# --- writing it ----------------------------------------------------------------------------------------


def signing_key():
    """The ed25519 private key ``$DPSYNTH_SIGNING_KEY`` names; None when unset; DpsynthError when unusable."""
    path = os.environ.get(SIGNING_KEY_ENV)
    if not path:
        return None
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise DpsynthError(f"${SIGNING_KEY_ENV}: cannot read an unencrypted PEM private key from {path} ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise DpsynthError(f"${SIGNING_KEY_ENV}: {path} is not an ed25519 key")
    return key


def public_pem(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def pdf(html: str) -> bytes | None:
    """The page printed to PDF by headless Chromium; None (and a log line) when Chromium is absent or fails."""
    browser = chromium()
    if browser is None:
        log.warning("release card: no PDF (Chromium is not installed: apt-get install chromium)")
        return None
    with tempfile.TemporaryDirectory() as tmp:
        page, out = Path(tmp) / "card.html", Path(tmp) / "card.pdf"
        page.write_text(html)
        try:
            subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-pdf-header-footer",
                            f"--user-data-dir={tmp}/profile", f"--print-to-pdf={out}", page.as_uri()],
                           capture_output=True, timeout=120, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("release card: no PDF (Chromium failed: %s)", exc)
            return None
        if not out.exists() or out.stat().st_size == 0:
            log.warning("release card: no PDF (Chromium wrote none)")
            return None
        return out.read_bytes()


def _release_files(ctx: protocol.StageContext) -> list[dict]:
    """Every file the sample and evaluate manifests list in the release zone, manifests included, checked."""
    root = ctx.zones.release
    found = []
    for stage in ("sample", "evaluate"):
        m = _manifest_or_none(ctx, stage)
        if m is None or m["status"] != "succeeded":
            continue
        for item in m["outputs"]:
            manifest.verify(item)
        for uri in [*(o["uri"] for o in m["outputs"]), ctx.manifest_uri(stage)]:
            found.append({"path": uri[len(root) + 1:], "sha256": storage.sha256(uri), "bytes": _size(uri)})
    return found


def write(ctx: protocol.StageContext) -> str | None:
    """Write the run's card (see the module's docstring); returns its URI, or None when there is nothing to state."""
    card = facts(ctx)
    if card is None:
        return None
    if card["decision"] == "refused":  # the sensitive zone only
        where = storage.join(ctx.zones.sensitive, DIR)
        storage.write_text(storage.join(where, "card.json"), json.dumps(card, indent=2) + "\n")
        storage.write_text(storage.join(where, "card.html"), render(card))
        log.info("release card: REFUSED, written to %s (sensitive zone)", where)
        return storage.join(where, "card.html")
    where = storage.join(ctx.zones.release, DIR)
    audited = manifest.read(ctx.manifest_uri("audit"))
    report = json.loads(storage.read_bytes(manifest.output(audited, "report")["uri"]))
    trace_bytes = storage.read_bytes(report["trace"]["uri"])
    if _sha256_bytes(trace_bytes) != report["trace"]["sha256"]:
        raise DpsynthError(f"{report['trace']['uri']}: not the audited trace (sha256 differs); no card written")
    key = signing_key()
    sampled = manifest.read(ctx.manifest_uri("sample"))
    grid_png = storage.read_bytes(manifest.output(sampled, "grid")["uri"])
    files = _release_files(ctx) + [{"path": f"{DIR}/trace.json", "sha256": _sha256_bytes(trace_bytes),
                                    "bytes": len(trace_bytes)}]
    card = facts(ctx, release_files=files)
    fingerprint = _sha256_bytes(public_pem(key)) if key is not None else None
    html = render(card, grid_png=grid_png, release_dir=ctx.zones.release, signed_by=fingerprint)
    files.append({"path": f"{DIR}/card.html", "sha256": _sha256_bytes(html.encode()), "bytes": len(html.encode())})
    printed = pdf(html)  # everything is computed before the first write
    if printed is not None:
        files.append({"path": f"{DIR}/card.pdf", "sha256": _sha256_bytes(printed), "bytes": len(printed)})
    card["pdf"] = "written" if printed is not None else "not written: Chromium is not installed"
    card["signing_key_sha256"] = fingerprint
    signed = (json.dumps(card, indent=2, sort_keys=True) + "\n").encode()
    storage.write_bytes(storage.join(where, "trace.json"), trace_bytes)
    storage.write_text(storage.join(where, "card.html"), html)
    if printed is not None:
        storage.write_bytes(storage.join(where, "card.pdf"), printed)
    elif storage.exists(storage.join(where, "card.pdf")):
        storage.delete(storage.join(where, "card.pdf"))  # an older card's PDF would no longer match
    storage.write_text(storage.join(where, "SHA256SUMS"), "".join(f"{f['sha256']}  {f['path']}\n" for f in files))
    for stale in ("card.json.sig", "signing-key.pub.pem"):
        if key is None and storage.exists(storage.join(where, stale)):
            storage.delete(storage.join(where, stale))
    storage.write_bytes(storage.join(where, SIGNED), signed)
    if key is not None:
        storage.write_bytes(storage.join(where, "card.json.sig"), key.sign(signed))
        storage.write_bytes(storage.join(where, "signing-key.pub.pem"), public_pem(key))
    log.info("release card: written to %s%s", where, "" if key is None else f", signed (key {fingerprint[:12]}…)")
    if ctx.parent_run_id and ctx.cfg.tracking.enabled:
        _log_mlflow(ctx, card, where, html_sha256=_sha256_bytes(html.encode()))
    return storage.join(where, "card.html")


def _log_mlflow(ctx: protocol.StageContext, card: dict, where: str, *, html_sha256: str) -> None:
    """The card's files under ``card/`` of the parent run, and under ``release_card/`` of the registered model
    version's logged model, with the card's URI and sha256 as version tags."""
    from mlflow import MlflowClient

    client = MlflowClient(ctx.tracking_uri)
    with tempfile.TemporaryDirectory() as tmp:
        for uri in storage.list_uris(where):
            (Path(tmp) / uri.rsplit("/", 1)[-1]).write_bytes(storage.read_bytes(uri))
        client.log_artifacts(ctx.parent_run_id, tmp, DIR)
        reg = (card.get("release") or {}).get("registered_model")
        if reg:
            version = client.get_model_version(reg["name"], reg["version"])
            source = version.source or ""
            model_id = getattr(version, "model_id", None) or (source[len("models:/"):] if source.startswith("models:/") else None)
            if model_id:  # the logged model behind the version: its artifacts show on the version's page
                client.log_model_artifacts(model_id, tmp, "release_card")
            tracking.tag_version(reg["name"], reg["version"], tracking_uri=ctx.tracking_uri, tags={
                TAG_CARD: f"runs:/{ctx.parent_run_id}/{DIR}/card.html", TAG_CARD_SHA256: html_sha256})
    tracking.log_run(None, tags={TAG_CARD: f"runs:/{ctx.parent_run_id}/{DIR}/card.html"}, run_id=ctx.parent_run_id,
                     tracking_uri=ctx.tracking_uri)


TAG_CARD = "dpsynth.release_card"
TAG_CARD_SHA256 = "dpsynth.release_card_sha256"


# --- checking it -----------------------------------------------------------------------------------------


def verify(release_dir: str, *, public_key: str | None = None) -> list[dict]:
    """The auditor's checks of a release directory (``RUN_DIR/release``), from its files alone: every file the
    card lists has its sha256 and nothing else was released; the trace is the audited one and the one the
    generator file is bound to; ε recomputed from the trace by every applicable accountant equals the card's and
    the audit report's and stays within the target; the signature of ``card.json`` verifies with ``public_key``
    (a PEM file) when given. Returns ``[{"name", "passed", "detail"}]``."""
    from dpsynth.training.artifacts import generator_privacy
    from dpsynth.privacy import MechanismTrace
    from dpsynth.stages.audit import recompute, upper_bound

    root = str(release_dir).rstrip("/")
    checks: list[dict] = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append({"name": name, "passed": bool(ok), "detail": detail})

    signed_uri = storage.join(root, DIR, SIGNED)
    if not storage.exists(signed_uri):
        raise DpsynthError(f"RELEASE_DIR: {signed_uri} not found: is {root} a release directory (RUN_DIR/release)?")
    signed = storage.read_bytes(signed_uri)
    card = json.loads(signed)
    listed = {f["path"]: f for f in card.get("files", [])}
    for path, f in listed.items():
        uri = storage.join(root, path)
        actual = storage.sha256(uri) if storage.exists(uri) else None
        check(f"sha256 {path}", actual == f["sha256"],
              f"{actual} (card: {f['sha256']})" if actual else f"missing (card: {f['sha256']})")
    unlisted = [u[len(root) + 1:] for u in storage.list_uris(root)
                if u[len(root) + 1:] not in listed and u[len(root) + 1:] not in {f"{DIR}/{n}" for n in UNSIGNED}]
    check("nothing unlisted", not unlisted, "every file in the release directory is listed on the card" if not unlisted
          else f"files the card does not list: {', '.join(unlisted)}")
    trace_text = storage.read_bytes(storage.join(root, DIR, "trace.json")).decode()
    trace_sha = _sha256_bytes(trace_text.encode())
    audit = json.loads(storage.read_bytes(storage.join(root, "sample", "audit.json")))
    check("trace is the audited one", trace_sha == audit["trace"]["sha256"] == card["trace_sha256"],
          f"trace.json sha256 {trace_sha}; audit report {audit['trace']['sha256']}; card {card['trace_sha256']}")
    try:
        bound = generator_privacy(storage.join(root, "sample", "generator.pt")).get("trace_sha256")
    except Exception as exc:  # noqa: BLE001 — not a generator file: the check fails
        bound = f"unreadable ({exc})"
    check("generator bound to the trace", bound == trace_sha, f"the generator file records trace sha256 {bound}")
    delta, target = card["delta"], card["target"]["epsilon"]
    again = recompute(MechanismTrace.from_json(trace_text), delta=delta)
    for name, value in again.items():
        mine = value["upper"] if isinstance(value, dict) else value
        tol = value["eps_error"] if isinstance(value, dict) else 1e-9 * max(abs(mine), 1e-12)
        stated = [(card.get("epsilons") or {}).get(name), (audit.get("epsilons") or {}).get(name)]
        stated = [s["upper"] if isinstance(s, dict) else s for s in stated]
        ok = all(isinstance(s, (int, float)) and abs(s - mine) <= tol for s in stated)
        within = mine <= target * (1 + 1e-9) + (value["eps_error"] if isinstance(value, dict) else 0)
        check(f"epsilon {name}", ok and within, f"recomputed from trace.json at δ = {delta:g}: {mine:.6g} (± {tol:.2g}); "
              f"card {stated[0]}, audit report {stated[1]}; target {target:g}")
    # the headline ε (the card's "epsilon", the audit report's upper bound) is the largest recomputed bound: a card
    # whose headline was edited fails here even unsigned (#52 item 9)
    if again:
        bound = upper_bound(again)
        tol = max(v["eps_error"] if isinstance(v, dict) else 1e-9 * max(abs(v), 1e-12) for v in again.values())
        headline = [card.get("epsilon"), audit.get("epsilon_upper_bound")]
        check("headline epsilon", all(isinstance(h, (int, float)) and abs(h - bound) <= tol for h in headline),
              f"the largest bound recomputed from trace.json: {bound:.6g} (± {tol:.2g}); card's headline "
              f"{headline[0]}, audit report's {headline[1]}")
    if isinstance(card.get("ledger"), dict) and card["ledger"].get("blocks"):
        check("epsilon per privacy block", *_block_charges_check(card["ledger"], MechanismTrace.from_json(trace_text),
                                                                delta))
    sig_uri = storage.join(root, DIR, "card.json.sig")
    if public_key is not None:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization

        try:
            key = serialization.load_pem_public_key(Path(public_key).read_bytes())
            key.verify(storage.read_bytes(sig_uri), signed)
            check("signature", True, f"card.json is signed by the key in {public_key}")
        except FileNotFoundError as exc:
            check("signature", False, f"cannot check the signature: {exc.filename} is missing")
        except (InvalidSignature, ValueError, TypeError, AttributeError) as exc:
            check("signature", False, f"card.json.sig does not verify with {public_key} ({type(exc).__name__})")
    return checks


# the note of an attempt committed at its trace's ε (dpsynth.ledger.attempt.Attempt.commit): its accountant, last
CHARGED_BY = re.compile(r"private steps(?: added to the \d+ of reservation \d+'s checkpoint)?, ε by (\w+)$")


def _block_charges_check(ledger: dict, trace, delta: float) -> tuple[bool, str]:
    """The ε the card says this run charged each privacy block it read (#54), recomputed: per block, the sum over the
    run's attempts that read it of each one's charge, where the attempt that committed the released trace is charged
    that trace's ε, recomputed by the accountant it was charged by (a resumed one, at least the ε its steps add:
    the chain it continues is listed too), a released attempt nothing, and any other what the ledger recorded (a
    whole reservation). A card whose per-block figure, or the charge of the attempt behind the trace, was edited
    fails; so does one whose blocks are not the ones its attempts read."""
    from dpsynth.privacy import get_accountant

    attempts = ledger.get("attempts") or []
    final = next((a for a in reversed(attempts) if a.get("status") == "committed"
                  and CHARGED_BY.search(a.get("note") or "")), None)
    if final is None:
        return False, "no attempt of this run committed the released trace's ε (the card lists no such charge)"
    name = CHARGED_BY.search(final["note"]).group(1)
    try:
        from_trace = get_accountant(name).epsilon(trace, delta=delta) if trace.steps else 0.0
    except Exception as exc:  # noqa: BLE001 — an accountant the trace does not fit: the check fails
        return False, f"the released trace's ε cannot be recomputed by {name!r}: {exc}"
    tol = 1e-6 * max(abs(from_trace), 1.0)
    resumed = final.get("resumes_id") is not None
    spent = final["epsilon_spent"]
    final_ok = isinstance(spent, (int, float)) and (spent <= from_trace + tol if resumed
                                                    else abs(spent - from_trace) <= tol)

    def charge(a) -> float:
        if a is final and not resumed:
            return from_trace
        return {"committed": a.get("epsilon_spent") or 0.0, "reserved": a.get("epsilon_reserved") or 0.0}.get(
            a.get("status"), 0.0)

    read = sorted({b for a in attempts for b in a.get("blocks", [0])})
    mine = {b: sum(charge(a) for a in attempts if b in a.get("blocks", [0])) for b in read}
    stated = {row.get("block"): row.get("this_run") for row in ledger["blocks"]}
    bad = [b for b in sorted(set(mine) | set(stated), key=str) if not isinstance(stated.get(b), (int, float))
           or b not in mine or abs(stated[b] - mine[b]) > tol]
    if resumed:  # every block the chain read is charged at least the whole trace's ε
        bad += [b for b in read if mine[b] < from_trace - tol and b not in bad]
    detail = (f"recomputed from trace.json by {name} at δ = {delta:g}: ε = {from_trace:.6g} charged to the attempt "
              f"behind it (card: {final['epsilon_spent']}); per block, recomputed "
              + ", ".join(f"{b}: {v:.6g}" for b, v in mine.items()) + "; card "
              + ", ".join(f"{b}: {v}" for b, v in stated.items())
              + (f"; these differ: block {', '.join(map(str, bad))}" if bad else ""))
    return final_ok and not bad, detail


def keygen(private_path: str) -> bytes:
    """A new ed25519 key: the private key (PEM, mode 0600) at ``private_path``; returns the public key (PEM)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = Path(private_path)
    if path.exists():
        raise DpsynthError(f"--out: {path} exists; refusing to overwrite a key")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    return public_pem(key)
