"""The browser tests need the Airflow venv and Debian's Chromium. Without them they are skipped, and
the last lines of the pytest run say how many and the command that enables them."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent


def pytest_unconfigure(config):  # after pytest's final "N passed, M skipped" line
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    reasons = Counter()
    for report in reporter.stats.get("skipped", []):
        path = (config.rootpath / report.nodeid.split("::")[0]).resolve()
        if HERE in path.parents and isinstance(report.longrepr, tuple):
            reasons[report.longrepr[2].removeprefix("Skipped: ")] += 1
    for reason, count in reasons.items():
        reporter.write_line(f"NOTE: {count} browser test(s) in tests/platform skipped: {reason}", yellow=True, bold=True)
