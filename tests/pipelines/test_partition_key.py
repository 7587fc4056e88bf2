"""#55 item 6: a cluster's partition key comes from a Kubernetes Secret, read by the partition stage only.

The orchestrators give the partition pod ``DPSYNTH_PARTITION_KEY`` (from the Secret) and
``DPSYNTH_REQUIRE_PARTITION_KEY=true`` (tests/deploy/test_cluster_runbook.py checks the pods they build); here the
stage itself, run as the pod runs it: the Secret's key replaces the config's (the image's base config carries the
demo's public key), and a pod without the key, or with the demo's, is refused (exit 2, a verdict) before anything
is written. Before, the only route was ``partition.key`` in a ConfigMap or the trigger form, in plain text.
"""

from __future__ import annotations

import hashlib

import pytest

from dpsynth.data import import_source, write_parquet
from tests.stages.helpers import MNIST, dpsynth, manifest, settings


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "mnist200.parquet"
    write_parquet(import_source(MNIST).subset(range(200)), path)
    return str(path)


def partition(run, source, monkeypatch, **env) -> int:
    for name in ("DPSYNTH_PARTITION_KEY", "DPSYNTH_REQUIRE_PARTITION_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return dpsynth("partition", "--run-dir", run, *settings(source), "--json")


def test_the_secrets_key_replaces_the_configs(tmp_path, source, monkeypatch, capsys):
    assert partition(tmp_path / "a", source, monkeypatch, DPSYNTH_PARTITION_KEY="a-secret-of-ours",
                     DPSYNTH_REQUIRE_PARTITION_KEY="true") == 0
    key = manifest(tmp_path / "a", "sensitive", "partition")["details"]["key"]
    assert key == "redacted:sha256:" + hashlib.sha256(b"a-secret-of-ours").hexdigest()[:16]  # not the config's
    assert "a-secret-of-ours" not in capsys.readouterr().out
    # another key assigns the records anew: the stage does not reuse the other key's partition
    assert partition(tmp_path / "a", source, monkeypatch, DPSYNTH_PARTITION_KEY="another-secret") == 0
    again = manifest(tmp_path / "a", "sensitive", "partition")["details"]["key"]
    assert again == "redacted:sha256:" + hashlib.sha256(b"another-secret").hexdigest()[:16]


@pytest.mark.parametrize("key, says", [("", "which the partition pod did not get"),
                                       ("dpsynth-partition-v1", "the bundled MNIST demo's public key")])
def test_a_cluster_pod_without_its_key_or_with_the_demos_is_refused(tmp_path, source, monkeypatch, capsys, key, says):
    code = partition(tmp_path / "run", source, monkeypatch, DPSYNTH_REQUIRE_PARTITION_KEY="true",
                     **({"DPSYNTH_PARTITION_KEY": key} if key else {}))
    err = capsys.readouterr().err
    assert code == 2 and "partition.key: " in err and says in err, err
    assert not (tmp_path / "run" / "sensitive" / "partition").exists()  # nothing written


def test_without_the_requirement_the_config_key_stands(tmp_path, source, monkeypatch, capsys):
    """`make run` and the local stages: no Secret, the config's (demo) key, as before."""
    assert partition(tmp_path / "run", source, monkeypatch) == 0
    key = manifest(tmp_path / "run", "sensitive", "partition")["details"]["key"]
    assert key == "redacted:sha256:" + hashlib.sha256(b"dpsynth-partition-v1").hexdigest()[:16]
