"""Every way out of the sensitive zone, walked (issue #52): nothing that leaves holds a raw hash of a sensitive-zone
file, a per-shard or per-class count, or a record id.

The entry points are enumerated, not listed by hand: every leaf command of the ``dpsynth`` parser, and for the
commands the orchestrators run (their words are string constants of pipelines/: the Airflow DAGs, the KFP pipeline
and its compiled YAML) every option the orchestrators pass them (``pretrain --shard``, ``train --launch``,
``data import --outside``, ``pipeline start --unless-released`` …). A command a new commit adds, or an option the
pipelines start to pass, that this walk does not run fails :func:`test_the_walk_covers_every_entry_point`; a command
that prints data to its user on purpose (``data info``) must be named in :data:`dpsynth.egress.INSIDE`, with why, and
must not be one the orchestrators run.

One small GS-WGAN run (K = 3 shards pre-trained one task each, the richest in per-shard data), MLflow on: every
command once, in process, in the order an orchestrator runs them (the stages as Airflow's and KFP's tasks do, each
with ``--json``; the TrainJob launcher against a stand-in cluster whose job has finished, so it reads and prints the
train stage's outcome; ``train --launch torchrun`` as a real torchrun of one rank, the train stage skipped). What
it collects: each command's stdout and stderr (the XCom / ``return.json`` / pod log), the KFP container program's
output artifacts made from each stage's outcome, everything MLflow holds (its database and every artifact), the
auditor's Privacy ledger page (its JSON API and its HTML), and the release zone (card included).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import hashlib
import io
import json
import logging
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from dpsynth import egress
from dpsynth.cli import build_parser
from dpsynth.data import read_parquet
from dpsynth.distributed import launch
from tests.stages.helpers import dpsynth, manifest, settings
from tests.stages.test_no_raw_hashes import file_hashes, hits, sensitive_hashes, store_texts

pytestmark = pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha:UserWarning")

REPO = Path(__file__).resolve().parents[2]
PIPELINES = REPO / "pipelines"
GSWGAN = ("train.method=gswgan", "partition.num_shards=3", "gswgan.d_width=4", "gswgan.g_width=4",
          "gswgan.latent_dim=8", "gswgan.batch_size=16", "train.n_d=2", "gswgan.pretrain_iterations=2", "train.steps=4")
# Planted on every channel before the walk (:func:`plant`): a field no allow-list names, whose value must leave nowhere
CANARY = "planted-egress-canary-0c6d"
PLANTED_METRIC = "planted_metric_egress"
COMMON = {"-h", "--help", "--json", "--config", "--set", "--run-dir", "--pipeline-run-id", "--parent-run-id", "--db"}


# --- the entry points, enumerated ----------------------------------------------------------------------------


def cli_commands() -> dict[str, set[str]]:
    """Every leaf command of the ``dpsynth`` parser ("pipeline start") → its option strings."""
    found = {}

    def walk(parser, path):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            found[" ".join(path)] = {o for a in parser._actions for o in a.option_strings}
        for a in subs:
            for name, sub in a.choices.items():
                walk(sub, (*path, name))

    walk(build_parser(), ())
    return found


def pipeline_strings() -> set[str]:
    """Every string constant of the orchestrators' definitions (DAGs, the KFP pipeline, its compiled YAML)."""
    out = set()
    for path in PIPELINES.rglob("*.py"):
        out |= {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
                and isinstance(n.value, str)}
    for path in PIPELINES.rglob("*.yaml"):
        out |= set(re.findall(r"[\w-]+", path.read_text()))
    return out


def orchestrated() -> dict[str, set[str]]:
    """The commands the orchestrators run (every word of the command a string constant of pipelines/) → the
    options of each the orchestrators pass (besides the common ones every stage gets)."""
    words = pipeline_strings()
    return {cmd: {o for o in opts - COMMON if o in words}
            for cmd, opts in cli_commands().items() if all(w in words for w in cmd.split())}


# --- the walk ---------------------------------------------------------------------------------------------------


class FinishedJob:
    """The launcher's Kubernetes API, served by a job that has already succeeded (the train stage ran above)."""

    namespace = "dpsynth"

    def __init__(self):
        self.jobs = {}

    def template(self, config_map):
        from tests.distributed.test_launch import TEMPLATE

        return copy.deepcopy(TEMPLATE)

    def get(self, kind, name):
        return self.jobs.get(name)

    def create(self, kind, body):
        self.jobs[body["metadata"]["name"]] = {**body, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}

    def delete(self, kind, name):
        self.jobs.pop(name, None)

    def first_node_pod(self, kind, name):
        return None


@contextlib.contextmanager
def captured():
    """What a command writes to stdout and stderr, in this process and in the processes it starts (torchrun's)."""
    got = {}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        py_out, py_err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(py_out), contextlib.redirect_stderr(py_err):
                yield got
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
        out.seek(0)
        err.seek(0)
        got["out"] = py_out.getvalue() + out.read().decode(errors="replace")
        got["err"] = py_err.getvalue() + err.read().decode(errors="replace")


@pytest.fixture(scope="module")
def walked(tmp_path_factory, source):
    base = tmp_path_factory.mktemp("egress")
    run, ledger = base / "run", f"sqlite:///{base / 'ledger.db'}"
    mlflow_uri = f"sqlite:///{base / 'mlflow.db'}"
    tracked = ("tracking.enabled=true", f"tracking.uri={mlflow_uri}", "tracking.experiment=egress",
               f"tracking.artifact_location={base / 'artifacts'}", *GSWGAN,
               "output.log_every=2")  # the trainer's logged series too (tests/stages/test_logged_keys.py's checks)
    ran: list[tuple[list[str], int, str, str]] = []
    from tests import mlflow_template

    mlflow_template.install()  # the walk's new store is migrated once and kept as the template of this module's others
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPSYNTH_LEDGER_URL", ledger)
        plant(mp)

        def call(*argv) -> int:
            with captured() as got:
                code = dpsynth(*argv)
            ran.append(([str(a) for a in argv], code, got["out"], got["err"]))
            return code

        imported = base / "import" / "mnist600.parquet"
        assert call("data", "import", "--json", "--outside", "--versioned", "--", source, imported) == 0
        data = json.loads(ran[-1][2])["versioned_uri"]
        assert call("data", "import", "--json", "--", source, base / "import" / "plain.parquet") == 0  # the default
        assert call("data", "import", "--", source, base / "import" / "plain.parquet") == 0
        stage_settings = settings(data, *tracked)
        assert call("ledger", "set-budget", "mnist600", "--epsilon", "1000", "--delta", "1e-3", "--records", "600",
                    "--reason", "egress walk", "--json") == 0
        ids = ["--pipeline-run-id", "e1"]
        assert call("pipeline", "start", "--unless-released", "--run-dir", run, *ids, *stage_settings, "--json") == 0
        parent = ["--parent-run-id", json.loads(ran[-1][2])["parent_run_id"]]
        on = ["--run-dir", run, *ids, *parent, *stage_settings, "--json"]
        assert call("partition", *on) == 0
        for k in range(3):  # the fan-out: one task per shard, each an XCom
            assert call("pretrain", "--shard", k, *on) == 0
        for stage in ("pretrain", "train"):
            assert call(stage, *on) == 0
        mp.setenv(launch.TEMPLATE_ENV, "dpsynth-trainjob")
        mp.setattr(launch, "Cluster", FinishedJob)
        assert call("train", "--launch", "trainjob", *on) == 0
        assert call("train", "--launch", "torchrun", *on) == 0  # a real torchrun of one rank: the stage skipped
        for stage in ("audit", "sample", "evaluate"):
            assert call(stage, *on) == 0
        assert call("audit", "empirical", *on) in (0, 2)
        assert call("pipeline", "finish", *on) == 0
        assert call("pipeline", "show", "--run-dir", run, *ids, *stage_settings, "--json") == 0
        assert call("pipeline", "run", "--run-dir", run, "--pipeline-run-id", "e2", *stage_settings, "--json") == 0
        assert call("release", "verify", run / "release", "--json") == 0
        assert call("release", "keygen", "--out", base / "key.pem") == 0
        for action in ("show", "history"):
            assert call("ledger", action, "--json") == 0
        assert call("ledger", "forecast", "mnist600", *stage_settings, "--json") == 0  # the retrain's plan (#54)
        call("ledger", "settle", "1", "--reason", "egress walk", "--json")  # refused: it is closed (its message)
        call("ledger", "grant-roles", "--stage-role", "s", "--auditor-role", "a", "--json")  # PostgreSQL only
        assert call("privacy", "epsilon", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "10",
                    "--delta", "1e-5", "--json") == 0
        assert call("privacy", "noise", "--epsilon", "1", "--sample-rate", "0.01", "--steps", "10",
                    "--delta", "1e-5", "--json") == 0
        assert call("config", "show", *stage_settings, "--json") == 0
        assert call("config", "schema") == 0
        beyond = {"ledger page (JSON API)": ..., "ledger page (HTML)": ..., **kfp_artifacts(ran), **airflow_values(ran)}
        from dpsynth_mlflow.ledger_view import gather, render  # the auditor's page, as the MLflow server serves it

        with logged_by("dpsynth.egress") as page_log:
            page = gather(ledger_url=ledger, tracking_uri=mlflow_uri)
        beyond["ledger page (JSON API)"] = json.dumps(page, default=str).encode()
        beyond["ledger page (HTML)"] = render(page).encode()
    return {"base": base, "run": run, "ran": ran, "source": source, "imported": imported, "beyond": beyond,
            "page_log": page_log, "data": data}


@contextlib.contextmanager
def logged_by(name: str):
    """The messages logger ``name`` emits inside the block."""
    got: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: got.append(record.getMessage())
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield got
    finally:
        logger.removeHandler(handler)


def plant(mp) -> None:
    """A field no allow-list names, planted where each channel's data is made: the lineage every manifest and the card
    state, the tags every MLflow run and registered version starts with, a trainer's final metrics and parameters,
    the audit report (its MLflow copy and the released one), the ledger's rows (``ledger * --json``, the ledger page).
    The gate must drop each, and log its path."""
    from dpsynth import tracking
    from dpsynth.stages import audit as audit_stage
    from dpsynth.ledger.store import Ledger
    from dpsynth.methods.gswgan import GSWGANTrainer

    def wrap(owner, name, add):
        original = getattr(owner, name)
        mp.setattr(owner, name, lambda *a, **k: add(original(*a, **k)))

    wrap(tracking, "lineage", lambda found: {**found, "planted": CANARY})
    wrap(tracking, "lineage_tags", lambda found: {**found, "dpsynth.planted": CANARY})
    wrap(GSWGANTrainer, "final_metrics", lambda found: {**found, PLANTED_METRIC: 1.0, "derived.planted": CANARY})
    wrap(audit_stage, "evaluate", lambda report: {**report, "planted": CANARY})
    for name in ("history", "populations"):
        wrap(Ledger, name, lambda rows: [{**r, "planted": CANARY} for r in rows])
    for name in ("balance", "settle"):
        wrap(Ledger, name, lambda row: {**row, "planted": CANARY})


def dag_function(path: Path, name: str):
    """A plain function of a DAG file, without importing Airflow (the stage environment has none)."""
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    found: dict = {}
    exec(compile(ast.Module([node], []), str(path), "exec"), found)  # noqa: S102 — the DAG's own code
    return found[name]


def airflow_values(ran) -> dict[str, bytes]:
    """What the Airflow DAGs' own Python makes of the commands' --json output and keeps: each stage task's XCom
    (``dpsynth_pods.summarise``), the import's asset event ``extra`` (``dpsynth_retrain.dataset_event``), which the
    retrain's ``plan`` returns as its XCom and prints."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dpsynth_pods", PIPELINES / "airflow" / "dags" / "dpsynth_pods.py")
    pods = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pods)
    event = dag_function(PIPELINES / "airflow" / "dags" / "dpsynth_retrain.py", "dataset_event")
    out = {}
    for i, (argv, code, stdout, _) in enumerate(ran):
        if code != 0 or "--json" not in argv:
            continue
        if argv[0] in ("partition", "pretrain", "train", "audit", "sample", "evaluate") and "--shard" not in argv:
            out[f"{i} {argv[0]}: Airflow XCom"] = json.dumps(pods.summarise(json.loads(stdout))).encode()
        if argv[:2] == ["data", "import"] and "--versioned" in argv:
            out[f"{i} data import: asset event extra"] = json.dumps(event(json.loads(stdout))).encode()
    return out


def test_the_dags_own_values_come_from_the_gated_output(walked):
    """Every value the DAGs' Python keeps (XCom, asset event) is one the command's gated --json output printed."""
    ran, beyond = walked["ran"], walked["beyond"]
    kept = {k: v for k, v in beyond.items() if "Airflow XCom" in k or "asset event" in k}
    assert any("asset event" in k for k in kept) and sum("Airflow XCom" in k for k in kept) >= 6
    for where, text in kept.items():
        printed = [v for _, v in strings_and_numbers(json.loads(ran[int(where.split()[0])][2]))]
        for path, value in strings_and_numbers(json.loads(text)):  # a value printed, or part of one (a shard's name)
            assert value in printed or any(isinstance(p, str) and str(value) in p for p in printed), (where, path, value)


def strings_and_numbers(obj, path=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from strings_and_numbers(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for v in obj:
            yield from strings_and_numbers(v, f"{path}[]")
    elif isinstance(obj, (str, int, float)) and not isinstance(obj, bool):
        yield path, obj


def kfp_artifacts(ran) -> dict[str, bytes]:
    """What the KFP container program (pipelines/kfp/stage_program.py, the text the containers run) makes of each
    stage's --json outcome: its output artifacts (dataset, model, synthetic data, the Metrics of the stage's numeric
    details), which KFP's UI and metadata store keep."""
    program = {"__name__": "dpsynth_stage_program"}
    exec((PIPELINES / "kfp" / "stage_program.py").read_text(), program)  # noqa: S102 — what the containers run
    program["OPTIONS"]["artifacts"] = [(name, f"/unused/{name}") for name in program["ARTIFACTS"]]
    out = {}
    for i, (argv, code, stdout, _) in enumerate(ran):
        if code == 0 and argv[0] in ("partition", "pretrain", "train", "audit", "sample", "evaluate") \
                and "--shard" not in argv:
            for name, _, fields in program["artifacts"](json.loads(stdout)):
                out[f"{i} {argv[0]}: KFP artifact {name}"] = json.dumps(fields).encode()
    return out


def test_the_walk_covers_every_entry_point(walked):
    commands = cli_commands()
    inside = {name for name in egress.INSIDE if " --" not in name}  # whole commands; the rest an option of one
    assert inside <= set(commands), "egress.INSIDE names a command that does not exist"
    words = pipeline_strings()
    for name in set(egress.INSIDE) - inside:  # an option that asks for the inside view: never an orchestrator's
        cmd, option = name.split(" --")
        assert f"--{option}" in commands[cmd] and f"--{option}" not in words, name
    run_with: dict[str, set[str]] = {}
    for argv, *_ in walked["ran"]:
        words = [a for a in argv if not a.startswith("-")]
        cmd = next(c for c in sorted(commands, key=len, reverse=True) if words[:len(c.split())] == c.split())
        run_with.setdefault(cmd, set()).update(a for a in argv if a.startswith("--"))
    assert sorted(set(commands) - inside - set(run_with)) == [], "commands the egress walk does not run"
    for argv, code, out, _ in walked["ran"]:  # each --json command that succeeded printed its JSON (walked for real)
        if code == 0 and "--json" in argv:
            assert isinstance(json.loads(out), (dict, list)), argv
    beyond = walked["beyond"]  # the ways out past the commands' own output, walked for real too
    assert b"mnist600" in beyond["ledger page (HTML)"] and b"mnist600" in beyond["ledger page (JSON API)"]
    assert {k.rsplit(" ", 1)[-1] for k in beyond if "KFP artifact" in k} == {"dataset", "model", "synthetic", "metrics"}
    missing = {cmd: sorted(opts - run_with.get(cmd, set())) for cmd, opts in orchestrated().items()}
    assert {c: o for c, o in missing.items() if o} == {}, "options the orchestrators pass that the walk does not"
    assert not inside & set(orchestrated()), "a command the orchestrators run prints inside-only data"


def test_the_orchestrators_path_opens_the_parent_runs_each_stage_and_finish_closes_the_reservation(walked):
    """What Airflow/KFP do, as the walk did it (pipeline run e1): ``pipeline start`` opens the parent run, each stage
    entry point runs with its ids as a child of it, and ``pipeline finish`` (another call) finds the reservation the
    train attempt made, closes the parent and states the ledger (tests/stages/test_pipeline.py's orchestrator path)."""
    from mlflow import MlflowClient
    from mlflow.tracking.context.registry import resolve_tags

    from dpsynth import tracking
    from dpsynth.ledger.store import Ledger
    from tests.stages.test_pipeline import STAGES, _provider_installed

    ran, base = walked["ran"], walked["base"]
    ids = next(json.loads(out) for argv, _, out, _ in ran if argv[:2] == ["pipeline", "start"])
    assert ids["pipeline_run_id"] == "e1" and ids["parent_run_id"]
    summary = next(json.loads(out) for argv, _, out, _ in ran if argv[:2] == ["pipeline", "finish"])
    assert summary["succeeded"] and summary["audit"] == "passed"
    client = MlflowClient(f"sqlite:///{base / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("egress").experiment_id],
                              f"tags.`{tracking.TAG_PIPELINE_RUN_ID}` = 'e1'")
    (parent,) = [r for r in runs if r.data.tags[tracking.TAG_STAGE] == "pipeline"]
    children = [r for r in runs if r is not parent]
    assert parent.info.run_id == ids["parent_run_id"] and parent.info.status == "FINISHED"
    assert {r.data.tags[tracking.TAG_STAGE] for r in children} == set(STAGES)
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in children)
    assert parent.data.metrics["epsilon_total"] == pytest.approx(summary["epsilon_total"])
    # `finish` in another call found the reservation the train attempt made, and it is closed
    (res,) = Ledger(f"sqlite:///{base / 'ledger.db'}").reservations(pipeline_run_id="e1")
    assert parent.data.tags[tracking.TAG_LEDGER_RESERVATION] == str(res["id"])
    assert summary["ledger"]["reservation_ids"] == [res["id"]]
    assert res["status"] == "committed" and 0 < res["epsilon_spent"] <= 10
    # the stages' runs carry the lineage tags of the run-context provider, when it is installed
    if "dpsynth.pipeline_run_id" in resolve_tags({}) or _provider_installed():
        for child in children:
            assert child.data.tags[tracking.TAG_POPULATION] == "mnist600", child.data.tags[tracking.TAG_STAGE]


def test_every_key_the_gswgan_pipeline_logs_is_declared_and_nothing_passes_the_gate(walked, mnist600, tmp_path):
    """tests/stages/test_logged_keys.py's checks on the walk's GS-WGAN run (e1): every key each stage's MLflow run
    holds is declared, nothing before the gate, the audited generator registered once (DPGAN's: on
    tests/stages/test_pipeline.py's tracked run)."""
    from tests.stages.test_logged_keys import check_keys_and_release

    check_keys_and_release(f"sqlite:///{walked['base'] / 'mlflow.db'}", "egress", walked["run"], "gswgan", "e1",
                           source=walked["data"], mnist600=mnist600, tmp_path=tmp_path)


def raw_hashes(walked) -> dict[str, str]:
    """sha256 → what it names, for every sensitive file, every raw hash a sensitive manifest records, the source
    file and the imported copies, and the dataset's content hash; less what the release publishes (its own files'
    bytes, the trace its generator is bound to)."""
    run = walked["run"]
    found = {**sensitive_hashes(run), **file_hashes(walked["imported"].parent)}
    found[hashlib.sha256(Path(walked["source"]).read_bytes()).hexdigest()] = "the source file"
    found[read_parquet(walked["source"]).content_sha256()] = "the dataset's content sha256"
    released = file_hashes(run / "release")
    bound = json.loads((run / "release" / "sample" / "audit.json").read_text())["trace"]["sha256"]
    return {h: what for h, what in found.items() if h not in released and h != bound}


def emitted(walked) -> dict[str, bytes]:
    """Everything that left: each command's stdout and stderr, MLflow's database and artifacts, the release zone."""
    base, run = walked["base"], walked["run"]
    texts = {}
    for i, (argv, code, out, err) in enumerate(walked["ran"]):
        name = " ".join(a for a in argv[:3] if not a.startswith("/"))
        texts[f"{i} {name} (stdout)"], texts[f"{i} {name} (stderr)"] = out.encode(), err.encode()
    texts |= walked["beyond"]
    texts["mlflow.db"] = (base / "mlflow.db").read_bytes()
    texts |= {str(p.relative_to(base)): p.read_bytes() for p in (base / "artifacts").rglob("*") if p.is_file()}
    texts |= {str(p.relative_to(run)): p.read_bytes() for p in (run / "release").rglob("*") if p.is_file()}
    return texts


def test_no_raw_hash_of_the_sensitive_zone_leaves(walked):
    hashes = raw_hashes(walked)
    assert any("discriminator.pt" in what for what in hashes.values())
    assert any("partition/manifest.json" in what for what in hashes.values())
    assert hits(emitted(walked), hashes) == []


def test_no_record_id_leaves(walked):
    ids = read_parquet(walked["source"]).record_ids
    pattern = re.compile("|".join(re.escape(i) for i in ids).encode())
    assert [where for where, text in emitted(walked).items() if pattern.search(text)] == []


def numbers(obj, path=""):
    """(path, value) of every number in a JSON value."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from numbers(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for v in obj:
            yield from numbers(v, f"{path}[]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield path, obj


def json_documents(walked) -> dict[str, object]:
    """Every JSON document that left: each command's --json stdout, MLflow's JSON artifacts, the release zone's."""
    docs = {}
    for where, text in emitted(walked).items():
        if where.endswith(("(stdout)", ".json", "(JSON API)")) or "KFP artifact" in where:
            try:
                docs[where] = json.loads(text)
            except ValueError:
                continue
    return docs


def test_no_per_shard_or_per_class_count_leaves(walked):
    """No number that is a shard's record count, and no list that is the class counts of the training records, of
    a shard or of the held-out records, in any JSON that left (the public counts n and the held-out count are
    their own fields); every manifest entry outside the release zone has its rows withheld."""
    run = walked["run"]
    part = manifest(run, "sensitive", "partition")
    shards = [read_parquet(o["uri"]) for o in part["outputs"] if o["role"] == "shard"]
    heldout = read_parquet(next(o["uri"] for o in part["outputs"] if o["role"] == "heldout"))
    sizes = {len(s) for s in shards} - {part["details"]["training_records"], part["details"]["heldout_records"]}
    counts = [np.bincount(d.labels, minlength=10).tolist() for d in (*shards, heldout)]
    counts.append(np.sum(counts[:-1], axis=0).tolist())
    found = []
    for where, doc in json_documents(walked).items():
        found += [f"{where}: {path} = {v}" for path, v in numbers(doc) if v in sizes and isinstance(v, int)]
        stack = [doc]
        while stack:
            v = stack.pop()
            if isinstance(v, list) and v in counts:
                found.append(f"{where}: class counts {v}")
            stack += list(v.values()) if isinstance(v, dict) else v if isinstance(v, list) else []
            if isinstance(v, dict) and v.get("zone") not in (None, "release") and v.get("rows") is not None:
                found.append(f"{where}: rows of {v.get('uri')}")
    assert found == []


def withheld(walked) -> dict[str, set[str]]:
    """Each command's (and the ledger page's) fields the gate dropped, by path, from its warnings."""
    found: dict[str, set[str]] = {}
    logs = [(" ".join(argv[:2]), err) for argv, _, _, err in walked["ran"]] + [("ledger page", "\n".join(walked["page_log"]))]
    for where, text in logs:
        for names in re.findall(r"egress: withheld field\(s\) no allow-list names: (.*) \(dpsynth/egress\.py\)", text):
            found.setdefault(where, set()).update(names.split(", "))
    return found


def test_every_field_that_leaves_is_declared(walked):
    """The gate dropped nothing on the walk but the planted fields: every field the commands emit is one egress.py
    names (a new field is declared there, with the reason it may leave, or withheld by name — not dropped
    unnoticed)."""
    unplanted = {where: sorted(n for n in names if "planted" not in n) for where, names in withheld(walked).items()}
    assert {where: names for where, names in unplanted.items() if names} == {}


def test_a_planted_field_leaves_by_no_channel(walked):
    """What :func:`plant` planted leaves nowhere — no command's output, no MLflow tag, metric, parameter or artifact,
    no release file, not the card, not the ledger's --json or page — and the gate named each by its path."""
    texts = emitted(walked)
    assert [where for where, text in texts.items() if CANARY.encode() in text] == []
    assert PLANTED_METRIC.encode() not in texts["mlflow.db"] and b"dpsynth.planted" not in texts["mlflow.db"]
    dropped = set().union(*withheld(walked).values())
    for path in ("planted", "manifest.planted", "tag dpsynth.planted", f"metric {PLANTED_METRIC}",
                 "param derived.planted", "[].planted", "reservations[].planted"):
        assert path in dropped, (path, sorted(dropped))


def test_the_gate_is_an_allow_list():
    """A field no shape names does not leave, whatever it holds; a hash outside the release zone leaves keyed, a
    release-zone file's as it is; a count of a sensitive file is withheld."""
    entry = {"role": "shard", "uri": "run/sensitive/partition/shard-0.parquet", "zone": "sensitive", "rows": 181,
             "sha256": "a" * 64, "record_ids": ["t10k:00001"]}
    released = {**entry, "uri": "run/release/sample/synthetic.parquet", "zone": "release", "role": "synthetic"}
    out = egress.let_out({"stage": "partition", "status": "succeeded", "outputs": [entry, released],
                          "details": {"training_records": 550, "shard_sizes": [181, 185, 184]}},
                         "manifest", key=lambda h: "k" * 64)
    assert out["outputs"][0] == {"role": "shard", "uri": entry["uri"], "zone": "sensitive", "rows": None,
                                 "sha256": "k" * 64}
    assert out["outputs"][1]["sha256"] == "a" * 64 and out["outputs"][1]["rows"] == 181
    assert out["details"] == {"training_records": 550}


MLFLOW_WRITES = {"log_metric", "log_metrics", "log_param", "log_params", "set_tag", "set_tags", "log_batch",
                 "set_model_version_tag", "set_registered_model_tag"}


def test_every_mlflow_tag_metric_and_parameter_passes_the_gate():
    """One choke point per channel: no code but dpsynth/tracking.py (whose log_run, run_tags and tag_version call
    the gate) writes an MLflow tag, metric or parameter; a run's start tags go through tracking.run_tags."""
    found = []
    for root in ("components", "mlflow_plugins", "pipelines"):
        for path in (REPO / root).rglob("*.py"):
            if path == REPO / "components" / "dpsynth" / "tracking.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MLFLOW_WRITES:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.func.attr}")
    assert found == []


def test_the_mlflow_gate_drops_what_no_stage_declares(tmp_path, caplog):
    """tracking.log_run: a metric or parameter the stage's keys do not declare, and a tag egress.TAGS does not name,
    reach no run; the warning names them, never their values."""
    import mlflow

    from dpsynth import tracking

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    keys = tracking.LoggedKeys(metrics={"epsilon": "accounted"}, params={"train.seed": "configuration"})
    with tracking.start_run(tracking_uri=uri, experiment="gate", stage="partition",
                            tags={"dpsynth.shard_sizes": "181,185"}) as run:
        tracking.log_run(keys, metrics={"epsilon": 1.5, "shard_0_rows": 181.0},
                         params={"train.seed": 3, "derived.record_id": "t10k:00001"},
                         tags={tracking.TAG_AUDIT: "passed", "dpsynth.dataset_sha256_raw": "ab" * 32})
    data = mlflow.MlflowClient(uri).get_run(run.info.run_id).data
    assert data.metrics == {"epsilon": 1.5} and data.params == {"train.seed": "3"}
    assert {t for t in data.tags if t.startswith("dpsynth.")} >= {tracking.TAG_AUDIT, tracking.TAG_STAGE}
    assert not {"dpsynth.shard_sizes", "dpsynth.dataset_sha256_raw"} & set(data.tags)
    text = caplog.text
    assert "metric shard_0_rows" in text and "param derived.record_id" in text and "tag dpsynth.shard_sizes" in text
    assert "181" not in text and "t10k:00001" not in text and "ab" * 32 not in text


def test_privacy_md_lists_exactly_what_the_gate_lets_out():
    """docs/privacy.md's "What is public" holds the gate's own list (egress.public_fields): a field the gate lets out
    that the doc does not list, or one the doc lists that the gate does not let out, fails."""
    doc = (REPO / "docs" / "privacy.md").read_text()
    listed = re.search(r"<!-- egress:fields[^>]*-->\n(.*?)<!-- /egress:fields -->", doc, re.S)
    assert listed, "docs/privacy.md has no egress:fields list"
    assert listed.group(1) == egress.public_fields()


# Private Evolution's pass (#51: its train and sample outcomes, and MLflow, through the same gate) is
# tests/stages/test_private_evolution_pipeline.py::test_a_private_evolution_run_leaves_only_declared_fields_and_no_raw_hash,
# on that module's one run of the default's six stages.


def keys(obj):
    """Every key of a JSON value, at any depth."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from keys(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from keys(v)


def test_the_operator_files_stay_inside(walked):
    """The files egress.INSIDE_FILES declares are written in the sensitive zone, and nothing that left holds their
    figures: no ceiling and no per-class accuracy in any JSON, only the operator report's path and status."""
    run = walked["run"]
    assert (run / "sensitive" / "evaluate" / "operator.json").is_file()
    assert set(egress.INSIDE_FILES) >= {"evaluate/operator.json"}
    operator = json.loads((run / "sensitive" / "evaluate" / "operator.json").read_text())
    assert "ceiling" in operator and operator["gen2real_per_class"]
    inside = {"gen2real_per_class", "per_class_accuracy", "release_gen2real"}  # the operator report's own keys
    leaked = {where: sorted({k for k in keys(doc) if k in inside or k.startswith("accuracy_class")})
              for where, doc in json_documents(walked).items()}
    assert {w: k for w, k in leaked.items() if k} == {}
    report = json.loads((run / "release" / "evaluate" / "report.json").read_text())
    assert set(report["operator"]) == {"status", "kept_in", "note"}


# --- the walk's passing GS-WGAN run, as tests/stages/test_no_raw_hashes.py's passing run (#33 items 2–3) ----------
# (that module keeps the failing audit's run; the passing one is this walk's, not a second GS-WGAN pipeline)


def test_a_release_publishes_no_raw_hash_but_its_own(walked):
    run, base = walked["run"], walked["base"]
    sensitive = sensitive_hashes(run)
    released = file_hashes(run / "release")
    bound_trace = json.loads((run / "release" / "sample" / "audit.json").read_text())["trace"]["sha256"]
    # what the release publishes: files whose very bytes it holds (the audited generator), the trace it is bound to
    private = {h: what for h, what in sensitive.items() if h not in released and h != bound_trace}
    assert any("discriminator.pt" in what for what in private.values())
    outside = {**store_texts(base), **{f"release/{k}": v for k, v in
                                       ((str(p.relative_to(run / "release")), p.read_bytes())
                                        for p in (run / "release").rglob("*") if p.is_file())}}
    assert hits(outside, private) == []


def test_the_release_states_what_is_public_and_what_the_settings_were_tuned_on(walked):
    from dpsynth.privacy.statement import PUBLIC_FACTS, TUNING

    release = walked["run"] / "release" / "sample"
    for text in ((release / "audit.md").read_text(), json.dumps(manifest(walked["run"], "release", "sample"))):
        assert "n and the label set are public" in text and "hyperparameter search" in text
        assert "version history is public" in text  # #52 item 2: whether and when the records changed
    statement = json.loads((release / "audit.json").read_text())["statement"]
    assert statement["assumptions"][-2:] == [PUBLIC_FACTS, TUNING]


def test_no_per_shard_count_outside_the_sensitive_zone(walked):
    run, base = walked["run"], walked["base"]
    views = [json.loads(p.read_text()) for p in (base / "artifacts").rglob("manifest.json")]
    views += [manifest(run, "release", name) for name in ("sample", "evaluate")]
    assert {v["stage"] for v in views} >= {"partition", "pretrain", "train", "audit", "sample", "evaluate"}
    for v in views:
        for item in (*v["inputs"], *v["outputs"]):
            assert item.get("zone") == "release" or item.get("rows") is None, (v["stage"], item["role"])
    details = manifest(run, "sensitive", "partition")["details"]  # the public counts: n and the held-out count
    assert details["training_records"] > 0 and "heldout_records" in details


def test_the_audit_reads_mlflow_values_tags_and_artifacts(walked, tmp_path):
    """The audit's ``mlflow_values`` check passes on the walk's run, and fails once a raw D_k hash is planted in a tag
    or an artifact of the train run (the key allow-list alone would not see it). Last in this module: it writes to
    the walk's MLflow store, and takes both plants out again."""
    from mlflow import MlflowClient

    from dpsynth.config import load_config
    from dpsynth.stages import audit, protocol
    from tests.stages.helpers import TINY

    run, mlflow_uri = walked["run"], f"sqlite:///{walked['base'] / 'mlflow.db'}"
    report = json.loads((run / "sensitive" / "audit" / "audit.json").read_text())
    (check,) = [c for c in report["checks"] if c["name"] == "mlflow_values"]
    assert check["passed"], check
    cfg = load_config(overrides=[*TINY, "tracking.enabled=true", f"tracking.uri={mlflow_uri}", *GSWGAN])
    ctx = protocol.StageContext.create(cfg, run_dir=str(run))
    train_run = manifest(run, "sensitive", "train")["mlflow_run_id"]
    d0 = next(o for o in manifest(run, "sensitive", "pretrain")["outputs"] if o["role"] == "discriminator")
    assert audit.mlflow_values_check(ctx, run_ids=[train_run], parent_run_id=None)["passed"]
    client = MlflowClient(mlflow_uri)
    client.set_tag(train_run, "note", f"D_0 is {d0['sha256']}")
    try:
        failed = audit.mlflow_values_check(ctx, run_ids=[train_run], parent_run_id=None)
        assert not failed["passed"] and "tag note" in failed["detail"]
    finally:
        client.delete_tag(train_run, "note")
    (tmp_path / "shards.txt").write_text(d0["sha256"])
    client.log_artifact(train_run, str(tmp_path / "shards.txt"))
    try:
        failed = audit.mlflow_values_check(ctx, run_ids=[train_run], parent_run_id=None)
        assert not failed["passed"] and "artifact shards.txt" in failed["detail"]
    finally:
        for planted in (walked["base"] / "artifacts").rglob("shards.txt"):
            planted.unlink()
