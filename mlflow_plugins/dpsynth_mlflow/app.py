"""``mlflow server --app-name dpsynth-ledger``: the MLflow server plus the auditors' Privacy ledger page.

The page (``/dpsynth/ledger``, JSON at ``/dpsynth/ledger.json``) reads the ledger at
``$DPSYNTH_LEDGER_URL`` and the server's own tracking store, read-only.

Authentication: with ``DPSYNTH_LEDGER_AUTH=basic`` the app is MLflow's own basic-auth app (what
``--app-name basic-auth`` serves: users and permissions in its database, ``$MLFLOW_AUTH_CONFIG_PATH``; it needs
the ``mlflow[auth]`` extra, Flask-WTF, which the stage lock has) with the ledger routes on it, so the page asks for
the same login as MLflow; MLflow fails closed (``MLFLOW_BASIC_AUTH_FAIL_CLOSED``, the chart sets it) and denies
non-admin users every route it has no permission rule for, the ledger's included (it shows every population: an
auditor's page). The chart's ``mlflow.auth`` (on by default) runs it so. Without it the page is as open as the
server (put an authenticating proxy in front, as for MLflow itself).
"""

from __future__ import annotations

import os

LEDGER_ENV = "DPSYNTH_LEDGER_URL"
AUTH_ENV = "DPSYNTH_LEDGER_AUTH"  # "basic": MLflow's basic authentication in front of MLflow and the ledger page
PAGE = "/dpsynth/ledger"


def _data():
    from mlflow.server.constants import BACKEND_STORE_URI_ENV_VAR

    from dpsynth_mlflow.ledger_view import LedgerView

    ledger_url = os.environ.get(LEDGER_ENV)
    if not ledger_url:
        return None, f"set {LEDGER_ENV} to the ledger's SQLAlchemy URL and restart the server"
    tracking_uri = os.environ.get(BACKEND_STORE_URI_ENV_VAR) or os.environ.get("MLFLOW_TRACKING_URI")
    key = (ledger_url, tracking_uri)
    if key not in _VIEWS:  # one incremental reader per (ledger, store), kept for the server's life
        _VIEWS[key] = LedgerView(ledger_url=ledger_url, tracking_uri=tracking_uri)
    return _VIEWS[key].gather(), None


_VIEWS: dict = {}


def ledger_page():
    from flask import Response

    from dpsynth_mlflow.ledger_view import render

    data, problem = _data()
    if problem:
        return Response(f"<h1>Privacy ledger</h1><p>{problem}</p>", status=503, mimetype="text/html")
    return Response(render(data), mimetype="text/html")


def ledger_json():
    from flask import Response

    from dpsynth_mlflow.ledger_view import to_json

    data, problem = _data()
    if problem:
        return Response(to_json({"error": problem}), status=503, mimetype="application/json")
    return Response(to_json(data), mimetype="application/json")


def add_routes(app) -> None:
    prefix = os.environ.get("_MLFLOW_STATIC_PREFIX", "").rstrip("/")
    if "dpsynth_ledger" not in app.view_functions:
        app.add_url_rule(prefix + PAGE, "dpsynth_ledger", ledger_page, methods=["GET"])
        app.add_url_rule(prefix + PAGE + ".json", "dpsynth_ledger_json", ledger_json, methods=["GET"])


def create_app():
    """The factory MLflow's server calls: its Flask app with the ledger routes (wrapped in its
    FastAPI app when the server runs under uvicorn, the default)."""
    from mlflow.environment_variables import _MLFLOW_SGI_NAME
    from mlflow.server import app

    add_routes(app)
    auth = os.environ.get(AUTH_ENV, "").strip().lower()
    if auth == "basic":
        from mlflow.server.auth import create_app as with_basic_auth

        return with_basic_auth(app)  # authenticates every request (the ledger's too); wraps for uvicorn itself
    if auth:
        raise ValueError(f"{AUTH_ENV}: 'basic' or unset, got {auth!r}")
    if _MLFLOW_SGI_NAME.get() == "uvicorn":
        from mlflow.server.fastapi_app import create_fastapi_app

        return create_fastapi_app(app)
    return app
