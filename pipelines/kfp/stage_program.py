"""The program of every dpsynth_pipeline container (``python -c <this file's text> OUT dpsynth ARGS...``).

It runs ``dpsynth ARGS`` after resolving the pseudo-options ``dpsynth_pipeline._cli_args`` puts in ARGS:

- ``--config-file PATH``: ``--config PATH``, or nothing when PATH is empty;
- ``--extra-settings JSON``: ``--set ITEM`` per item; a setting that is not a run's (``dpsynth.config.refusal``: an
  allow-list of recipe settings) is refused (exit 2, one line naming it and who sets it);
- ``--kfp-input NAME PATH`` (repeated): an upstream task's output artifact, this task's ``Input[...]``
  (:data:`UPSTREAM`), checked before the stage runs (:func:`check_inputs`): it must name a manifest of the upstream
  stage in this run's directory that exists; otherwise exit 2, naming the input;
- ``--kfp-artifact NAME PATH`` (repeated) and ``--kfp-executor-output PATH``: the task's KFP output artifacts
  (:data:`ARTIFACTS`), written from the stage's ``--json`` outcome after it succeeded: a small JSON file at the
  artifact's local path and the same fields as the artifact's metadata in KFP's executor output file (the launcher
  merges them into the artifact it records, so the lineage view shows which file of the run it is). Every sha256
  there comes from the outcome's manifest as the stage printed it: the outside view (keyed version ids for files
  outside the release zone, never their raw hashes).

A verdict is never repeated by a retry (KFP's retry policy cannot filter by exit status): when ``dpsynth`` exits 2
(a DpsynthError: bad input, a refused budget, a failed audit), the program records that under the run's sensitive
zone (``verdicts/<pipeline run id>/<command>``) before exiting 2; a retried attempt of that task finds the record and
exits 2 at once, without running the command again (no second draw, no second charge). Any other failure (a killed
pod, exit 1) leaves no record, so the retry runs the stage, which resumes from what its manifests and checkpoints
record. When OUT is not empty (``pipeline start``), the printed parent run id is written to OUT (KFP's output
parameter).
"""
import json
import os
import pathlib
import signal
import subprocess
import sys

VERDICT = 2  # dpsynth's exit status for a DpsynthError
# KFP output artifact name -> (manifest list, entry role), or None: the stage's numeric details (a Metrics artifact)
ARTIFACTS = {"dataset": ("inputs", "source"), "model": ("outputs", "generator"),
             "synthetic": ("outputs", "synthetic"), "metrics": None}
# KFP input artifact name -> the stage whose manifest it names (dpsynth_pipeline.INPUTS_OF)
UPSTREAM = {"partitioned": "partition", "trained": "train", "sampled": "sample"}
OPTIONS = {}  # the pseudo-options resolve() took out: "inputs", "artifacts" [(name, path)], "executor_output"


def resolve(argv):
    out, it = [], iter(argv)
    OPTIONS.clear()
    for a in it:
        if a == "--config-file":
            path = next(it)
            out += ["--config", path] if path else []
        elif a == "--extra-settings":
            from dpsynth.config import refusal

            items = [str(item) for item in json.loads(next(it) or "[]")]
            if refused := [line for item in items if (line := refusal(item))]:
                print("\n".join(f"dpsynth: error: extra settings: {line}" for line in refused), file=sys.stderr)
                sys.exit(VERDICT)
            out += [a for item in items for a in ("--set", item)]
        elif a == "--kfp-input":
            OPTIONS.setdefault("inputs", []).append((next(it), next(it)))
        elif a == "--kfp-artifact":
            OPTIONS.setdefault("artifacts", []).append((next(it), next(it)))
        elif a == "--kfp-executor-output":
            OPTIONS["executor_output"] = next(it)
        else:
            out.append(a)
    return out


def _option(argv, name):
    return argv[argv.index(name) + 1] if name in argv[:-1] else ""


def verdict_record(argv):
    """Where a verdict of this task is recorded: under the run's sensitive zone, per pipeline run and command (a
    pre-training shard per shard); None without a run directory or pipeline run id."""
    run_dir, run_id = _option(argv, "--run-dir"), _option(argv, "--pipeline-run-id")
    if not (run_dir and run_id):
        return None
    from dpsynth import storage

    head = argv[1:argv.index("--json")] if "--json" in argv else argv[1:2]
    command = "-".join(a.lstrip("-") for a in head)
    return storage.join(storage.Zones.from_root(run_dir.rstrip("/")).sensitive, "verdicts", run_id, command)


def check_inputs(argv):
    """The problem with this task's input artifacts (one line), or None: each must be the JSON an upstream task
    wrote (:func:`write_artifacts`) for the stage :data:`UPSTREAM` names, with a manifest under this run's directory
    that exists (a run's task cannot consume another run's output)."""
    from dpsynth import storage

    run_dir = _option(argv, "--run-dir").rstrip("/")
    for name, path in OPTIONS.get("inputs", []):
        try:
            fields = json.loads(pathlib.Path(path).read_text())
        except (OSError, ValueError) as exc:
            return f"input artifact {name}: unreadable ({exc})"
        uri = str(fields.get("manifest_uri") or "")
        if fields.get("stage") != UPSTREAM[name]:
            return f"input artifact {name}: from stage {fields.get('stage')!r}, expected {UPSTREAM[name]!r}"
        if not (run_dir and uri.startswith(run_dir + "/")):
            return f"input artifact {name}: its manifest {uri or '(none)'} is not in this run's directory {run_dir}"
        if not storage.exists(uri):
            return f"input artifact {name}: its manifest {uri} does not exist"
        print(f"dpsynth: input {name}: the {fields['stage']} stage's manifest {uri}", file=sys.stderr)
    return None


def artifacts(outcome):
    """(name, fields) of each requested artifact, from the stage's ``--json`` outcome."""
    m = outcome.get("manifest") or {}
    for name, path in OPTIONS.get("artifacts", []):
        where = ARTIFACTS[name]
        if where is None:  # the stage's numbers, as KFP's Metrics artifact shows them
            fields = {k: v for k, v in (m.get("details") or {}).items()
                      if isinstance(v, (int, float)) and not isinstance(v, bool)}
        else:
            entry = next((e for e in m.get(where[0], []) if e.get("role") == where[1]), {})
            fields = {"uri": entry.get("uri"), "sha256": entry.get("sha256"),
                      "content_sha256": entry.get("content_sha256"),
                      "role": where[1], "stage": outcome.get("stage"), "status": outcome.get("status"),
                      "manifest_uri": outcome.get("manifest_uri"), "mlflow_run_id": outcome.get("mlflow_run_id"),
                      "epsilon": (m.get("privacy") or {}).get("epsilon")}
        yield name, path, fields


def write_artifacts(outcome):
    produced = {}
    for name, path, fields in artifacts(outcome):
        pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(path).write_text(json.dumps(fields, indent=2) + "\n")
        produced[name] = {"artifacts": [{"metadata": fields}]}
    if produced and OPTIONS.get("executor_output"):
        out = pathlib.Path(OPTIONS["executor_output"])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"artifacts": produced}))


def run(argv, capture):
    """``argv``'s exit status; its stdout (echoed) when ``capture``. SIGTERM (the pod deleted) reaches the stage."""
    child = subprocess.Popen(argv, stdout=subprocess.PIPE if capture else None, text=True)
    signal.signal(signal.SIGTERM, lambda sig, frame: child.send_signal(sig))
    stdout, _ = child.communicate()
    if capture and stdout:
        sys.stdout.write(stdout)
        sys.stdout.flush()
    return child.returncode, stdout


def main(args):
    out, argv = args[0], resolve(args[1:])
    record = verdict_record(argv)
    if record is not None:
        from dpsynth import storage

        if storage.exists(record):
            print(f"dpsynth: an earlier attempt of this task exited {VERDICT} (a verdict, recorded at {record}): "
                  "not run again", file=sys.stderr)
            return VERDICT
    if problem := check_inputs(argv):
        print(f"dpsynth: error: {problem}", file=sys.stderr)
        return VERDICT
    code, stdout = run(argv, capture=bool(out or OPTIONS.get("artifacts")))
    if code == VERDICT and record is not None:
        try:
            storage.write_bytes(record, b"2\n")
        except Exception as exc:  # noqa: BLE001 — the verdict stands even when it cannot be recorded
            print(f"dpsynth: the verdict could not be recorded at {record} ({exc}): a retry would run the stage "
                  "again", file=sys.stderr)
    if code:
        return code if code > 0 else 128 - code
    if out:
        ids = json.loads(stdout)
        pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(out).write_text(ids["parent_run_id"] or "")  # "" when MLflow tracking is off
    if OPTIONS.get("artifacts"):
        write_artifacts(json.loads(stdout))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
