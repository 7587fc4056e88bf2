"""A real S3-compatible server for tests: ``moto_server`` on a free loopback port.

A plugin of the test session (tests/conftest.py's ``pytest_plugins``): a test names the fixtures, never imports them.
``moto_endpoint``: one server per test process (each test makes its own bucket: ``s3_bucket``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest


def _moto_server_exe() -> str:
    beside = Path(sys.executable).with_name("moto_server")
    exe = str(beside) if beside.exists() else shutil.which("moto_server")
    if exe is None:
        pytest.skip("moto_server is not installed")
    return exe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint():
    """The URL of a fresh ``moto_server`` subprocess, killed (its whole process group) at teardown."""
    port = _free_port()
    proc = subprocess.Popen(
        [_moto_server_exe(), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on {url} (exit code {proc.poll()})")
                time.sleep(0.1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def s3_env(moto_endpoint, monkeypatch):
    """Point the AWS environment at the server (dummy credentials); returns a boto3 client."""
    import boto3

    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "MLFLOW_S3_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)  # boto3's standard endpoint setting
    return boto3.client("s3", endpoint_url=moto_endpoint)


@pytest.fixture
def s3_bucket(s3_env) -> str:
    """A new, empty bucket; returns its name."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    s3_env.create_bucket(Bucket=name)
    return name
