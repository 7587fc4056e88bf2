#!/usr/bin/env bash
# The generality benchmark (#32) on a GPU machine: every benchmark dataset, every row
# (default release at ε = 10 and 1, the ceiling, the warm-up alone, the GAN phase alone), the datasets side
# by side (one process each, 2 CPU threads each; train.device auto picks cuda). Results under $OUT:
# results/generality-NAME.{json,md}, images/generality-NAME-*.png, logs/NAME.log.
#
# Runs on a bare machine with torch but without opacus / prv-accountant / pydantic: carry them as wheels in
# .whl/ (the repo root's ignored folder, see /work/.library/device/README.md, Notes), e.g.
#   run(command="bash benchmarks/device_generality.sh", carry=[".whl"], timeout_s=600)
# DATASETS (space-separated) and LIMIT_S (default 540) may be set in the environment.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/generality-out}
LIMIT_S=${LIMIT_S:-540}
DATASETS=${DATASETS:-"letters shapes shapes-rgb symbols-rgb greek"}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/components:$PWD/mlflow_plugins${PYTHONPATH:+:$PYTHONPATH}
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs" "$OUT/results" "$OUT/images"
python3 -c "import torch, dpsynth; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), dpsynth.__file__)"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
pids=()
for d in $DATASETS; do
  timeout "$LIMIT_S" python3 benchmarks/utility.py --dataset "$d" --epsilons 10,1 --rows default,ceiling,warmup,gan \
    --out /tmp/generality-bench --results "$OUT/results/generality-$d" --images "$OUT/images" >"$OUT/logs/$d.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
tail -n 3 "$OUT"/logs/*.log
ls -l "$OUT/results"
