"""scripts/uv_args.py: the Makefile's uv installs from the sources pip is configured with."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("uv_args", ROOT / "scripts" / "uv_args.py")
uv_args = importlib.util.module_from_spec(spec)
spec.loader.exec_module(uv_args)


def test_pip_sources_become_uv_options_each_once():
    listed = "\n".join([
        ":env:.cert='/etc/ssl/certs/ca-certificates.crt'",
        ":env:.find-links='/opt/wheels'",
        "global.constraint='/etc/xdg/pip/constraints.txt'",
        "global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'",
        "global.find-links='/opt/wheels'",
        "global.index-url='https://mirror.example/simple'",
        "global.timeout='60'",
    ])
    assert uv_args.uv_args(listed) == [
        "--find-links", "/opt/wheels",
        "--constraint", "/etc/xdg/pip/constraints.txt",
        "--extra-index-url", "file:///opt/pypi/simple", "--extra-index-url", "file:///opt/pypi-more/simple",
        "--index-url", "https://mirror.example/simple",
    ]


def test_no_pip_configuration_gives_no_arguments():
    assert uv_args.uv_args("") == []
    assert uv_args.uv_args("global.timeout='60'\n") == []


def test_the_script_reads_this_machines_pip_configuration():
    printed = subprocess.run([sys.executable, str(ROOT / "scripts" / "uv_args.py")], capture_output=True, text=True,
                             check=True).stdout.split()
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            check=True).stdout
    assert printed == uv_args.uv_args(listed)
    assert len(printed) % 2 == 0 and all(option.startswith("--") for option in printed[::2])
