#!/usr/bin/env bash
# The local platform: an MLflow server and Airflow's four services, each in its own process group.
#   scripts/platform.sh up|down|status|config   (config: which databases MLflow and the ledger use)
# Settings (environment): PLATFORM_DIR (default outputs/platform), MLFLOW_PORT (5000), AIRFLOW_PORT (8080),
# HEALTH_TIMEOUT (seconds, 120), PLATFORM_DB (postgres | sqlite; default postgres where a PostgreSQL server
# binary exists), PG_PORT (55432), PG_DIR ($PLATFORM_DIR/postgres). `up` and `down` are idempotent; logs and pid files (one PGID each) live in
# $PLATFORM_DIR/{logs,pids}. With PostgreSQL, `up` starts a local server (scripts/postgres.sh: data in
# $PLATFORM_DIR/postgres, a Unix socket there, no TCP) holding three databases, `mlflow` (MLflow's backend store),
# `ledger` and `airflow` (Airflow's metadata; psycopg2 and asyncpg are in the Airflow venv); without one, it says so
# and all three stay in SQLite files ($PLATFORM_DIR/mlflow.db, ledger.db, airflow/airflow.db). DAG runs log to the MLflow server
# (DPSYNTH_TRACKING_URI, MLFLOW_TRACKING_URI), whose UI serves the auditors' Privacy ledger page
# (/dpsynth/ledger), and are charged to the privacy ledger DPSYNTH_LEDGER_URL (set it to use another). The
# ledger gives no budget by default: `up` gives the bundled MNIST's population (`mnist`, the trigger form's
# default config) its demo budget once, as `make run` does; any other population needs
# `dpsynth ledger set-budget POPULATION --epsilon E --delta D --records N --reason TEXT` before its first run.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$(mkdir -p "${PLATFORM_DIR:-$REPO/outputs/platform}" && cd "${PLATFORM_DIR:-$REPO/outputs/platform}" && pwd)"
MLFLOW_PORT="${MLFLOW_PORT:-5000}"
AIRFLOW_PORT="${AIRFLOW_PORT:-8080}"
STAGE_BIN="$REPO/.venv/stage/bin"
AIRFLOW="$REPO/.venv/airflow/bin/airflow"
SERVICES=(mlflow api-server scheduler dag-processor triggerer)
MLFLOW_URL="http://127.0.0.1:$MLFLOW_PORT"
AIRFLOW_URL="http://127.0.0.1:$AIRFLOW_PORT"

[[ -f "$DIR/secret" ]] || (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d " \n" > "$DIR/secret")
export AIRFLOW_HOME="$DIR/airflow"
export AIRFLOW__CORE__DAGS_FOLDER="$REPO/pipelines/airflow/dags"
export AIRFLOW__CORE__PARALLELISM=4 AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=True
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="$AIRFLOW_URL/execution/"
export AIRFLOW__API__PORT="$AIRFLOW_PORT" AIRFLOW__API__BASE_URL="$AIRFLOW_URL"
export AIRFLOW__API_AUTH__JWT_SECRET="$(cat "$DIR/secret")" AIRFLOW__API__SECRET_KEY="$(cat "$DIR/secret")"
export MLFLOW_TRACKING_URI="$MLFLOW_URL" DPSYNTH_TRACKING_URI="$MLFLOW_URL"
export DPSYNTH_REPO="$REPO" DPSYNTH_STAGE_BIN="$STAGE_BIN/dpsynth" DPSYNTH_RUN_ROOT="${DPSYNTH_RUN_ROOT:-$DIR/runs}"
PG="$REPO/scripts/postgres.sh"
PG_DIR="${PG_DIR:-$DIR/postgres}"
PG_PORT="${PG_PORT:-55432}"
if [[ -z "${PLATFORM_DB:-}" ]]; then
  if PG_MISSING="$("$PG" bin 2>&1 > /dev/null)"; then PLATFORM_DB=postgres; else PLATFORM_DB=sqlite; fi
fi
case "$PLATFORM_DB" in
  postgres) BACKEND_STORE_URI="$("$PG" url "$(mkdir -p "$PG_DIR" && echo "$PG_DIR")" "$PG_PORT" mlflow)"
            DEFAULT_LEDGER_URL="$("$PG" url "$PG_DIR" "$PG_PORT" ledger)"
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="$("$PG" url "$PG_DIR" "$PG_PORT" airflow)" ;;
  sqlite) BACKEND_STORE_URI="sqlite:///$DIR/mlflow.db" DEFAULT_LEDGER_URL="sqlite:///$DIR/ledger.db"
          AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="sqlite:///$AIRFLOW_HOME/airflow.db" ;;
  *) echo "PLATFORM_DB: must be postgres or sqlite, got '$PLATFORM_DB'" >&2; exit 2 ;;
esac
export DPSYNTH_LEDGER_URL="${DPSYNTH_LEDGER_URL:-$DEFAULT_LEDGER_URL}" AIRFLOW__DATABASE__SQL_ALCHEMY_CONN
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false PYTHONUNBUFFERED=1
# No usage telemetry: MLflow 3 reads MLFLOW_DISABLE_TELEMETRY (and DO_NOT_TRACK); Airflow 3.3.2 collects none.
export MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true

running() {  # running NAME: its process group is alive
  local f="$DIR/pids/$1.pid"
  [[ -f "$f" ]] && kill -0 -- "-$(cat "$f")" 2>/dev/null
}

start() {  # start NAME COMMAND...: in a new session (PGID = its pid), unless already running
  local name="$1"; shift
  if running "$name"; then echo "  $name: already running (pgid $(cat "$DIR/pids/$name.pid"))"; return; fi
  setsid "$@" > "$DIR/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$DIR/pids/$name.pid"
}

healthy() {  # MLflow answers /health and Airflow reports every component healthy
  curl -fs "$MLFLOW_URL/health" > /dev/null &&
    curl -fs "$AIRFLOW_URL/api/v2/monitor/health" | "$STAGE_BIN/python" -c '
import json, sys
h = json.load(sys.stdin)
sys.exit(0 if all(h.get(k, {}).get("status") == "healthy"
                  for k in ("metadatabase", "scheduler", "dag_processor", "triggerer")) else 1)' 2>/dev/null
}

up() {
  mkdir -p "$DIR/logs" "$DIR/pids" "$DIR/mlartifacts" "$AIRFLOW_HOME"
  [[ "$PLATFORM_DB" == postgres ]] && "$PG" start "$PG_DIR" "$PG_PORT" mlflow ledger airflow
  config
  # δ stays < 1/n = 1e-4 for the 10,000 records (9 attempts at δ = 1e-5); an existing budget stays as it is
  "$STAGE_BIN/dpsynth" ledger set-budget mnist --if-new --epsilon 90 --delta 9e-5 --records 10000 \
    --reason "make up: the bundled MNIST demo population" > "$DIR/logs/ledger-budget.log"
  start mlflow "$STAGE_BIN/mlflow" server --app-name dpsynth-ledger --host 127.0.0.1 --port "$MLFLOW_PORT" \
    --workers 1 --backend-store-uri "$BACKEND_STORE_URI" --artifacts-destination "$DIR/mlartifacts"
  running api-server || "$AIRFLOW" db migrate > "$DIR/logs/db-migrate.log" 2>&1
  start api-server "$AIRFLOW" api-server --host 127.0.0.1 --port "$AIRFLOW_PORT"
  start scheduler "$AIRFLOW" scheduler
  start dag-processor "$AIRFLOW" dag-processor
  start triggerer "$AIRFLOW" triggerer
  local deadline=$((SECONDS + ${HEALTH_TIMEOUT:-120}))
  until healthy; do
    for s in "${SERVICES[@]}"; do
      running "$s" || { echo "$s exited; see $DIR/logs/$s.log" >&2; tail -20 "$DIR/logs/$s.log" >&2; down; exit 1; }
    done
    (( SECONDS < deadline )) || { echo "not healthy after ${HEALTH_TIMEOUT:-120}s; see $DIR/logs" >&2; down; exit 1; }
    sleep 1
  done
  echo "MLflow:  $MLFLOW_URL   (Privacy ledger: $MLFLOW_URL/dpsynth/ledger)"
  echo "Airflow: $AIRFLOW_URL   (DAGs: $AIRFLOW__CORE__DAGS_FOLDER; logs: $DIR/logs)"
}

config() {  # which databases MLflow and the ledger use, and why
  if [[ "$PLATFORM_DB" == postgres ]]; then
    echo "database: PostgreSQL in $PG_DIR (port $PG_PORT, Unix socket only)"
  else
    echo "database: SQLite files in $DIR (${PG_MISSING:+"no PostgreSQL: $PG_MISSING; "}PLATFORM_DB=sqlite)"
  fi
  echo "MLflow backend store: $BACKEND_STORE_URI"
  echo "ledger: $DPSYNTH_LEDGER_URL"
  echo "Airflow metadata: $AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"
}

session() {  # session SID: the process groups in that session (task processes get their own group)
  ps -eo sid=,pgid= | awk -v s="$1" '$1 == s {print $2}' | sort -u
}

down() {  # TERM every process group of every service's session, wait up to 15 s, then KILL what is left
  local sids=() s f g
  for s in "${SERVICES[@]}"; do
    f="$DIR/pids/$s.pid"
    [[ -f "$f" ]] || continue
    sids+=("$(cat "$f")")
    for g in $(session "$(cat "$f")"); do kill -- "-$g" 2>/dev/null || true; done
  done
  for _ in $(seq 75); do
    [[ -z "$(for s in "${sids[@]}"; do session "$s"; done)" ]] && break
    sleep 0.2
  done
  for s in "${sids[@]}"; do for g in $(session "$s"); do kill -9 -- "-$g" 2>/dev/null || true; done; done
  rm -f "$DIR"/pids/*.pid
  echo "stopped: ${#sids[@]} service(s)"
  if "$PG" status "$PG_DIR" 2>/dev/null; then "$PG" stop "$PG_DIR" && echo "stopped: PostgreSQL ($PG_DIR)"; fi
}

status() {
  local rc=0
  for s in "${SERVICES[@]}"; do
    if running "$s"; then echo "  $s: running (pgid $(cat "$DIR/pids/$s.pid"))"; else echo "  $s: stopped"; rc=1; fi
  done
  if [[ "$PLATFORM_DB" == postgres ]]; then
    if "$PG" status "$PG_DIR"; then echo "  postgres: running ($PG_DIR)"; else echo "  postgres: stopped"; rc=1; fi
  fi
  if healthy 2>/dev/null; then echo "healthy: $MLFLOW_URL $AIRFLOW_URL"; else echo "not healthy"; rc=1; fi
  return $rc
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  config) config ;;
  *) echo "usage: $0 up|down|status|config" >&2; exit 2 ;;
esac
