"""#34 item 10: a retrain spends no ε when the data did not change since its population's last *release*, compared
with the version the last released run (audit passed, sampled) trained on — not with the newest import, which an
import whose run failed or never ran would make "unchanged" though nothing was released for it."""

from __future__ import annotations

import json

import numpy as np

from dpsynth.data import import_source, write_parquet
from dpsynth.data import versions
from tests.stages.helpers import dpsynth, settings


def imported(src, dst, capsys) -> str:
    assert dpsynth("data", "import", "--json", "--outside", "--versioned", "--", src, dst) == 0
    return json.loads(capsys.readouterr().out)["versioned_uri"]


def start(run_dir, uri, run_id, capsys, *flags) -> dict:
    code = dpsynth("pipeline", "start", "--run-dir", run_dir, "--pipeline-run-id", run_id, *settings(uri), *flags)
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out.strip().splitlines()[-1])


def test_no_retrain_when_the_data_is_the_last_release_and_a_retrain_when_it_changed(
        tmp_path, source, capsys, ledger_with_budget):
    ledger = ledger_with_budget
    dst = tmp_path / "data" / "mnist.parquet"
    first = imported(source, dst, capsys)
    # imported but never released (say its first run failed): a retrain runs, though it is the newest import
    assert imported(source, dst, capsys) == first
    assert "skipped" not in start(tmp_path / "r0", first, "r0", capsys, "--unless-released")

    assert dpsynth("pipeline", "run", "--run-dir", tmp_path / "r1", "--pipeline-run-id", "r1", *settings(first)) == 0
    capsys.readouterr()
    assert versions.released(first, "mnist600") == versions.version_of(first)[1]  # the sample stage recorded it
    charged = ledger.history("mnist600")

    # the same data again: no run opened, nothing reserved or charged, no run directory
    skipped = start(tmp_path / "r2", first, "r2", capsys, "--unless-released")
    assert skipped["skipped"].startswith("data.uri: version ") and skipped["parent_run_id"] is None
    assert ledger.history("mnist600") == charged and not (tmp_path / "r2").exists()
    # a manual run (no --unless-released) is the operator's choice: it starts
    assert "skipped" not in start(tmp_path / "r3", first, "r3", capsys)
    # another population's release is not this one's
    assert versions.released(first, "another") is None

    # new records: a new version, so a retrain
    other = tmp_path / "other.parquet"
    ds = import_source(source)
    write_parquet(ds.subset(np.arange(len(ds) - 50)), other)
    changed = imported(other, dst, capsys)
    assert changed != first
    assert "skipped" not in start(tmp_path / "r4", changed, "r4", capsys, "--unless-released")
