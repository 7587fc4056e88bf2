"""A local stage task streams the stage's stderr into the Airflow task log while the stage runs.

``dpsynth_pipeline`` imports Airflow, so these checks run in the Airflow venv (a forked child) against
a stand-in stage script: no wall-clock assertions, the stand-in waits until its first line has
been copied before it goes on.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.airflow_fixtures import in_airflow

REPO = Path(__file__).resolve().parents[2]
AIRFLOW_PYTHON = REPO / ".venv" / "airflow" / "bin" / "python"
DAGS = REPO / "pipelines" / "airflow" / "dags"

pytestmark = pytest.mark.skipif(not AIRFLOW_PYTHON.exists(),
                                reason=".venv/airflow is missing: `make test` creates it from requirements/airflow.lock")

# A stand-in for the `dpsynth` console script: a log line, then (once that line has reached the task
# log, signalled by the file GO) progress-bar redraws, then its JSON result on stdout; exit code EXIT.
STAGE = """\
#!{python}
import json, os, sys, time
sys.stderr.write("12:00:00 dpsynth INFO partition: started\\n"); sys.stderr.flush()
for _ in range(600):
    if os.path.exists({go!r}):
        break
    time.sleep(0.1)
else:
    sys.exit(9)
sys.stderr.write("\\rsteps 1/3\\rsteps 2/3\\rsteps 3/3\\n"); sys.stderr.flush()
print(json.dumps({{"stage": sys.argv[1], "status": "succeeded"}}))
sys.exit({exit})
"""

CHECK = """
import io, json, os, sys
sys.path.insert(0, {dags!r})
import dpsynth_pipeline as p

p.QUIET = {quiet!r}
seen = []
def write(line, flush=False):
    seen.append(line)
    if {signal!r} in line:
        open({go!r}, "w").close()  # only now may the stage go on: this line came through first

p.print = write  # the task log
try:
    result, error = p._run_local(["partition", "--json"]), None
except RuntimeError as exc:
    result, error = None, str(exc)

redraws = io.BytesIO(b"\\rbar 1\\rbar 2\\rbar 3\\rbar 4\\r")
throttled = []
p.stream(redraws, write=throttled.append, clock=lambda: 0.0)
print(json.dumps({{"seen": seen, "result": result, "error": error, "throttled": throttled}}))
"""


def run_task(airflow_env: dict, tmp_path: Path, exit_code: int, *, signal: str = "partition: started",
             quiet: float = 600.0) -> dict:
    """CHECK in the Airflow venv (a child of the fork server that has imported Airflow: tests/
    airflow_fixtures.py's ``in_airflow``), with the stand-in stage as DPSYNTH_STAGE_BIN."""
    go, stage = tmp_path / "go", tmp_path / "dpsynth"
    stage.write_text(STAGE.format(python=sys.executable, go=str(go), exit=exit_code))
    stage.chmod(0o755)
    return in_airflow(CHECK.format(dags=str(DAGS), go=str(go), signal=signal, quiet=quiet),
                      {**airflow_env, "DPSYNTH_STAGE_BIN": str(stage)})


def test_stage_lines_reach_the_task_log_while_the_stage_runs(airflow_env, tmp_path):
    out = run_task(airflow_env, tmp_path, exit_code=0)
    assert out["error"] is None and out["result"] == {"stage": "partition", "status": "succeeded"}
    lines = out["seen"]
    assert lines[0].startswith("dpsynth partition: running ") and lines[1] == "12:00:00 dpsynth INFO partition: started"
    # redraws a progress bar makes within PROGRESS_EVERY seconds are copied once; its final line always
    assert lines[2:] == ["steps 1/3", "steps 3/3"]
    # a bar still redrawing when the stage ends: its first and last redraw
    assert out["throttled"] == ["bar 1", "bar 4"]


def test_a_failing_stage_raises_with_the_end_of_its_stderr(airflow_env, tmp_path):
    out = run_task(airflow_env, tmp_path, exit_code=3)
    assert out["result"] is None
    assert out["error"].startswith("dpsynth partition exited 3:") and "steps 3/3" in out["error"]


def test_a_silent_stage_gets_a_still_running_line(airflow_env, tmp_path):
    # the stand-in goes on only once the task log said it is still running
    out = run_task(airflow_env, tmp_path, exit_code=0, signal="still running", quiet=0.5)
    assert out["error"] is None
    (beat,) = [line for line in out["seen"] if "still running" in line][:1]
    assert re.fullmatch(r"\d\d:\d\d:\d\d dpsynth INFO partition: still running, \d+ s so far", beat)
