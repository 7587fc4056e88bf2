"""dpsynth warmstart: a recorded no-op for DPGAN, chained to the partition manifest."""

import hashlib
from pathlib import Path

from tests.stages.helpers import manifest, stage, stages


def test_dpgan_warmstart_is_a_recorded_noop(tmp_path, source):
    run = tmp_path / "run"
    stages(run, source, "partition", "warmstart")
    m = manifest(run, "sensitive", "warmstart")
    assert m["status"] == "succeeded" and m["outputs"] == []
    assert m["details"] == {"performed": False, "reason": "method 'dpgan' does not warm-start"}
    assert m["privacy"]["epsilon"] == 0 and m["privacy"]["accountant"] == "none"
    (entry,) = m["inputs"]
    assert entry["role"] == "partition_manifest"
    assert entry["sha256"] == hashlib.sha256(Path(entry["uri"]).read_bytes()).hexdigest()
    assert sorted(p.name for p in (run / "sensitive" / "warmstart").iterdir()) == ["manifest.json"]


def test_needs_a_partition(tmp_path, source, capsys):
    assert stage("warmstart", tmp_path / "run", source) == 2
    assert "no manifest" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
