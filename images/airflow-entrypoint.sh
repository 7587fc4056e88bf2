#!/usr/bin/env bash
# Entrypoint of the dpsynth Airflow image, following the official apache/airflow image's conventions
# (https://airflow.apache.org/docs/docker-stack/entrypoint.html), so that the upstream Helm chart's
# container commands work unchanged:
#   bash ARGS...     -> bash ARGS...      (the chart: bash -c "exec airflow scheduler", bash /clean-logs)
#   python ARGS...   -> python ARGS...
#   airflow ARGS...  -> airflow ARGS...   (the chart's init containers: airflow db check-migrations ...)
#   ARGS...          -> airflow ARGS...   (e.g. `podman run IMAGE scheduler`)
#   (nothing)        -> airflow version
# It runs under dumb-init (PID 1: signals forwarded, zombies reaped) and uses exec, so the command
# receives SIGTERM directly. Any UID works as long as the group is 0 (the chart: 50000:0).
set -euo pipefail

if [[ $# -eq 0 ]]; then
  set -- version
fi
case "$1" in
  bash)    shift; exec /bin/bash "$@" ;;
  python)  shift; exec python "$@" ;;
  airflow) shift ;;
esac
exec airflow "$@"
