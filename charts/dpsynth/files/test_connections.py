# `helm test`: MLflow's /health answers OK and its REST API answers a call carrying the Service's Host header, as
# the stage pods' calls do (when MLFLOW_URL is set; MLflow 3 refuses a Host it does not allow with 403 on every
# path but /health), and the ledger database lets PGUSER/PGPASSWORD (the auditor role) read its populations, through
# SQLAlchemy and psycopg2, as the ledger page connects. Exit 1 otherwise. With MLflow's basic auth (mlflow.auth) the
# API call logs in as MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD, as the MLflow client does.
import base64
import os
import sys
import urllib.error
import urllib.parse
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
    host = urllib.parse.urlsplit(os.environ["MLFLOW_URL"]).netloc  # urllib sends it as the Host header
    try:
        api = os.environ["MLFLOW_URL"].rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1"
        request = urllib.request.Request(api)
        if os.environ.get("MLFLOW_TRACKING_USERNAME"):
            login = f"{os.environ['MLFLOW_TRACKING_USERNAME']}:{os.environ.get('MLFLOW_TRACKING_PASSWORD', '')}"
            request.add_header("Authorization", "Basic " + base64.b64encode(login.encode()).decode())
        with urllib.request.urlopen(request, timeout=10) as r:
            print(f"MLflow API (Host: {host}): {r.status}")
    except urllib.error.HTTPError as exc:
        print(f"MLflow API (Host: {host}): {exc.code} {exc.read()[:200].decode(errors='replace')}")
        failed.append("mlflow-api")
    except OSError as exc:
        print(f"MLflow API (Host: {host}): {exc}")
        failed.append("mlflow-api")
url = sa.engine.URL.create("postgresql+psycopg2", username=os.environ["PGUSER"], password=os.environ["PGPASSWORD"],
                           host=os.environ["PGHOST"], port=int(os.environ["PGPORT"]), database=os.environ["PGDATABASE"])
try:
    with sa.create_engine(url, connect_args={"connect_timeout": 10}).connect() as conn:
        conn.execute(sa.text("SELECT count(*) FROM populations"))  # the auditor role's read (ledger-roles Job)
    print(f"ledger database {url.render_as_string(hide_password=True)}: reachable")
except sa.exc.SQLAlchemyError as exc:
    print(f"ledger database {url.render_as_string(hide_password=True)}: {exc}")
    failed.append("ledger")
sys.exit(1 if failed else 0)
