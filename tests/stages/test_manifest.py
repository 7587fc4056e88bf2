"""The stage manifest: entries, verification and the re-run rule."""

import doctest

import re

import pytest

from dpsynth import storage
from dpsynth.errors import StageError
from dpsynth.stages import manifest


def test_doctests():
    assert doctest.testmod(manifest).failed == 0


def test_matches_only_the_same_config_inputs_and_intact_outputs(tmp_path):
    zones = storage.Zones.from_root(tmp_path)
    src, out = tmp_path / "sensitive" / "in.bin", tmp_path / "sensitive" / "out.bin"
    storage.write_bytes(src, b"input")
    storage.write_bytes(out, b"output")
    inputs = [manifest.entry(str(src), role="source", zones=zones)]
    m = manifest.build(stage="partition", status="succeeded", fingerprint="f", dataset_sha256="d", inputs=inputs,
                       outputs=[manifest.entry(str(out), role="shard", zones=zones, rows=3)],
                       privacy=manifest.no_privacy(delta=1e-5, note=""))
    assert m["outputs"][0]["zone"] == "sensitive" and m["outputs"][0]["rows"] == 3
    assert manifest.matches(m, fingerprint="f", inputs=inputs)
    assert not manifest.matches(m, fingerprint="g", inputs=inputs)
    assert not manifest.matches({**m, "status": "failed"}, fingerprint="f", inputs=inputs)
    storage.write_bytes(src, b"changed input")
    assert not manifest.matches(m, fingerprint="f", inputs=[manifest.entry(str(src), role="source")])
    storage.write_bytes(out, b"changed output")
    assert not manifest.matches(m, fingerprint="f", inputs=inputs)
    with pytest.raises(StageError, match="differs from the one its manifest records") as e:
        manifest.verify(m["outputs"][0])
    assert not re.search(r"[0-9a-f]{64}", str(e.value))  # neither hash: a raw shard hash is a membership test (#52)
    storage.write_text(tmp_path / "m.json", "{}")
    with pytest.raises(StageError, match="not a dpsynth stage manifest"):
        manifest.read(str(tmp_path / "m.json"))
