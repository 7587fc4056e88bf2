"""The evaluation report as one self-contained HTML page (images inline), which MLflow's
artifact view shows as is: privacy (ε, δ, accountants, audit), the reference data and what
it makes of the metrics, utility (Tables A1–A2 of GS-WGAN's supplement, plus real2gen),
quality, membership inference, and the sample grids.
"""

from __future__ import annotations

import base64
import io
from html import escape

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:70em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}
th{background:#f3f3f3}.note{color:#555;font-size:.92em}
.tag{display:inline-block;padding:.1em .5em;border-radius:.3em;font-weight:600}
.internal{background:#fde2c8}.releasable,.passed{background:#d4f0d4}.failed{background:#f6c6c6}"""


def _num(x, fmt: str = ".4f") -> str:
    return "—" if x is None else format(x, fmt)


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def _tag(status: str) -> str:
    return f'<span class="tag {escape(status)}">{escape(status)}</span>'


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def png_data_uri(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _privacy(p: dict) -> str:
    eps = p.get("epsilons") or {}
    prv = eps.get("prv") or {}
    rows = [["released ε (upper bound)", _num(p.get("epsilon"), ".4g")], ["δ", _num(p.get("delta"), ".3g")],
            ["target ε", _num(p.get("target_epsilon"), ".4g")], ["ε, RDP accountant", _num(eps.get("rdp"), ".4g")],
            ["ε, PRV accountant (upper)", _num(prv.get("upper"), ".4g")], ["accountants", escape(p.get("accountant", ""))],
            ["audit", _tag(p.get("audit", "unknown") if p.get("audit") != "failed" else "failed")]]
    return "<h2>Privacy</h2>" + _table(["", "value"], rows)


def _reference(r: dict) -> str:
    return (f"<h2>Reference data {_tag(r['status'])}</h2><p>{escape(r['kind'])}: <code>{escape(r['uri'])}</code>, "
            f"{r['records']} records, split into {r['split']['fit']} for training the real classifiers and "
            f"{r['split']['test']} for testing.</p><p class=note>{escape(r['note'])}</p>")


def _utility(u: dict, status: str) -> str:
    rows = []
    for c in u["classifiers"]:
        if "skipped" in c:
            rows.append([escape(c["classifier"]), "—", f"skipped: {escape(c['skipped'])}", "—"])
            continue
        rows.append([escape(c["classifier"]), _num(c["real"], ".3f"), f"{_num(c['gen2real'], '.3f')} ({_pct(c['calibrated'])})",
                     _num(c["real2gen"], ".3f")])
    a = u["average"]
    if a["gen2real"] is not None:
        rows.append(["<b>average</b>", _num(a["real"], ".3f"), f"{_num(a['gen2real'], '.3f')} ({_pct(a['calibrated'])})",
                     _num(a["real2gen"], ".3f")])
    rec = u["records"]
    return (f"<h2>Utility {_tag(status)}</h2>"
            + _table(["classifier", "real → real", "gen2real (calibrated)", "real2gen"], rows)
            + f"<p class=note>gen2real: trained on {rec['synthetic_train']} generated records (epochs of CNN/MLP chosen "
              f"on {rec['synthetic_validation']} held-out generated records), tested on {rec['real_test']} real records. "
              f"real → real and real2gen: trained on {rec['real_train']} real records. Calibrated = gen2real ÷ real → real "
              "(GS-WGAN, Tables A1–A2).</p>")


def _quality(q: dict, status: str) -> str:
    f, i, j = q["frechet"], q["inception_score"], q["js_score"]
    rows = [[escape(f["name"]), _num(f["value"]), escape(f["features"])],
            [escape(f["name"]) + " (real vs real)", _num(f.get("real_vs_real")),
             "the same distance between the two halves of the real reference data: the floor"],
            ["inception score", f"{_num(i['mean'], '.3f')} ± {_num(i['std'], '.3f')}", escape(i["classifier"])],
            ["js score", _num(j["js_score"]), "dp-GAN §5.3: a real-vs-generated discriminator's output; 0 = cannot tell"]]
    return f"<h2>Quality {_tag(status)}</h2>" + _table(["metric", "value", "how"], rows)


def _operator(o: dict | None) -> str:
    if not o:
        return ""
    return (f"<h2>Ceiling and per-class accuracy {_tag('internal')}</h2><p class=note>{escape(o['note'])}</p>"
            f"<p class=note>The operator reads them in the sensitive zone: <code>{escape(o['kept_in'])}</code>.</p>")


def _mia(m: dict) -> str:
    if "skipped" in m:
        return f"<h2>Membership inference</h2><p>skipped: {escape(m['skipped'])}</p>"
    if "auc" not in m:  # the results stay in the sensitive zone
        return f"<h2>Membership inference {_tag('internal')}</h2><p class=note>{escape(m['note'])}</p>"
    r = m["records"]
    rows = [["AUC", _num(m["auc"])], ["TPR at 1% FPR", _num(m["tpr_at_1pct_fpr"])],
            ["held-in / held-out / generated", f"{r['held_in']} / {r['held_out']} / {r['generated']}"]]
    return (f"<h2>Membership inference {_tag('internal')}</h2><p>{escape(m['attack'])}.</p>" + _table(["", "value"], rows)
            + f"<p class=note>{escape(m['note'])}</p>")


def html(report: dict, *, grids: dict[str, object]) -> str:
    """The page for ``report`` (the report.json dict) with the PIL images of ``grids`` inline."""
    labels = report["labels"]
    imgs = "".join(f'<figure><img src="{png_data_uri(img)}" alt="{escape(name)}"><figcaption>{escape(name)}</figcaption>'
                   "</figure>" for name, img in grids.items())
    return (f"<!doctype html><html><head><meta charset=utf-8><title>dpsynth evaluation</title><style>{STYLE}</style>"
            f"</head><body><h1>dpsynth evaluation</h1>"
            f"<p class=note>Metrics marked <b>internal</b> are exact statistics of sensitive records, outside the "
            f"release's (ε, δ): for auditors, not for publication. No model is selected on real data.</p>"
            + _privacy(report["privacy"]) + _reference(report["reference"])
            + _utility(report["utility"], labels["utility"]) + _quality(report["quality"], labels["quality"])
            + _operator(report.get("operator")) + _mia(report["membership_inference"])
            + f"<h2>Samples</h2>{imgs}</body></html>\n")
