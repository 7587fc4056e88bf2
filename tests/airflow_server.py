"""A fork server for the Airflow tests' snippets (tests/airflow_fixtures.py's ``in_airflow``), run by the
Airflow venv's python: it imports Airflow once (about 3 CPU-s an interpreter), then runs each snippet in a child
forked from that import, with the snippet's own environment, working directory and output files, so that the
DAG folder is parsed afresh by every snippet, as in a new interpreter.

Protocol: one JSON request a line on stdin ``{"code", "env", "stdout", "stderr"}``; one JSON line back on
stdout ``{"rc"}``, the child's exit status. The server only preloads modules that read nothing from the
environment the requests may change (the caller starts one server per Airflow home and settings).
"""

import json
import os
import sys
import traceback

import airflow  # noqa: F401  (the import each snippet would otherwise repeat)
import airflow.dag_processing.dagbag  # noqa: F401
import airflow.providers.cncf.kubernetes.operators.pod  # noqa: F401  (DPSYNTH_EXECUTOR=kubernetes: ~0.9 CPU-s a snippet)
import airflow.sdk  # noqa: F401
import kubernetes.client  # noqa: F401


def run(request: dict) -> int:
    """In the forked child: the snippet with its environment and its output files."""
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    try:
        exec(compile(request["code"], "<in_airflow>", "exec"), {"__name__": "__main__"})
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main() -> None:
    out = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        out.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            sys.stdin.close()
            rc = 1
            try:
                rc = run(request)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(rc)
        _, status = os.waitpid(pid, 0)
        out.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
