"""What the Privacy ledger page shows, gathered read-only from the ledger, MLflow and the stage manifests.

:func:`gather` returns plain data (also served as JSON); :func:`render` turns it into the HTML page.
Per population: lifetime budget, ε spent (committed), reserved, remaining and δ (the most charged privacy block's),
and with several blocks each block's, with the reservations that charged it. Per pipeline run
charged to it: the ledger's reservations — one per training attempt (a killed attempt and its
resumption, a ``--force`` restart, a retried task: each its own), their ε summed —, ε per stage and the
audit decision from its MLflow runs, and the lineage chain dataset → shards → train run → generator →
synthetic data from its manifests, and the Model Registry version(s) its sample stage registered (linked to
MLflow's model version page). A standalone ``dpsynth train`` (pipeline run id ``train:<dir>``) has
no MLflow pipeline run. A released run links to its release card (``dpsynth.release_card``).

The server keeps one :class:`LedgerView` per (ledger, store) and reads incrementally: each request asks
MLflow only for pipeline runs that started since the newest one it has seen, and re-reads those still
running; a finished run's stage runs, manifests and registered versions are read once and kept (the ledger's
own rows, one SQL query per population, and the registry's aliases, one query, are read on every request:
they change when a later run commits or is released).
"""

from __future__ import annotations

import html
import json
import threading
import urllib.parse
from typing import Any

from dpsynth import egress, storage, tracking

STAGES = ("partition", "pretrain", "train", "audit", "sample", "evaluate")
ZONE = {"partition": "sensitive", "pretrain": "sensitive", "train": "sensitive", "audit": "sensitive",
        "sample": "release", "evaluate": "release"}
TAG_STATUS = "dpsynth.stage_status"
TAG_RUN_DIR = "dpsynth.run_dir"
TAG_CARD = "dpsynth.release_card"  # dpsynth.release.card.TAG_CARD: the card's runs:/ URI on the parent run


def gather(*, ledger_url: str, tracking_uri: str) -> dict[str, Any]:
    """Everything the page shows, read afresh (the server keeps a :class:`LedgerView` instead)."""
    return LedgerView(ledger_url=ledger_url, tracking_uri=tracking_uri).gather()


TERMINAL = ("FINISHED", "FAILED", "KILLED")  # an MLflow run's statuses after which `pipeline finish` wrote nothing more


class LedgerView:
    """The page's data for one ledger and tracking store, read incrementally (see the module docstring)."""

    def __init__(self, *, ledger_url: str, tracking_uri: str) -> None:
        self.ledger_url, self.tracking_uri = ledger_url, tracking_uri
        self._lock = threading.Lock()
        self._parents: dict[str, Any] = {}  # pipeline_run_id -> its parent MLflow run (the latest, should an id repeat)
        self._watermark = 0  # the start time (ms) of the newest parent run read
        self._details: dict[str, tuple[tuple, dict]] = {}  # pipeline_run_id -> (the parent's state, its MLflow part)
        self.details_read = 0  # how many times a run's MLflow part was read (stage runs, manifests, registry)

    def gather(self) -> dict[str, Any]:
        from mlflow import MlflowClient

        from dpsynth.ledger.store import Ledger

        with self._lock:
            ledger = Ledger(self.ledger_url)
            client = MlflowClient(self.tracking_uri)
            self._refresh(client)
            aliases = _aliases(client)
            populations = []
            for pop in ledger.populations():
                by_run: dict[str, list[dict]] = {}
                for res in ledger.history(pop["population_id"]):  # oldest first
                    by_run.setdefault(res["pipeline_run_id"], []).append(res)
                runs = [_run(rows, self._mlflow_part(client, self._parents.get(run_id)), aliases)
                        for run_id, rows in by_run.items()]
                populations.append({**{k: pop[k] for k in ("population_id", "budget", "committed", "reserved",
                                                           "remaining", "delta", "delta_used", "blocks")},
                                    "runs": runs})
            # what the page shows, as JSON and as HTML: through the egress gate (dpsynth.egress.LEDGER_PAGE)
            return egress.let_out({"format": "dpsynth.privacy_ledger/2", "populations": populations}, "ledger page")

    def _refresh(self, client) -> None:
        """Parent runs started since the watermark (every experiment), and those not yet terminal, read again."""
        exps = [e.experiment_id for e in client.search_experiments()]
        query = f"tags.`{tracking.TAG_STAGE}` = 'pipeline' AND attributes.start_time >= {int(self._watermark)}"
        for start in range(0, len(exps), 100):
            for r in client.search_runs(exps[start:start + 100], query, max_results=5000,
                                        order_by=["attributes.start_time ASC"]):
                pid = r.data.tags.get(tracking.TAG_PIPELINE_RUN_ID)
                known = self._parents.get(pid)
                if pid and (known is None or (r.info.start_time or 0) >= (known.info.start_time or 0)):
                    self._parents[pid] = r
                self._watermark = max(self._watermark, r.info.start_time or 0)
        for pid, r in list(self._parents.items()):
            if r.info.status not in TERMINAL:
                self._parents[pid] = client.get_run(r.info.run_id)

    def _mlflow_part(self, client, parent) -> dict | None:
        if parent is None:
            return None
        state = (parent.info.run_id, parent.info.status, parent.info.end_time)
        pid = parent.data.tags.get(tracking.TAG_PIPELINE_RUN_ID)
        cached = self._details.get(pid)
        if cached is not None and cached[0] == state and parent.info.status in TERMINAL:
            return cached[1]
        part = _mlflow_part(client, parent)
        self.details_read += 1
        self._details[pid] = (state, part)
        return part


def _aliases(client) -> dict[tuple[str, str], list[str]]:
    """(model name, version) -> its aliases, over every registered model (one query; {} without a registry)."""
    try:
        models = client.search_registered_models(max_results=1000)
    except Exception:  # a store without the Model Registry
        return {}
    found: dict[tuple[str, str], list[str]] = {}
    for m in models:
        for alias, version in (m.aliases or {}).items():
            found.setdefault((m.name, str(version)), []).append(alias)
    return found


def _charged(res: dict) -> float:
    """What the reservation counts against the budget: an open one its whole reservation."""
    return {"reserved": res["epsilon_reserved"], "committed": res["epsilon_spent"] or 0.0, "released": 0.0}[res["status"]]


def _status(rows: list[dict]) -> str:
    """A pipeline run's ledger status: open while any attempt's reservation is; else committed when any
    attempt was charged; released when every attempt was released (it ran no private step)."""
    statuses = {r["status"] for r in rows}
    return "reserved" if "reserved" in statuses else "committed" if "committed" in statuses else "released"


def _attempt(res: dict) -> dict[str, Any]:
    return {"reservation_id": res["id"], "stage": res["stage"], "status": res["status"],
            "epsilon_reserved": res["epsilon_reserved"], "epsilon_charged": _charged(res), "delta": res["delta"],
            "resumes_id": res.get("resumes_id"), "steps": res.get("steps"), "created_at": res["created_at"],
            "blocks": res.get("blocks", [0]),
            "closed_at": res.get("closed_at"), "note": res.get("note")}


def _run(rows: list[dict], part: dict | None, aliases: dict) -> dict[str, Any]:
    """One pipeline run: its reservations (``rows``, oldest first) and its MLflow part (:func:`_mlflow_part`), if any,
    with the registry's current aliases."""
    attempts = [_attempt(r) for r in rows]
    row = {"pipeline_run_id": rows[0]["pipeline_run_id"], "reservation_ids": [r["id"] for r in rows],
           "attempts": attempts, "status": _status(rows),
           "epsilon_charged": sum(a["epsilon_charged"] for a in attempts),
           "delta": sum(a["delta"] for a in attempts if a["status"] != "released"),
           "dataset_sha256": sorted({r["dataset_sha256"] for r in rows}), "created_at": rows[0]["created_at"],
           "mlflow": None, "lineage": []}
    if part is None:
        return row
    versions = [{**v, "aliases": sorted(aliases.get((v["name"], v["version"]), []))} for v in part["mlflow"]["registered"]]
    row["mlflow"] = {**part["mlflow"], "registered": versions}
    row["lineage"] = [*part["lineage"], *([{"kind": "registered model", "versions": versions}] if versions else [])]
    return row


def _mlflow_part(client, parent) -> dict[str, Any]:
    """What a pipeline run's MLflow runs and manifests say: ε per stage, audit, empirical ε_lower, the release card,
    the registered versions (without aliases: they move) and the lineage chain."""
    children = client.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
                                  max_results=1000, order_by=["attributes.start_time ASC"])
    stages = {}
    for c in children:
        stage = c.data.tags.get(tracking.TAG_STAGE)
        if stage in STAGES:
            eps = c.data.tags.get(tracking.TAG_EPSILON_SPENT)
            stages[stage] = {"run_id": c.info.run_id, "epsilon": float(eps) if eps is not None else None,
                             "status": c.data.tags.get(TAG_STATUS) or c.info.status.lower()}
    tags = parent.data.tags
    recorded = tags.get(tracking.TAG_LEDGER_RESERVATION)  # what `pipeline finish` recorded: "3,4"
    mlflow_part = {"parent_run_id": parent.info.run_id, "experiment_id": parent.info.experiment_id,
                     "status": parent.info.status, "audit": tags.get(tracking.TAG_AUDIT, "not run"),
                     "epsilon_total": tags.get(tracking.TAG_EPSILON_SPENT), "stages": stages,
                     "epsilon_lower": tags.get(tracking.TAG_EPSILON_LOWER),
                     "empirical_audit": tags.get(tracking.TAG_EMPIRICAL_AUDIT),
                     "run_dir": tags.get(TAG_RUN_DIR),
                     "ledger_reservation_ids": None if recorded is None else _ids(recorded),
                     "card": _card(tags, parent.info.experiment_id, parent.info.run_id)}
    mlflow_part["registered"] = registered(client, stages.get("sample", {}).get("run_id"))
    return {"mlflow": mlflow_part, "lineage": lineage(tags[TAG_RUN_DIR]) if tags.get(TAG_RUN_DIR) else []}


def _card(tags: dict, exp, run_id: str) -> dict | None:
    """The release card `pipeline finish` logged to the parent run (tag ``dpsynth.release_card``): its page in
    MLflow's artifact view, and where it lies in the release zone."""
    logged = tags.get(TAG_CARD)
    if not logged or not logged.startswith(f"runs:/{run_id}/"):
        return None
    path = logged[len(f"runs:/{run_id}/"):]
    run_dir = tags.get(TAG_RUN_DIR)
    return {"href": f"/#/experiments/{exp}/runs/{run_id}/artifactPath/{path}",
            "release_zone": storage.join(run_dir, "release", path) if run_dir else None}


def registered(client, sample_run_id: str | None) -> list[dict[str, Any]]:
    """The Model Registry versions the sample stage's run registered (its audited generator): name, version,
    aliases, and the release's ε, δ and audit decision from the version's tags; [] without a registry."""
    if not sample_run_id:
        return []
    try:
        versions = client.search_model_versions(f"run_id = '{sample_run_id}'")
    except Exception:  # a store without the Model Registry: nothing to link
        return []
    # search results carry no aliases (MLflow 3.17's SQL store): LedgerView.gather overlays the current ones
    return [{"name": v.name, "version": str(v.version), "aliases": [],
             "epsilon": v.tags.get(tracking.TAG_EPSILON_SPENT), "delta": v.tags.get(tracking.TAG_DELTA),
             "audit": v.tags.get(tracking.TAG_AUDIT)}
            for v in sorted(versions, key=lambda v: (v.name, int(v.version)))]


def _ids(tag: str) -> list[int | str]:
    """The parent run's comma-separated reservation ids (a part that is not a number is kept as text)."""
    return [int(p) if p.strip().isdigit() else p.strip() for p in tag.split(",") if p.strip()]


def _manifest(run_dir: str, stage: str) -> dict | None:
    from dpsynth.stages import manifest

    uri = storage.join(run_dir, ZONE[stage], stage, manifest.NAME)
    try:
        return manifest.read(uri) if storage.exists(uri) else None
    except Exception:  # unreadable: show the chain as far as it goes
        return None


def _outside(run_dir: str):
    """sha256 → its keyed version id under the run's key (dpsynth.stages.protocol.dataset_version): how the page,
    which is outside the sensitive zone, names a sensitive-zone file ("unavailable" without the key)."""
    from dpsynth.stages.protocol import VERSION_KEY, keyed_version

    uri = storage.join(run_dir, "sensitive", VERSION_KEY)
    try:
        key = storage.read_bytes(uri) if storage.exists(uri) else None
    except Exception:  # MLflow's own object-store key cannot read the sensitive zone (the chart's dpsynth-mlflow-s3)
        key = None
    return lambda sha: keyed_version(key, sha) if key else "unavailable"


def lineage(run_dir: str) -> list[dict[str, Any]]:
    """The chain dataset → shards → train run → generator → synthetic data, from the manifests in ``run_dir``."""
    chain = []
    part = _manifest(run_dir, "partition")
    if not part:
        return chain
    chain.append({"kind": "dataset", "sha256": part["dataset_sha256"],
                  "detail": f"{sum(o.get('rows', 0) for o in part['outputs'])} records"})
    keyed = _outside(run_dir)  # sensitive-zone files by keyed version id, never by raw hash; no per-shard counts
    shards = [o for o in part["outputs"] if o["role"] == "shard"]
    chain.append({"kind": "shards", "items": [{"name": o["uri"].rsplit("/", 1)[-1], "sha256": keyed(o["sha256"])}
                                              for o in shards]})
    train = _manifest(run_dir, "train")
    if not train or train["status"] != "succeeded":
        return chain
    chain.append({"kind": "train run", "run_id": train.get("mlflow_run_id"), "pipeline_run_id": train.get("pipeline_run_id"),
                  "detail": f"ε={train['privacy']['epsilon']:.4g} ({train['privacy']['accountant']}), "
                            f"method {train.get('details', {}).get('method', '?')}"})
    generator = next((o for o in train["outputs"] if o["role"] == "generator"), None)
    audit = _manifest(run_dir, "audit")
    decision = (audit or {}).get("details", {}).get("decision", "not audited")
    if generator:
        chain.append({"kind": "generator", "sha256": keyed(generator["sha256"]), "detail": f"audit {decision}"})
    sample = _manifest(run_dir, "sample")
    if sample and sample["status"] == "succeeded":
        synthetic = next((o for o in sample["outputs"] if o["role"] == "synthetic"), None)
        released = next((o for o in sample["outputs"] if o["role"] == "generator"), None)
        if synthetic:
            chain.append({"kind": "synthetic data", "sha256": synthetic["sha256"], "run_id": sample.get("mlflow_run_id"),
                          "detail": f"{synthetic.get('rows')} records; released generator "
                                    f"{'= audited' if released and generator and released['sha256'] == generator['sha256'] else '≠ audited'}"})
    return chain


# --- HTML ------------------------------------------------------------------------------------------

STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #1f2933; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; } h3 { font-size: 15px; margin: 18px 0 6px; }
table { border-collapse: collapse; margin: 6px 0 12px; } td, th { border: 1px solid #cbd2d9; padding: 4px 8px; font-size: 13px; }
th { background: #f0f4f8; text-align: left; } code { font-size: 12px; }
.passed { color: #0b7a3b; font-weight: 600; } .failed { color: #b42318; font-weight: 600; }
.chain { display: flex; flex-wrap: wrap; align-items: center; gap: 6px; font-size: 13px; }
.link { border: 1px solid #9aa5b1; border-radius: 6px; padding: 4px 8px; background: #f8fafc; }
.arrow { color: #7b8794; }
"""


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def _f(x) -> str:
    return "-" if x is None else f"{x:.4g}"


def _run_link(exp, run_id, text=None) -> str:
    if not run_id:
        return "-"
    return f'<a href="/#/experiments/{_e(exp)}/runs/{_e(run_id)}">{_e(text or run_id[:12])}</a>'


def render(data: dict[str, Any]) -> str:
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>Privacy ledger · dpsynth</title>",
           f"<style>{STYLE}</style></head><body>",
           "<h1>Privacy ledger</h1><p>Each dataset population's lifetime (ε, δ) budget and every pipeline run charged "
           "to it: each training attempt holds its own reservation (a killed attempt is charged its whole "
           "reservation; its resumption the steps it added). Attempts compose by basic composition: their ε's and "
           "δ's add up. <a href='/'>Back to MLflow</a></p>"]
    if not data["populations"]:
        out.append("<p id='empty'>No populations yet: an operator sets each one's budget with <code>dpsynth ledger "
                   "set-budget POPULATION --epsilon E --delta D --records N --reason TEXT</code> (there is no "
                   "default budget).</p>")
    for pop in data["populations"]:
        pid = pop["population_id"]
        out.append(f"<section data-population='{_e(pid)}'><h2>Population <code>{_e(pid)}</code></h2>")
        out.append("<table class='budget'><tr><th>budget ε</th><th>spent ε</th><th>reserved ε</th><th>remaining ε</th>"
                   "<th>budget δ</th><th>δ charged</th></tr>"
                   f"<tr><td data-field='budget'>{_f(pop['budget'])}</td><td data-field='spent'>{_f(pop['committed'])}</td>"
                   f"<td data-field='reserved'>{_f(pop['reserved'])}</td>"
                   f"<td data-field='remaining'>{_f(pop['remaining'])}</td><td>{_e(pop['delta'])}</td>"
                   f"<td>{pop['delta_used']:.3g}</td></tr></table>")
        if len(pop.get("blocks") or []) > 1:  # privacy blocks (#54): each block's charge, the history's per block
            out.append("<table class='blocks'><tr><th>block</th><th>spent ε</th><th>reserved ε</th><th>remaining ε</th>"
                       "<th>δ charged</th><th>charged by reservations</th></tr>" + "".join(
                           f"<tr data-block='{b['block']}'><td>{b['block']}</td><td>{_f(b['committed'])}</td>"
                           f"<td>{_f(b['reserved'])}</td><td>{_f(b['remaining'])}</td><td>{b['delta_used']:.3g}</td>"
                           "<td>" + ", ".join(f"#{a['reservation_id']}" for r in pop["runs"] for a in r["attempts"]
                                              if b["block"] in a["blocks"] and a["status"] != "released")
                           + "</td></tr>" for b in pop["blocks"]) + "</table>")
        out.append("<table class='runs'><tr><th>pipeline run</th><th>ledger (attempts)</th><th>ε charged</th>"
                   + "".join(f"<th>ε {s}</th>" for s in STAGES) + "<th>audit</th><th>ε_lower (empirical audit)</th>"
                   "<th>dataset version</th><th>released (Model Registry)</th><th>release card</th></tr>")
        for run in pop["runs"]:
            m = run["mlflow"] or {}
            stages = m.get("stages", {})
            audit = m.get("audit", "no MLflow run")
            cells = "".join(f"<td data-stage='{s}' title='{_e(stages.get(s, {}).get('status'))}'>"
                            f"{_f(stages.get(s, {}).get('epsilon'))}</td>" for s in STAGES)
            attempts = "".join(
                f"<li data-reservation='{a['reservation_id']}' title='{_e(a['note'])}'>#{a['reservation_id']} "
                f"{_e(a['stage'])} {_e(a['status'])} ε {_f(a['epsilon_charged'])}"
                + (f" on blocks {', '.join(map(str, a['blocks']))}" if a["blocks"] != [0] else "")
                + (f" (resumes #{a['resumes_id']})" if a["resumes_id"] else "") + "</li>" for a in run["attempts"])
            name = (_run_link(m.get('experiment_id'), m.get('parent_run_id'), run['pipeline_run_id'])
                    if m.get("parent_run_id") else _e(run["pipeline_run_id"]))
            out.append(f"<tr data-run='{_e(run['pipeline_run_id'])}'>"
                       f"<td>{name}</td>"
                       f"<td><ul data-field='attempts'>{attempts}</ul>"
                       f"<span data-field='ledger-status'>{len(run['attempts'])} attempt(s) {_e(run['status'])}</span></td>"
                       f"<td data-field='charged'>{_f(run['epsilon_charged'])}</td>{cells}"
                       f"<td data-field='audit' class='{_e(audit)}'>{_e(audit)}</td>"
                       f"<td data-field='epsilon-lower' title='{_e(m.get('empirical_audit'))}'>"
                       f"{_e(m.get('epsilon_lower') or 'not run')}</td>"
                       f"<td><code>{_e(', '.join(s[:12] for s in run['dataset_sha256']))}</code></td>"
                       f"<td data-field='registered'>{'<br>'.join(_version_link(v) for v in m.get('registered') or []) or '-'}</td>"
                       f"<td data-field='card'>{_card_link(m.get('card'))}</td></tr>")
        out.append("</table>")
        for run in pop["runs"]:
            if run["lineage"]:
                out.append(f"<h3>Lineage of run <code>{_e(run['pipeline_run_id'])}</code></h3>"
                           f"<div class='chain' data-lineage='{_e(run['pipeline_run_id'])}'>"
                           + "<span class='arrow'>→</span>".join(_link(x, (run['mlflow'] or {}).get('experiment_id'))
                                                                for x in run["lineage"]) + "</div>")
        out.append("</section>")
    out.append("</body></html>")
    return "\n".join(out)


def _card_link(card: dict | None) -> str:
    if not card:
        return "-"
    where = f" <code title='in the release zone'>{_e(card['release_zone'])}</code>" if card.get("release_zone") else ""
    return f"<a href=\"{_e(card['href'])}\">card</a>{where}"


def _version_link(v: dict) -> str:
    """A registered version, linked to its page in MLflow's UI (models/NAME/versions/N)."""
    aliases = "".join(f" @{_e(a)}" for a in v["aliases"])
    return (f"<a data-model='{_e(v['name'])}' data-version='{_e(v['version'])}' "
            f"href=\"/#/models/{_e(urllib.parse.quote(v['name'], safe=''))}/versions/{_e(v['version'])}\">"
            f"{_e(v['name'])} v{_e(v['version'])}</a>{aliases} (ε {_e(v['epsilon'])}, δ {_e(v['delta'])}, "
            f"audit {_e(v['audit'])})")


def _link(item: dict, exp) -> str:
    kind = item["kind"]
    if kind == "registered model":
        return (f"<span class='link' data-kind='registered model'><b>registered model</b> "
                + "; ".join(_version_link(v) for v in item["versions"]) + "</span>")
    if kind == "shards":
        inner = ", ".join(f"<code title='{_e(s['sha256'])}' data-sha256='{_e(s['sha256'])}'>{_e(s['name'])} "
                          f"{_e(s['sha256'][:12])}</code>" for s in item["items"])
        return f"<span class='link' data-kind='shards'><b>{len(item['items'])} shards</b>: {inner}</span>"
    parts = [f"<b>{_e(kind)}</b>"]
    if item.get("sha256"):
        parts.append(f"<code title='{_e(item['sha256'])}' data-sha256='{_e(item['sha256'])}'>{_e(item['sha256'][:12])}</code>")
    if item.get("run_id"):
        parts.append(_run_link(exp, item["run_id"]))
    if item.get("detail"):
        parts.append(_e(item["detail"]))
    return f"<span class='link' data-kind='{_e(kind)}'>{' '.join(parts)}</span>"


def to_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, default=str)
