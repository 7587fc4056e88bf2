"""Released generators in the MLflow Model Registry: only the sample stage registers, only past a passed audit;
each release is a new version of dpsynth-<population>-<method> and takes the ``released`` alias.
(The passing pipeline's version, its tags and its outputs: tests/stages/test_logged_keys.py.)"""

from __future__ import annotations

import json

import pytest

from dpsynth import storage, tracking
from dpsynth.errors import DpsynthError
from tests.stages.helpers import stage, stages


def test_a_failed_audit_registers_nothing_and_each_passed_release_takes_the_alias(tmp_path, source):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracked = ("tracking.enabled=true", f"tracking.uri={uri}", "tracking.experiment=registry-test")
    run_dir = tmp_path / "run"
    client = MlflowClient(uri)
    stages(run_dir, source, "partition", "pretrain", "train", overrides=tracked)

    # the audit fails (a paper's own accounting never passes): sample refuses, the registry stays empty
    assert stage("audit", run_dir, source, *tracked, "privacy.accounting=as_published") == 2
    assert json.loads(storage.read_bytes(f"{run_dir}/sensitive/audit/audit.json"))["decision"] == "failed"
    assert stage("sample", run_dir, source, *tracked) != 0
    assert client.search_registered_models() == [] and client.search_model_versions() == []

    # the same generator, audited again with sound accounting: released once, then (--force) a second time
    assert stage("audit", run_dir, source, *tracked) == 0
    assert stage("sample", run_dir, source, *tracked) == 0
    name = tracking.registered_model_name("mnist600", "dpgan")
    assert [m.name for m in client.search_registered_models()] == [name] == ["dpsynth-mnist600-dpgan"]
    assert client.get_model_version_by_alias(name, "released").version in (1, "1")
    assert stage("sample", run_dir, source, *tracked, flags=("--force",)) == 0
    versions = {str(v.version): client.get_model_version(name, v.version) for v in client.search_model_versions()}
    assert sorted(versions) == ["1", "2"]
    assert versions["2"].aliases == ["released"] and versions["1"].aliases == []
    assert versions["1"].tags[tracking.TAG_TRACE_SHA256] == versions["2"].tags[tracking.TAG_TRACE_SHA256]
    assert all(v.tags[tracking.TAG_AUDIT] == "passed" for v in versions.values())
    released = json.loads(storage.read_bytes(f"{run_dir}/release/sample/manifest.json"))["details"]["release"]
    assert released["registered_model"] == {"name": name, "version": "2", "alias": "released"}


def test_a_store_without_the_registry_is_a_clear_error(tmp_path):
    with pytest.raises(DpsynthError, match="tracking.uri: cannot register .* database-backed store"):
        tracking.register_release(tracking_uri=(tmp_path / "mlruns").as_uri(), model_id="m-0", population_id="p",
                                  method="dpgan", tags={})


@pytest.mark.parametrize("population, name", [("mnist", "dpsynth-mnist-dpgan"), ("clinic a/b", "dpsynth-clinic-a-b-dpgan")])
def test_registered_model_names(population, name):
    assert tracking.registered_model_name(population, "dpgan") == name
