"""dpsynth_mlflow.context: lineage tags on every MLflow run a stage starts, from the environment the pipeline sets."""

from importlib.metadata import entry_points

import mlflow  # noqa: F401  (first: MLflow loads the provider by its entry point, not half-imported by this test)
import pytest

from dpsynth import tracking
from dpsynth_mlflow.context import LineageContextProvider

ENV = {"DPSYNTH_PIPELINE_RUN_ID": "p-ctx", "DPSYNTH_STAGE": "train", "DPSYNTH_DATASET_VERSION": "ab" * 32,
       "DPSYNTH_POPULATION_ID": "mnist", "DPSYNTH_IMAGE": "registry.example/dpsynth-stage:cpu"}
INSTALLED = any(e.name == "dpsynth" and e.value == "dpsynth_mlflow.context:LineageContextProvider"
                for e in entry_points(group="mlflow.run_context_provider"))


@pytest.fixture
def clean_env(monkeypatch):
    for name in tracking.ENV_CONTEXT.values():
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_out_of_context_without_the_environment(clean_env):
    assert not LineageContextProvider().in_context()


def test_tags_from_the_environment(clean_env):
    for name, value in ENV.items():
        clean_env.setenv(name, value)
    provider = LineageContextProvider()
    assert provider.in_context()
    tags = provider.tags()
    assert tags == {tracking.TAG_PIPELINE_RUN_ID: "p-ctx", tracking.TAG_STAGE: "train",
                    tracking.TAG_DATASET_VERSION: "ab" * 32, tracking.TAG_POPULATION: "mnist",
                    tracking.TAG_IMAGE: "registry.example/dpsynth-stage:cpu",
                    **tracking.lineage_tags()}


@pytest.mark.skipif(not INSTALLED, reason="dpsynth-mlflow is not installed: pip install --no-deps -e mlflow_plugins")
def test_a_run_started_in_a_stage_gets_the_tags_and_explicit_tags_win(clean_env, tmp_path):
    import mlflow

    for name, value in ENV.items():
        clean_env.setenv(name, value)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    with mlflow.start_run(tags={tracking.TAG_STAGE: "audit"}) as run:
        pass
    tags = mlflow.MlflowClient().get_run(run.info.run_id).data.tags
    assert tags[tracking.TAG_PIPELINE_RUN_ID] == "p-ctx" and tags[tracking.TAG_IMAGE] == ENV["DPSYNTH_IMAGE"]
    assert tags[tracking.TAG_DATASET_VERSION] == "ab" * 32 and tags[tracking.TAG_CODE_VERSION]
    assert tags[tracking.TAG_STAGE] == "audit"  # what the caller says wins over the context
