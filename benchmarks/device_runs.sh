#!/usr/bin/env bash
# Many benchmarks/utility.py runs side by side on a GPU machine, one process each (1 CPU thread, train.device auto
# picks cuda), read from a jobs file: one run a line, `NAME|ARGS` (ARGS: utility.py's arguments, --out, --results
# and --images left out; lines starting with # are skipped). Each finished run appends its rows (one JSON line
# each, with "job": NAME) to $OUT/runs.jsonl, so a run cut short by LIMIT_S still returns what finished; the logs
# and sample grids come back as $OUT/runs.tar.gz.
#   run(command="JOBS=benchmarks/jobs/FILE bash benchmarks/device_runs.sh", carry=[".whl"], timeout_s=...)
# The set-up (wheels carried in .whl/, one CPU thread a process) is benchmarks/device_env.sh's.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/runs-out}
JOBS=${JOBS:?a jobs file}
LIMIT_S=${LIMIT_S:-420}
W=/tmp/device-runs
# shellcheck source=benchmarks/device_env.sh
. benchmarks/device_env.sh
mkdir -p "$OUT" "$W"
python3 -c "import torch, opacus, mlflow, dpsynth; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit 1
while IFS='|' read -r name args; do
  (
    # shellcheck disable=SC2086
    timeout "$LIMIT_S" python3 benchmarks/utility.py $args --out "$W/$name" --results "$W/$name/res" \
      --images "$W/$name/img" >"$W/$name.log" 2>&1
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(json.dumps({'job': sys.argv[2], **r})) for r in d['rows']]" \
      "$W/$name/res.json" "$name" >>"$OUT/runs.jsonl" 2>/dev/null || echo "{\"job\": \"$name\", \"error\": \"no result\"}" >>"$OUT/runs.jsonl"
  ) &
  sleep 1
done < <(grep -v '^#' "$JOBS" | grep -v '^$')
wait
tar -czf "$OUT/runs.tar.gz" -C "$W" $(cd "$W" && ls -d ./*.log ./*/img 2>/dev/null)
cut -c1-300 "$OUT/runs.jsonl"
