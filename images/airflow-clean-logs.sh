#!/usr/bin/env bash
# /clean-logs, as in the official Airflow image: the upstream chart's log-groomer sidecars run
# `bash /clean-logs`. Every AIRFLOW__LOG_CLEANUP_FREQUENCY_MINUTES (15) it deletes task logs older
# than AIRFLOW__LOG_RETENTION_DAYS (15) days under $AIRFLOW_HOME/logs, and then empty directories.
set -euo pipefail

logs="${AIRFLOW_HOME:-/opt/airflow}/logs"
retention="${AIRFLOW__LOG_RETENTION_DAYS:-15}"
every=$(( ${AIRFLOW__LOG_CLEANUP_FREQUENCY_MINUTES:-15} * 60 ))
trap 'exit 0' INT TERM
echo "Cleaning logs older than ${retention} days in ${logs} every ${every} seconds"
while true; do
  find "$logs" -type d -name 'lost+found' -prune -o -type f -name '*.log' -mtime +"$retention" -print0 \
    | xargs -0 -r rm -f || true
  find "$logs" -mindepth 1 -type d -empty -delete || true
  sleep "$every" & wait $!
done
