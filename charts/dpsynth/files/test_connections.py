# `helm test`: MLflow's /health answers OK (when MLFLOW_URL is set), and the ledger database accepts
# PGUSER/PGPASSWORD (a SELECT 1 through SQLAlchemy and psycopg2, as the stages connect). Exit 1 otherwise.
import os
import sys
import urllib.request

import sqlalchemy as sa

failed = []
if os.environ.get("MLFLOW_URL"):
    try:
        with urllib.request.urlopen(os.environ["MLFLOW_URL"].rstrip("/") + "/health", timeout=10) as r:
            body = r.read().decode().strip()
        print(f"MLflow /health: {body}")
        if body != "OK":
            failed.append("mlflow")
    except OSError as exc:
        print(f"MLflow /health: {exc}")
        failed.append("mlflow")
url = sa.engine.URL.create("postgresql+psycopg2", username=os.environ["PGUSER"], password=os.environ["PGPASSWORD"],
                           host=os.environ["PGHOST"], port=int(os.environ["PGPORT"]), database=os.environ["PGDATABASE"])
try:
    with sa.create_engine(url, connect_args={"connect_timeout": 10}).connect() as conn:
        conn.execute(sa.text("SELECT 1"))
    print(f"ledger database {url.render_as_string(hide_password=True)}: reachable")
except sa.exc.SQLAlchemyError as exc:
    print(f"ledger database {url.render_as_string(hide_password=True)}: {exc}")
    failed.append("ledger")
sys.exit(1 if failed else 0)
