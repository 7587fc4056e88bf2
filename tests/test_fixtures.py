"""The services' fixtures (a PostgreSQL server, moto's S3 server, the Airflow venv and its fork server) and the stage
tests' data and trained run are plugins of the test session (tests/conftest.py's ``pytest_plugins``), and no test
module imports one: pytest takes a fixture imported into a module for that module's own, so a session-scoped one ran
once per module that imported it (#53: seven Airflow homes and fork servers, eight PostgreSQL servers, each module's
own `airflow db migrate`)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import pytest_plugins

TESTS = Path(__file__).resolve().parent


def fixtures(module: str) -> set[str]:
    tree = ast.parse((TESTS.parent / (module.replace(".", "/") + ".py")).read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)
            and any("fixture" in ast.unparse(d) for d in node.decorator_list)}


def test_the_plugins_define_the_services_fixtures():
    assert {"pg_server", "postgres"} <= fixtures("tests.pg_fixtures")
    assert {"moto_endpoint", "s3_env", "s3_bucket"} <= fixtures("tests.s3_fixtures")
    assert {"airflow_env", "migrated_db", "airflow_db"} <= fixtures("tests.airflow_fixtures")
    assert {"mnist600", "source", "trained_once", "trained"} <= fixtures("tests.stage_fixtures")


def test_no_test_module_imports_a_plugins_fixture():
    imported = []
    for module in pytest_plugins:
        names = fixtures(module)
        for path in sorted(TESTS.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module == module:
                    imported += [f"{path.relative_to(TESTS)}:{node.lineno} {a.name}" for a in node.names
                                 if a.name in names]
    assert imported == []
