#!/usr/bin/env bash
# A recipe on MNIST under several partition keys (each a different 10 % hold-out that no setting was chosen on),
# on a GPU machine, every (key, ε) its own process side by side, 1 CPU thread each. Each finished run appends one
# line of JSON (its generality row) to $OUT/keys.jsonl, so a run cut short still returns what finished.
#   run(command="RECIPE=generic bash benchmarks/device_keys.sh", carry=[".whl"], timeout_s=...)
# RECIPE (benchmarks/utility.py --recipe), KEYS, EPSILONS and LIMIT_S may be set.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/keys-out}
RECIPE=${RECIPE:-generic}
KEYS=${KEYS:-"confirm-a confirm-b confirm-c confirm-d confirm-e"}
EPSILONS=${EPSILONS:-"10 1"}
LIMIT_S=${LIMIT_S:-240}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/components:$PWD/mlflow_plugins${PYTHONPATH:+:$PYTHONPATH}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
python3 benchmarks/utility.py --dataset mnist --rows none --out /tmp/gk/mnist >/dev/null 2>&1
for k in $KEYS; do
  for e in $EPSILONS; do
    (
      mkdir -p "/tmp/gk/$k-$e/mnist" && cp -r /tmp/gk/mnist/mnist/data "/tmp/gk/$k-$e/mnist/"
      timeout "$LIMIT_S" python3 benchmarks/utility.py --dataset mnist --recipe "$RECIPE" --rows default --epsilons "$e" \
        --set "partition.key=$k" --out "/tmp/gk/$k-$e" --results "/tmp/gk/res-$k-$e" --images "/tmp/gk/img-$k-$e" \
        >"/tmp/gk/$k-$e.log" 2>&1
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(json.dumps({'key': sys.argv[2], **r})) for r in d['rows']]" \
        "/tmp/gk/res-$k-$e.json" "$k" >>"$OUT/keys.jsonl" 2>/dev/null || echo "{\"key\": \"$k\", \"epsilon_target\": $e, \"error\": \"no result\"}" >>"$OUT/keys.jsonl"
    ) &
  done
done
wait
cut -c1-400 "$OUT/keys.jsonl"
