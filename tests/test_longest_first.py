"""`make test` starts the modules of tests/conftest.py's LONGEST_FIRST first (#35 item 5), `make test-slow` those of
SLOW_LONGEST_FIRST (#53 item 5): each still exists, so a renamed or moved module does not silently drop back to the
end of the run."""

from pathlib import Path

from tests.conftest import LONGEST_FIRST, SLOW_LONGEST_FIRST

REPO = Path(__file__).resolve().parents[1]


def test_the_longest_modules_exist_and_are_listed_once():
    assert [p for p in LONGEST_FIRST if not (REPO / p).is_file()] == []
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)


def test_the_slow_tiers_longest_modules_exist_and_are_listed_once():
    assert [p for p in SLOW_LONGEST_FIRST if not (REPO / p).is_file()] == []
    assert len(set(SLOW_LONGEST_FIRST)) == len(SLOW_LONGEST_FIRST)
