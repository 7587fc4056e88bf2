#!/usr/bin/env bash
# A recipe on MNIST under several partition keys (each a different 10 % hold-out that no setting was chosen on),
# every (key, ε) its own process side by side: writes the jobs file and runs it with benchmarks/device_runs.sh
# (results in $OUT/runs.jsonl, one JSON line a row, "job": KEY-ε).
#   run(command="RECIPE=generic bash benchmarks/device_keys.sh", carry=[".whl"], timeout_s=...)
# RECIPE (benchmarks/utility.py --recipe), KEYS, EPSILONS, LIMIT_S and OUT may be set.
set -u
cd "$(dirname "$0")/.."
RECIPE=${RECIPE:-generic}
KEYS=${KEYS:-"confirm-a confirm-b confirm-c confirm-d confirm-e"}
EPSILONS=${EPSILONS:-"10 1"}
export LIMIT_S=${LIMIT_S:-240} OUT=${OUT:-/tmp/keys-out}
JOBS=$(mktemp /tmp/keys-jobs.XXXXXX)
for k in $KEYS; do
  for e in $EPSILONS; do
    echo "$k-$e|--dataset mnist --recipe $RECIPE --rows default --epsilons $e --set partition.key=$k" >>"$JOBS"
  done
done
JOBS=$JOBS exec bash benchmarks/device_runs.sh
