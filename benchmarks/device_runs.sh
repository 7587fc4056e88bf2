#!/usr/bin/env bash
# A suite of benchmarks/suites.toml on a GPU machine, every row its own process side by side (1 CPU thread each;
# train.device auto picks cuda), each cut at LIMIT_S seconds: benchmarks/run.py SUITE [ROWS] --jobs N. Each row that
# finishes is stored in $OUT/results/SUITE.json (then, here: benchmarks/run.py --merge that file; run.py keeps the
# latest run of each row); the logs come back as $OUT/logs.tar.gz.
#   run(command="SUITE=shape-directions bash benchmarks/device_runs.sh", carry=[".whl"], timeout_s=...)
# SUITE, ROWS (globs, space-separated; default all), JOBS (default: every row at once), LIMIT_S and OUT may be set.
# The set-up (wheels carried in .whl/, one CPU thread a process) is benchmarks/device_env.sh's.
set -u
cd "$(dirname "$0")/.."
SUITE=${SUITE:?a suite of benchmarks/suites.toml}
ROWS=${ROWS:-}
OUT=${OUT:-/tmp/runs-out}
LIMIT_S=${LIMIT_S:-420}
# shellcheck source=benchmarks/device_env.sh
. benchmarks/device_env.sh
mkdir -p "$OUT"
python3 -c "import torch, opacus, mlflow, dpsynth; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit 1
# shellcheck disable=SC2086
N=$(python3 benchmarks/run.py "$SUITE" $ROWS --list | wc -l)
# shellcheck disable=SC2086
python3 benchmarks/run.py "$SUITE" $ROWS --jobs "${JOBS:-$N}" --timeout "$LIMIT_S" --results "$OUT/results" \
  --out /tmp/device-runs
status=$?
tar -czf "$OUT/logs.tar.gz" -C /tmp/device-runs logs
exit $status
