#!/usr/bin/env bash
# The generality benchmark (#32) on a GPU machine: the suite `generality` of benchmarks/suites.toml (MNIST and six
# sets that are not digits, the default and the generic recipe, every row of each), every row its own process side
# by side, 1 CPU thread each (each row draws and imports its set); train.device auto picks cuda.
#   run(command="bash benchmarks/device_generality.sh", carry=[".whl"], timeout_s=600)
# DATASETS (space-separated), LIMIT_S (default 480; the whole script then takes about 9 minutes) and OUT may be set.
set -u
cd "$(dirname "$0")/.."
DATASETS=${DATASETS:-"mnist letters shapes shapes-rgb letters-rgb symbols-rgb greek"}
ROWS=""
for d in $DATASETS; do ROWS="$ROWS $d $d-generic"; done
export SUITE=generality ROWS LIMIT_S=${LIMIT_S:-480} OUT=${OUT:-/tmp/generality-out}
exec bash benchmarks/device_runs.sh
