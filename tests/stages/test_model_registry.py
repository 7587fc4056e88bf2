"""Released generators in the MLflow Model Registry: only the sample stage registers, only past a passed audit;
each release is a new version of dpsynth-<population>-<method> and takes the ``released`` alias.
(The passing pipeline's version, its tags and its outputs: tests/stages/test_logged_keys.py's checks. A failed audit
that registers nothing and a second release that takes the alias: tests/stages/test_pipeline.py::
test_a_failed_audit_registers_nothing_and_each_passed_release_takes_the_alias, on that module's tracked run rather
than a run of its own.)"""

from __future__ import annotations

import pytest

from dpsynth import tracking
from dpsynth.errors import DpsynthError


def test_a_store_without_the_registry_is_a_clear_error(tmp_path):
    with pytest.raises(DpsynthError, match="tracking.uri: cannot register .* database-backed store"):
        tracking.register_release(tracking_uri=(tmp_path / "mlruns").as_uri(), model_id="m-0", population_id="p",
                                  method="dpgan", tags={})


@pytest.mark.parametrize("population, name", [("mnist", "dpsynth-mnist-dpgan"), ("clinic a/b", "dpsynth-clinic-a-b-dpgan")])
def test_registered_model_names(population, name):
    assert tracking.registered_model_name(population, "dpgan") == name
