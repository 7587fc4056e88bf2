"""The stage tests' fixtures (600 bundled MNIST records as a Parquet source), for the plugin's page test."""

import io
from contextlib import redirect_stdout

import pytest

from tests.stages.conftest import mnist600, one_torch_thread, source  # noqa: F401


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
