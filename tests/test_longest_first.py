"""`make test` starts the modules of tests/conftest.py's LONGEST_FIRST first (#35 item 5): each still exists, so a
renamed or moved module does not silently drop back to the end of the run."""

from pathlib import Path

from tests.conftest import LONGEST_FIRST

REPO = Path(__file__).resolve().parents[1]


def test_the_longest_modules_exist_and_are_listed_once():
    assert [p for p in LONGEST_FIRST if not (REPO / p).is_file()] == []
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
