"""The stage manifest: one JSON file per stage, written last, naming everything the stage read and wrote.

A manifest is the stage's commit record: downstream stages read only what a manifest lists,
check each file's sha256 against it, and a stage whose manifest still matches its config
and inputs is not run again (see :func:`matches`).

>>> m = build(stage="pretrain", status="succeeded", fingerprint="f", dataset_sha256="d",
...           inputs=[], outputs=[], privacy=no_privacy(delta=1e-5, note="nothing private"))
>>> m["format"], m["privacy"]["epsilon"]
('dpsynth.stage_manifest/1', 0.0)
"""

from __future__ import annotations

import datetime as _dt
import json

from dpsynth import storage, tracking
from dpsynth.egress import refusal
from dpsynth.errors import StageError

FORMAT = "dpsynth.stage_manifest/1"
NAME = "manifest.json"
STATUSES = ("succeeded", "failed")


def entry(uri: str, *, role: str, zones: storage.Zones | None = None, rows: int | None = None,
          sha256: str | None = None, **extra) -> dict:
    """One input or output: its URI, role, sha256 (computed unless given), zone and row count."""
    item = {"role": role, "uri": str(uri), "sha256": sha256 if sha256 is not None else storage.sha256(uri)}
    if zones is not None:
        item["zone"] = zones.zone_of(uri)
    if rows is not None:
        item["rows"] = int(rows)
    return {**item, **extra}


def no_privacy(*, delta: float, note: str) -> dict:
    """The privacy record of a stage that runs no mechanism on sensitive data."""
    return {"epsilon": 0.0, "delta": delta, "accountant": "none", "events": [], "note": note}


def build(*, stage: str, status: str, fingerprint: str, dataset_sha256: str, inputs: list[dict],
          outputs: list[dict], privacy: dict, details: dict | None = None, pipeline_run_id: str | None = None,
          parent_run_id: str | None = None, mlflow_run_id: str | None = None) -> dict:
    if status not in STATUSES:
        raise ValueError(f"status: must be one of {STATUSES}, got {status!r}")
    return {
        "format": FORMAT, "stage": stage, "status": status,
        "config_fingerprint": fingerprint, "dataset_sha256": dataset_sha256,
        "inputs": inputs, "outputs": outputs, "privacy": privacy, "details": details or {},
        "pipeline_run_id": pipeline_run_id, "parent_run_id": parent_run_id, "mlflow_run_id": mlflow_run_id,
        **tracking.lineage(),  # code_version, git_sha, image: what code ran
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def write(uri: str, manifest: dict) -> None:
    storage.write_text(uri, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def read(uri: str) -> dict:
    """The manifest at ``uri``; StageError when it is missing or not a manifest."""
    try:
        data = json.loads(storage.read_bytes(uri))
    except FileNotFoundError:
        raise StageError(f"{uri}: no manifest (has the stage run?)") from None
    except json.JSONDecodeError as exc:
        raise StageError(f"{uri}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise StageError(f"{uri}: not a dpsynth stage manifest (expected format {FORMAT!r})")
    return data


def output(manifest: dict, role: str) -> dict:
    """The one output with ``role``."""
    found = outputs(manifest, role)
    if len(found) != 1:
        raise StageError(f"stage {manifest['stage']}: expected one {role!r} output, found {len(found)}")
    return found[0]


def outputs(manifest: dict, role: str) -> list[dict]:
    return [o for o in manifest["outputs"] if o["role"] == role]


def verify(item: dict) -> dict:
    """``item`` unchanged when its file still has the recorded sha256; StageError otherwise."""
    try:
        actual = storage.sha256(item["uri"])
    except FileNotFoundError:
        raise StageError(f"{item['uri']}: listed in a manifest but missing") from None
    if actual != item["sha256"]:  # neither hash is shown: a raw hash of a sensitive file is a membership test (#52)
        raise StageError(refusal(item["uri"], "its sha256 differs from the one its manifest records (the file "
                                 "changed after the stage wrote it)", fix="run the stage that wrote it again"))
    return item


def matches(manifest: dict, *, fingerprint: str, inputs: list[dict]) -> bool:
    """Whether ``manifest`` records a successful run with this config fingerprint and these inputs
    (same roles, URIs and sha256), and every output it lists is still intact."""
    def key(items):
        return sorted((i["role"], i["uri"], i["sha256"]) for i in items)

    if manifest.get("status") != "succeeded" or manifest.get("config_fingerprint") != fingerprint:
        return False
    if key(manifest.get("inputs", [])) != key(inputs):
        return False
    try:
        for item in manifest["outputs"]:
            verify(item)
    except StageError:
        return False
    return True
