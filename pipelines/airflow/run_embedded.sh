#!/usr/bin/env bash
# `make run`: the six stages through Airflow on the bundled MNIST, with no services running:
# `airflow dags test dpsynth_train` executes the DAG in-process (Airflow venv), each stage runs in
# the stage venv, MLflow writes to a local SQLite store. The terminal shows each task as it starts and
# the stages' own messages and progress bars; the full output goes to a log file. Prints the per-stage
# table at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-outputs}
CONFIG=${CONFIG:-configs/dpgan-mnist-cpu.yaml}
case "$OUT" in /*) ROOT="$OUT" ;; *) ROOT="$PWD/$OUT" ;; esac
RUN_ID="make-run-$(date -u +%Y%m%dT%H%M%SZ)"
TRACKING="sqlite:///$ROOT/mlflow.db"
DATASET="$ROOT/data/mnist.parquet"

export AIRFLOW_HOME="$ROOT/airflow-home"
export AIRFLOW__CORE__DAGS_FOLDER="$PWD/pipelines/airflow/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="sqlite:///$AIRFLOW_HOME/airflow.db"
export DPSYNTH_STAGE_BIN="$PWD/.venv/stage/bin/dpsynth"
export DPSYNTH_TRACKING_URI="$TRACKING"  # a platform setting (not on the trigger form)
export PYTHONUNBUFFERED=1
# No usage telemetry, as on the platform (scripts/platform.sh): MLflow 3 reads MLFLOW_DISABLE_TELEMETRY and DO_NOT_TRACK.
export MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true
mkdir -p "$AIRFLOW_HOME"

.venv/stage/bin/dpsynth data import data/mnist "$DATASET"
# The ledger never gives a population a budget by default: `make run` creates its demo population's
# explicitly, once (an existing budget is left as it is), in the ledger the stages use (beside the SQLite
# MLflow store: $ROOT/ledger.db). When it is spent, `dpsynth pipeline start` refuses the run and says how
# to raise it: dpsynth ledger set-budget mnist --epsilon E --delta D --reason TEXT
# (δ stays < 1/n = 1e-4 for the 10,000 records: at δ = 1e-5 per attempt, 9 attempts in all).
# The DAG run is charged to this population (its trigger form's population id), whatever $CONFIG says.
POPULATION=mnist
.venv/stage/bin/dpsynth ledger set-budget "$POPULATION" --db "sqlite:///$ROOT/ledger.db" --if-new --epsilon 90 \
    --delta 9e-5 --records 10000 --reason "make run: the bundled MNIST demo population"
# MLflow's SQLite migration is not safe when several stage processes create the store at once.
.venv/stage/bin/python -c "import mlflow; mlflow.MlflowClient('$TRACKING').search_experiments()" 2>/dev/null
.venv/airflow/bin/airflow db migrate > "$AIRFLOW_HOME/db-migrate.log" 2>&1

# The DAG's trigger form: the settings it has a field for come from $CONFIG (each field's --set
# overrides the config file, so leaving one at the form's default would change the run).
CONF=$(.venv/stage/bin/python - "$CONFIG" "$DATASET" "$ROOT/runs" "$TRACKING" "$RUN_ID" "$POPULATION" <<'PY'
import json, sys
from dpsynth.config import load_config
from dpsynth.errors import DpsynthError
config, dataset, run_root, tracking, run_id, population = sys.argv[1:]
try:
    c = load_config(config)
except DpsynthError as exc:
    sys.exit(f"dpsynth: error: {exc}")
# only what a UI trigger fills in: every other field empty, the config's (the config is validated above)
print(json.dumps({"dataset_uri": dataset, "config": config, "run_root": run_root, "pipeline_run_id": run_id,
                  "population_id": population}))
PY
)
LOG="$AIRFLOW_HOME/$RUN_ID.log"

# What the terminal shows of Airflow's output (all of it goes to $LOG): each task as it starts, the lines
# of the `dpsynth` logger and the progress bars of the stage processes, Airflow's errors, the end of the
# run. (`read` takes each line as it comes; awk would wait for a full input buffer.)
progress() {
    local line task index state
    while IFS= read -r line; do
        case "$line" in
            *"[DAG TEST] starting task_id="*)
                task=${line#*task_id=}; task=${task%% *}
                index=${line#*map_index=}; index=${index%% *}
                [[ $index == -1 ]] || task="$task #$index"
                echo "-- task $task" ;;
            *"DagRun Finished"*)
                state=${line#*, state=}; echo "-- DAG run finished: ${state%%[ ,]*}" ;;
            [0-9][0-9]:[0-9][0-9]:[0-9][0-9]" dpsynth "* | *"%|"* | *"[error"*)
                echo "   $line" ;;
        esac
    done
}

echo "airflow dags test dpsynth_train (pipeline run $RUN_ID); full log: $LOG"
SECONDS=0
if ! .venv/airflow/bin/airflow dags test dpsynth_train -c "$CONF" 2>&1 | tee "$LOG" | progress; then
    tail -n 40 "$LOG"
    echo "the DAG run failed after ${SECONDS} s; full log: $LOG" >&2
    exit 1
fi
echo "DAG run succeeded in ${SECONDS} s; full log: $LOG"
.venv/stage/bin/dpsynth pipeline show --config "$CONFIG" --run-dir "$ROOT/runs/$RUN_ID" \
    --pipeline-run-id "$RUN_ID" --set "tracking.uri=$TRACKING" --set "ledger.population_id=$POPULATION"
echo "Look at it in the MLflow UI:  make mlflow-ui${OUT:+ OUT=$OUT}   (then http://127.0.0.1:5000)"
