"""One torch thread (the stage tests' autouse fixture) and ``capsys_module``, for the plugin's page test (its data, ``source``: tests/stage_fixtures.py)."""

import io
from contextlib import redirect_stdout

import pytest

from tests.stages.conftest import one_torch_thread  # noqa: F401 (autouse fixtures)


class _Captured:
    def __init__(self):
        self.buffer = io.StringIO()

    def readouterr(self):
        out = self.buffer.getvalue()
        self.buffer.seek(0)
        self.buffer.truncate()
        return type("Out", (), {"out": out, "err": ""})()


@pytest.fixture(scope="module")
def capsys_module():
    """stdout of in-process CLI calls in module-scoped fixtures (pytest's capsys is function-scoped)."""
    captured = _Captured()
    with redirect_stdout(captured.buffer):
        yield captured
