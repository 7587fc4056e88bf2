"""dpsynth sample: releases the generator and synthetic data only after a passed audit of that generator."""

import hashlib
import json
import re

import numpy as np

from dpsynth.data import read_parquet
from tests.stages.helpers import manifest, release_files, stage, stages


def test_refuses_without_a_passed_audit_of_this_generator(trained, source, capsys):
    assert stage("sample", trained, source) == 2
    assert "without a passed audit" in capsys.readouterr().err
    stages(trained, source, "audit")
    with open(trained / "sensitive" / "train" / "generator.pt", "ab") as fh:
        fh.write(b"\0")  # changed after the audit
    assert stage("sample", trained, source) == 2
    err = capsys.readouterr().err
    assert "is not the audited generator's" in err
    assert not re.search(r"[0-9a-f]{64}", err)  # neither hash: the refusal names the file and the check (#52 item 3)
    assert release_files(trained) == []


def test_releases_the_audited_generator_and_synthetic_data(trained, source, mnist600, capsys):
    stages(trained, source, "audit", "sample")
    m = manifest(trained, "release", "sample")
    assert m["status"] == "succeeded" and m["privacy"]["epsilon"] == 0
    assert all(o["zone"] == "release" for o in m["outputs"])
    assert sorted(release_files(trained)) == sorted(f"sample/{n}" for n in (
        "audit.json", "audit.md", "generator.pt", "manifest.json", "samples.png", "synthetic.parquet"))
    audit = json.loads((trained / "release" / "sample" / "audit.json").read_text())
    released = (trained / "release" / "sample" / "generator.pt").read_bytes()
    assert hashlib.sha256(released).hexdigest() == audit["generator"]["sha256"]
    assert released == (trained / "sensitive" / "train" / "generator.pt").read_bytes()
    assert m["details"]["release"]["epsilon"] == audit["epsilon_upper_bound"] <= 10
    synthetic = read_parquet(trained / "release" / "sample" / "synthetic.parquet")
    assert len(synthetic) == 200 and synthetic.shape == (28, 28, 1)
    assert np.bincount(synthetic.labels).tolist() == [20] * 10  # balanced, not the real label counts
    assert not set(synthetic.record_ids) & set(mnist600.record_ids)
    capsys.readouterr()
    assert stage("sample", trained, source, flags=["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "skipped"


def test_refuses_after_a_failed_audit_and_releases_nothing(trained, source, capsys):
    assert stage("audit", trained, source, "privacy.accounting=as_published") == 2  # never passes
    capsys.readouterr()
    assert stage("sample", trained, source) == 2
    assert "did not pass" in capsys.readouterr().err
    assert release_files(trained) == []
    # a report edited to say "passed" no longer has the sha256 its audit manifest recorded
    report = trained / "sensitive" / "audit" / "audit.json"
    data = json.loads(report.read_text())
    data["decision"] = "passed"
    data["checks"] = [dict(c, passed=True) for c in data["checks"]]
    report.write_text(json.dumps(data))
    assert stage("sample", trained, source) == 2
    assert "sha256" in capsys.readouterr().err
    assert release_files(trained) == []
