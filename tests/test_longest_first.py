"""`make test` starts the modules of tests/conftest.py's LONGEST_FIRST first (#35 item 5), `make test-slow` those of
SLOW_LONGEST_FIRST (#53 item 5): each still exists, so a renamed or moved module does not silently drop back to the
end of the run. Nor from SHARED_SERVICE, whose groups of modules run on one worker each."""

from pathlib import Path

from tests.conftest import LONGEST_FIRST, SHARED_SERVICE, SLOW_LONGEST_FIRST, shared_service

REPO = Path(__file__).resolve().parents[1]


def test_the_longest_modules_exist_and_are_listed_once():
    assert [p for p in LONGEST_FIRST if not (REPO / p).is_file()] == []
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)


def test_the_slow_tiers_longest_modules_exist_and_are_listed_once():
    assert [p for p in SLOW_LONGEST_FIRST if not (REPO / p).is_file()] == []
    assert len(set(SLOW_LONGEST_FIRST)) == len(SLOW_LONGEST_FIRST)


def test_the_shared_service_groups_name_existing_modules_once_and_are_the_schedules_units():
    modules = [p for group in SHARED_SERVICE.values() for p in group]
    assert [p for p in modules if not (REPO / p).is_file()] == []
    assert len(set(modules)) == len(modules)
    assert shared_service("tests/distributed/test_launch.py::test_x[TrainJob]") == "forked ranks"
    assert shared_service("tests/pipelines/test_airflow.py::test_y") == "airflow"
    assert shared_service("tests/pipelines/test_methods.py::TestKfp::test_z") is None  # xdist's own scope
