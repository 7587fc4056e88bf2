"""A new MLflow SQLite store in a test process starts from a copy of one migrated schema (#53 item 5).

MLflow builds a new store's tables by running its alembic migrations, about 2 CPU-s per store, and the quick
tier makes dozens of stores (one per test that tracks, one per rank). Here the first new SQLite store of a test
process is migrated by MLflow's own ``_initialize_tables`` and its fresh tables are kept as the template; every
later new, empty SQLite store gets them through SQLite's backup API: the same tables, indexes and alembic
revision, no experiment or run (MLflow then creates the default experiment itself, with the store's own
artifact root, and checks the revision as always). Other databases (PostgreSQL), a SQLite file that already
holds tables, and stores made outside the test processes (a ``dpsynth`` subprocess) are left to MLflow.
The template's path is in the environment (``TEMPLATE``), so that the ranks a fork server starts use it too.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile

TEMPLATE = "DPSYNTH_TEST_MLFLOW_TEMPLATE"


def install() -> None:
    """Route MLflow's table creation for new SQLite stores through the template (idempotent)."""
    import mlflow.store.db.utils as db_utils

    if hasattr(db_utils._initialize_tables, "migrate"):
        return
    migrate = db_utils._initialize_tables

    def initialize_tables(engine) -> None:
        if engine.dialect.name != "sqlite":
            return migrate(engine)
        raw = engine.raw_connection()
        try:
            db = raw.driver_connection
            if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                return migrate(engine)  # not an empty database: MLflow's own way
            template = os.environ.get(TEMPLATE)
            if template and os.path.exists(template):
                source = sqlite3.connect(template)
                try:
                    source.backup(db)
                finally:
                    source.close()
                return
        finally:
            raw.close()
        migrate(engine)
        path = os.path.join(tempfile.mkdtemp(prefix="mlflow-template-"), "mlflow.db")
        raw = engine.raw_connection()
        try:
            target = sqlite3.connect(path)
            try:
                raw.driver_connection.backup(target)
            finally:
                target.close()
        finally:
            raw.close()
        os.environ[TEMPLATE] = path

    initialize_tables.migrate = migrate
    db_utils._initialize_tables = initialize_tables
