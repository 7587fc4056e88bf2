"""Every way out of the sensitive zone, walked (issue #52): nothing that leaves holds a raw hash of a sensitive-zone
file, a per-shard or per-class count, or a record id.

The entry points are enumerated, not listed by hand: every leaf command of the ``dpsynth`` parser, and for the
commands the orchestrators run (their words are string constants of pipelines/: the Airflow DAGs, the KFP pipeline
and its compiled YAML) every option the orchestrators pass them (``warmstart --shard``, ``train --launch``,
``data import --outside``, ``pipeline start --unless-released`` …). A command a new commit adds, or an option the
pipelines start to pass, that this walk does not run fails :func:`test_the_walk_covers_every_entry_point`; a command
that prints data to its user on purpose (``data info``) must be named in :data:`dpsynth.egress.INSIDE`, with why, and
must not be one the orchestrators run.

One small GS-WGAN run (K = 3 shards warm-started one task each, the richest in per-shard data), MLflow on: every
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
from dpsynth.stages import launch
from tests.stages.helpers import dpsynth, manifest, settings
from tests.stages.test_no_raw_hashes import file_hashes, hits, sensitive_hashes

pytestmark = pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha:UserWarning")

REPO = Path(__file__).resolve().parents[2]
PIPELINES = REPO / "pipelines"
GSWGAN = ("train.method=gswgan", "partition.num_shards=3", "gswgan.d_width=4", "gswgan.g_width=4",
          "gswgan.latent_dim=8", "gswgan.batch_size=16", "train.n_d=2", "gswgan.warmstart_iterations=2", "train.steps=4")
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
        from tests.stages.test_launch import TEMPLATE

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
               f"tracking.artifact_location={base / 'artifacts'}", *GSWGAN)
    ran: list[tuple[list[str], int, str, str]] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPSYNTH_LEDGER_URL", ledger)

        def call(*argv) -> int:
            with captured() as got:
                code = dpsynth(*argv)
            ran.append(([str(a) for a in argv], code, got["out"], got["err"]))
            return code

        imported = base / "import" / "mnist600.parquet"
        assert call("data", "import", "--json", "--outside", "--versioned", "--", source, imported) == 0
        data = json.loads(ran[-1][2])["versioned_uri"]
        stage_settings = settings(data, *tracked)
        assert call("ledger", "set-budget", "mnist600", "--epsilon", "1000", "--delta", "1e-3", "--records", "600",
                    "--reason", "egress walk", "--json") == 0
        ids = ["--pipeline-run-id", "e1"]
        assert call("pipeline", "start", "--unless-released", "--run-dir", run, *ids, *stage_settings, "--json") == 0
        parent = ["--parent-run-id", json.loads(ran[-1][2])["parent_run_id"]]
        on = ["--run-dir", run, *ids, *parent, *stage_settings, "--json"]
        assert call("partition", *on) == 0
        for k in range(3):  # the fan-out: one task per shard, each an XCom
            assert call("warmstart", "--shard", k, *on) == 0
        for stage in ("warmstart", "train"):
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
        beyond = {"ledger page (JSON API)": ..., "ledger page (HTML)": ..., **kfp_artifacts(ran)}
        from dpsynth_mlflow.ledger_view import gather, render  # the auditor's page, as the MLflow server serves it

        page = gather(ledger_url=ledger, tracking_uri=mlflow_uri)
        beyond["ledger page (JSON API)"] = json.dumps(page, default=str).encode()
        beyond["ledger page (HTML)"] = render(page).encode()
    return {"base": base, "run": run, "ran": ran, "source": source, "imported": imported, "beyond": beyond}


def kfp_artifacts(ran) -> dict[str, bytes]:
    """What the KFP container program (pipelines/kfp/stage_program.py, the text the containers run) makes of each
    stage's --json outcome: its output artifacts (dataset, model, synthetic data, the Metrics of the stage's numeric
    details), which KFP's UI and metadata store keep."""
    program = {"__name__": "dpsynth_stage_program"}
    exec((PIPELINES / "kfp" / "stage_program.py").read_text(), program)  # noqa: S102 — what the containers run
    program["OPTIONS"]["artifacts"] = [(name, f"/unused/{name}") for name in program["ARTIFACTS"]]
    out = {}
    for i, (argv, code, stdout, _) in enumerate(ran):
        if code == 0 and argv[0] in ("partition", "warmstart", "train", "audit", "sample", "evaluate") \
                and "--shard" not in argv:
            for name, _, fields in program["artifacts"](json.loads(stdout)):
                out[f"{i} {argv[0]}: KFP artifact {name}"] = json.dumps(fields).encode()
    return out


def test_the_walk_covers_every_entry_point(walked):
    commands = cli_commands()
    inside = set(egress.INSIDE)
    assert inside <= set(commands), "egress.INSIDE names a command that does not exist"
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


def test_every_field_that_leaves_is_declared(walked):
    """The gate dropped nothing on the walk: every field the commands emit is one egress.py names (a new field is
    declared there, with the reason it may leave, or withheld by name — not dropped unnoticed)."""
    warned = [f"{' '.join(argv[:2])}: {line}" for argv, _, _, err in walked["ran"] for line in err.splitlines()
              if "egress: withheld field" in line]
    assert warned == [], "\n".join(warned)


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
