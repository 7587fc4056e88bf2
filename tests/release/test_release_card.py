"""The auditor's release card (dpsynth.release.card): written by `pipeline finish` after a passed audit, checked here
against the files it summarises, each read independently (the trace by Opacus' own accountant, the ledger by SQL,
the evaluation report as JSON); `dpsynth release verify`; the signature; a refused card; the page in Chromium."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from dpsynth.privacy import MechanismEvent, MechanismTrace
from dpsynth.stages import audit
# the stage tests' fixtures, as in tests/stages (autouse there and here: ledger_with_budget, one_torch_thread)
from tests.stages.conftest import ledger_with_budget, one_torch_thread  # noqa: F401 (autouse fixtures)
from tests.stages.helpers import dpsynth, manifest, release_files, settings, stage

DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"


@pytest.fixture(scope="module")
def released(tmp_path_factory, source):
    """One tiny pipeline run with MLflow on and a signing key: (run_dir, mlflow_uri, ledger_db, public key path)."""
    root = tmp_path_factory.mktemp("card")
    run, ledger_db, mlflow_uri = root / "run", root / "ledger.db", f"sqlite:///{root / 'mlflow.db'}"
    from dpsynth.ledger.store import Ledger

    ledger = Ledger(f"sqlite:///{ledger_db}")
    ledger.set_budget("mnist600", epsilon=100.0, delta=1e-3, reason="card tests")
    # an earlier attempt of the population, committed: "before this run" must count it
    rid = ledger.reserve("mnist600", epsilon=3.0, delta=1e-5, dataset_sha256="ab" * 32, pipeline_run_id="earlier",
                         accountant="rdp", records=554)
    ledger.commit(rid, epsilon_spent=2.5)
    assert dpsynth("release", "keygen", "--out", root / "key.pem") == 0
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key((root / "key.pem").read_bytes(), password=None)
    (root / "key.pub.pem").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPSYNTH_SIGNING_KEY", str(root / "key.pem"))
        assert dpsynth("pipeline", "run", "--run-dir", run, "--pipeline-run-id", "c1", *settings(
            source, "tracking.enabled=true", f"tracking.uri={mlflow_uri}", "tracking.experiment=card-test",
            f"ledger.url=sqlite:///{ledger_db}")) == 0
    return run, mlflow_uri, ledger_db, root / "key.pub.pem"


def card_of(run) -> dict:
    return json.loads((run / "release" / "card" / "card.json").read_text())


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_the_card_states_the_trace_the_ledger_and_the_evaluation(released):
    run, _, ledger_db, _ = released
    card, html = card_of(run), (run / "release" / "card" / "card.html").read_text()
    assert card["decision"] == "released" and "RELEASED" in html
    # the trace, as the train stage wrote it, accounted by Opacus' own RDP accountant
    trace_path = manifest(run, "sensitive", "train")["outputs"]
    trace_path = next(o["uri"] for o in trace_path if o["role"] == "trace")
    trace = json.loads(Path(trace_path).read_text())
    from opacus.accountants import RDPAccountant

    ref = RDPAccountant()
    ref.history = [(e["noise_multiplier"], e["sample_rate"], e["count"]) for e in trace["events"]]
    rdp = ref.get_epsilon(1e-4)
    assert card["epsilons"]["rdp"] == pytest.approx(rdp, rel=1e-6) and card["epsilon"] == pytest.approx(rdp, rel=1e-6)
    assert f"{card['epsilons']['rdp']:.6g}" in html and f"{card['epsilons']['prv']['upper']:.6g}" in html
    assert card["epsilons"]["prv"]["upper"] <= rdp  # PRV is the tighter of the two
    assert [(e["sample_rate"], e["noise_multiplier"], e["count"]) for e in card["events"]] == \
        [(e["sample_rate"], e["noise_multiplier"], e["count"]) for e in trace["events"]]
    assert all(f"{e['noise_multiplier']:.6g}" in html for e in trace["events"])
    assert (run / "release" / "card" / "trace.json").read_bytes() == Path(trace_path).read_bytes()
    assert card["trace_sha256"] == sha256(trace_path)
    stage_eps = {s["stage"]: s["epsilon"] for s in card["stages"]}
    assert stage_eps == {"partition": 0, "pretrain": 0, "train": pytest.approx(rdp, rel=1e-6), "audit": 0,
                         "sample": 0, "evaluate": 0}
    assert "not run" in html.split('id="epsilon-lower"')[1][:200]  # no empirical audit in this run
    # the ledger, by SQL
    db = sqlite3.connect(ledger_db)
    budget = db.execute("select epsilon_budget from populations where population_id='mnist600'").fetchone()[0]
    rows = db.execute("select pipeline_run_id, status, epsilon_spent from reservations where population_id='mnist600'"
                      " order by id").fetchall()
    this_run = sum(e for p, s, e in rows if p == "c1")
    before = sum(e for p, s, e in rows if p == "earlier")
    g = card["ledger"]
    assert (g["budget"], g["committed_before"]) == (budget, pytest.approx(2.5)) and before == pytest.approx(2.5)
    assert g["this_run"] == pytest.approx(this_run) and this_run == pytest.approx(rdp, rel=1e-6)
    assert g["remaining"] == pytest.approx(budget - sum(e for _, s, e in rows if s == "committed"))
    assert len(g["attempts"]) == 1 and g["attempts"][0]["status"] == "committed" and g["lifetime_attempts"] == 2
    assert f"{g['remaining']:.6g}" in html and f"{this_run:.6g}" in html
    # the evaluation report
    report = json.loads((run / "release" / "evaluate" / "report.json").read_text())
    got = {c["name"]: c["gen2real"] for c in card["utility"]["classifiers"]}
    assert got == {c["classifier"]: c["gen2real"] for c in report["utility"]["classifiers"]} and set(got) == {"cnn", "logreg"}
    frechet = report["quality"]["frechet"]
    assert (card["utility"]["frechet"]["value"], card["utility"]["frechet"]["floor"]) == (frechet["value"], frechet["real_vs_real"])
    assert f"{frechet['value']:.4g}" in html and f"{frechet['real_vs_real']:.4g}" in html
    assert "not</b> covered by (ε, δ)" in html and "outside the guarantee" in html
    # what was released
    synthetic = run / "release" / "sample" / "synthetic.parquet"
    assert card["release"]["synthetic"]["sha256"] == sha256(synthetic) and sha256(synthetic) in html
    assert card["release"]["synthetic"]["bytes"] == synthetic.stat().st_size
    assert card["release"]["registered_model"] == {"name": "dpsynth-mnist600-dpgan", "version": "1", "alias": "released"}
    assert "n = 554 training records" in html and "10 classes" in html
    # every released file is listed with its sha256, and nothing else is in the release zone
    listed = {f["path"]: f["sha256"] for f in card["files"]}
    assert all(sha256(run / "release" / p) == h for p, h in listed.items())
    assert sorted(release_files(run)) == sorted([*listed, "card/card.json", "card/card.json.sig",
                                                 "card/signing-key.pub.pem", "card/SHA256SUMS"])


def test_verify_recomputes_and_signature_fails_when_a_byte_changes(released, tmp_path, capsys):
    run, _, _, public = released
    rel = tmp_path / "release"
    shutil.copytree(run / "release", rel)
    assert dpsynth("release", "verify", rel, "--public-key", public) == 0
    out = capsys.readouterr().out
    assert "ok   signature" in out and "ok   epsilon rdp" in out and "ok   epsilon prv" in out and "FAIL" not in out
    assert "ok   headline epsilon" in out and "ok   epsilon per privacy block" in out
    if shutil.which("openssl"):  # the same signature, checked without dpsynth
        subprocess.run(["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", public, "-rawin", "-in",
                        rel / "card" / "card.json", "-sigfile", rel / "card" / "card.json.sig"], check=True)
    if shutil.which("sha256sum"):
        subprocess.run(["sha256sum", "-c", "--quiet", "card/SHA256SUMS"], cwd=rel, check=True)

    def tampered(path, change) -> set[str]:
        original = path.read_bytes()
        path.write_bytes(change(original))
        try:
            assert dpsynth("release", "verify", rel, "--public-key", public) == 2
            return {line.split(":")[0][5:] for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL")}
        finally:
            path.write_bytes(original)

    def flip(data: bytes) -> bytes:
        i = data.index(b'"decision"') + 13  # a byte inside "released"
        return data[:i] + bytes([data[i] ^ 1]) + data[i + 1:]

    assert tampered(rel / "card" / "card.json", flip) == {"signature"}

    def headline(data: bytes) -> bytes:  # the card's headline ε edited, nothing else (#52 item 9)
        card = json.loads(data)
        return (json.dumps({**card, "epsilon": card["epsilon"] / 2}, indent=2) + "\n").encode()

    assert tampered(rel / "card" / "card.json", headline) == {"signature", "headline epsilon"}

    def per_block(data: bytes) -> bytes:  # the ε the card says this run charged its block edited (#54 item 5)
        card = json.loads(data)
        card["ledger"]["blocks"][0]["this_run"] /= 2
        return (json.dumps(card, indent=2) + "\n").encode()

    assert tampered(rel / "card" / "card.json", per_block) == {"signature", "epsilon per privacy block"}

    def whole_charge(data: bytes) -> bytes:  # the attempt's charge and the block's edited alike: the trace disagrees
        card = json.loads(data)
        card["ledger"]["blocks"][0]["this_run"] /= 2
        card["ledger"]["attempts"][-1]["epsilon_spent"] /= 2
        return (json.dumps(card, indent=2) + "\n").encode()

    assert tampered(rel / "card" / "card.json", whole_charge) == {"signature", "epsilon per privacy block"}
    assert tampered(rel / "sample" / "synthetic.parquet", lambda d: d[:-1] + bytes([d[-1] ^ 1])) == \
        {"sha256 sample/synthetic.parquet"}
    looser = MechanismTrace([MechanismEvent(**{**e, "noise_multiplier": e["noise_multiplier"] * 2})
                             for e in json.loads((rel / "card" / "trace.json").read_text())["events"]]).to_json()
    assert tampered(rel / "card" / "trace.json", lambda _: looser.encode()) >= \
        {"sha256 card/trace.json", "trace is the audited one", "generator bound to the trace", "epsilon rdp"}
    (rel / "sample" / "extra.csv").write_text("id\n1\n")
    assert dpsynth("release", "verify", rel) == 2 and "FAIL nothing unlisted" in capsys.readouterr().out


def test_the_card_is_logged_to_the_parent_run_and_the_registered_version(released):
    run, mlflow_uri, _, _ = released
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_uri)
    (parent,) = client.search_runs([client.get_experiment_by_name("card-test").experiment_id],
                                   "tags.`dpsynth.stage` = 'pipeline'")
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "card")}
    assert {"card/card.html", "card/card.json", "card/card.json.sig", "card/trace.json"} <= logged
    version = client.get_model_version("dpsynth-mnist600-dpgan", "1")
    assert version.tags["dpsynth.release_card"] == f"runs:/{parent.info.run_id}/card/card.html"
    assert version.tags["dpsynth.release_card_sha256"] == sha256(run / "release" / "card" / "card.html")
    in_model = {a.path for a in client.list_logged_model_artifacts(version.source[len("models:/"):], "release_card")}
    assert "release_card/card.html" in in_model


def test_a_refused_audit_leaves_its_card_in_the_sensitive_zone_only(trained, source, capsys):
    assert stage("audit", trained, source, "privacy.accounting=as_published") == 2
    assert dpsynth("pipeline", "finish", "--run-dir", trained, "--pipeline-run-id", "r1", *settings(source)) == 0
    out = capsys.readouterr().out
    page = (trained / "sensitive" / "card" / "card.html").read_text()
    assert "REFUSED" in page and "accounting: accounting &#39;as_published&#39;" in page
    card = json.loads((trained / "sensitive" / "card" / "card.json").read_text())
    assert card["decision"] == "refused" and card["refused_because"][0].startswith("accounting:")
    assert release_files(trained) == [] and "Release card: " + str(trained / "sensitive" / "card") in out


def test_audit_md_says_each_check_in_one_plain_line_and_the_trace_apart():
    from dpsynth.config import load_config
    from dpsynth.methods import registry

    # `make run`'s recipe as its stages resolve it for a grey schema (train.method: auto → dpgan)
    cfg = load_config("configs/dpgan-mnist-cpu.yaml", overrides=["train.steps=20", "train.method=dpgan"])
    n = 9000
    trace = registry.get("dpgan").mechanism.plan(cfg, n).trace
    report = audit.evaluate(cfg, trace_text=trace.to_json(), n=n, integrity=[], prv_time_limit_s=60)
    report = {**report, "generator": {"sha256": "x"}, "claimed": {},
              "trace": {"events": [e.to_dict() for e in trace.events]}}
    md = audit.markdown(report)
    assert "MechanismEvent(" not in md and "| check |" not in md
    checks = md.split("## Checks\n\n")[1].split("\n\n")[0].splitlines()
    assert len(checks) == len(report["checks"]) and all(line.startswith("- ✔ passed — ") for line in checks)
    assert ("- ✔ passed — plan: the trace is exactly the privacy plan recomputed from the configuration and n "
            "(the trace is below)") in checks  # the warm-up's releases open it: the mechanism's plan
    section = md.split("## The mechanism trace\n")[1]
    releases = len(cfg.warmup.releases())  # `make run`'s recipe: the histogram, class means, variations, styles
    assert releases == 4 and section.count("| full_batch | add_remove | 1 |") == releases
    assert "| poisson | add_remove |" in section
    # a failed check says why, still on one line and without a Python repr
    bad = audit.evaluate(cfg, trace_text=MechanismTrace(trace.events[1:]).to_json(), n=n, integrity=[], prv_time_limit_s=60)
    md = audit.markdown({**bad, "generator": {"sha256": "x"}, "claimed": {}})
    (plan,) = [line for line in md.splitlines() if "— plan:" in line]
    assert plan.startswith("- ✘ **FAILED** — plan: the trace is not the recomputed plan") and "MechanismEvent(" not in md


@pytest.mark.skipif(not shutil.which("chromium"), reason="Chromium is not installed (apt-get install chromium)")
def test_the_card_renders_in_chromium_with_its_grid_and_lineage(released):
    from tests.platform.cdp import Browser

    run = released[0]
    browser = Browser()
    try:
        browser.goto((run / "release" / "card" / "card.html").as_uri())
        assert browser.wait_for("document.getElementById('grid').complete && "
                                "document.getElementById('grid').naturalWidth > 0")
        boxes = browser.js("[...document.querySelectorAll('#lineage rect')].map(r => r.getBoundingClientRect().width)")
        assert len(boxes) == 8 and min(boxes) > 50  # dataset, six stages, release: drawn, not empty
        labels = browser.js("[...document.querySelectorAll('#lineage text')].map(t => t.textContent)")
        assert {"dataset", "train", "audit", "release"} <= set(labels)
        assert browser.js("document.getElementById('verdict').textContent") == "RELEASED"
        height = browser.js("document.documentElement.scrollHeight")
        shot = browser.send("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                            clip={"x": 0, "y": 0, "width": 1400, "height": height, "scale": 1})
        import base64

        png = base64.b64decode(shot["data"])
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
        (run / "card-screenshot.png").write_bytes(png)
    finally:
        browser.close()
    assert (run / "release" / "card" / "card.pdf").read_bytes()[:5] == b"%PDF-"
