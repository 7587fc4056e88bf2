#!/usr/bin/env bash
# The generality benchmark (#32) on a GPU machine: every benchmark dataset, every row of the default recipe
# (default release at ε = 10 and 1, the ceiling, the warm-up alone, the GAN phase alone) and the generic
# recipe (configs/dpgan-generic-cpu.yaml) at ε = 10 and 1. Every (dataset, row) is its own process with its own
# --out (own ledger; the partition is the same keyed hash, so the same records), all side by side, 1 CPU thread
# each; train.device auto picks cuda. Results under $OUT: results/generality-NAME.{json,md} (the default recipe,
# merged), results/generality-NAME-generic.{json,md}, images/*.png, logs/*.log.
#
# The set-up (wheels carried in .whl/, one CPU thread a process) is benchmarks/device_env.sh's, e.g.
#   run(command="bash benchmarks/device_generality.sh", carry=[".whl"], timeout_s=600)
# DATASETS (space-separated), JOBS (which of the jobs below) and LIMIT_S (default 480; the whole script then takes about 9 minutes) may be set.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/generality-out}
LIMIT_S=${LIMIT_S:-480}
DATASETS=${DATASETS:-"letters shapes shapes-rgb letters-rgb symbols-rgb greek"}
JOBS=${JOBS:-"eps10 eps1 warmup gan generic10 generic1"}
DEV_JOBS=${DEV_JOBS:-}  # jobs run on the development sets (and mnist) only: recipe variants, never on a confirmation set
DEV_SETS="letters shapes shapes-rgb letters-rgb mnist"
# shellcheck source=benchmarks/device_env.sh
. benchmarks/device_env.sh
mkdir -p "$OUT/logs" "$OUT/parts" "$OUT/results" "$OUT/images"
python3 -c "import torch, dpsynth; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), dpsynth.__file__)"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
args_for() {  # job -> utility.py arguments
  case $1 in
    eps10) echo "--rows default,ceiling --epsilons 10" ;;
    eps1) echo "--rows default --epsilons 1" ;;
    warmup) echo "--rows warmup" ;;
    gan) echo "--rows gan" ;;
    generic10) echo "--recipe generic --rows default,ceiling --epsilons 10" ;;
    generic1) echo "--recipe generic --rows default --epsilons 1" ;;
    gwarmup) echo "--recipe generic --rows warmup" ;;
    ggan) echo "--recipe generic --rows gan" ;;
    # a variant of the generic recipe at ε = 1 (development sets only): the class means at σ = 10 and the
    # polarity shapes kept at σ_p = 6 (ε ≈ 0.80 for the releases), in place of dropping the polarity shapes
    gv1) echo "--recipe generic --rows default --epsilons 1 --set warmup.noise_multiplier=10 --set warmup.polarity_noise_multiplier=6" ;;
  esac
}
for d in $DATASETS; do  # draw and import each set once, side by side, before the runs (each run copies it)
  python3 benchmarks/utility.py --dataset "$d" --rows none --out "/tmp/gb/$d" >"$OUT/logs/$d-import.log" 2>&1 &
done
wait
pids=()
for d in $DATASETS; do
  jobs_for_d=$JOBS
  case " $DEV_SETS " in *" $d "*) jobs_for_d="$JOBS $DEV_JOBS" ;; esac
  for j in $jobs_for_d; do
    mkdir -p "/tmp/gb/$d-$j/$d"
    cp -r "/tmp/gb/$d/$d/data" "/tmp/gb/$d/$d/folders" "/tmp/gb/$d-$j/$d/" 2>/dev/null
    # shellcheck disable=SC2046
    timeout "$LIMIT_S" python3 benchmarks/utility.py --dataset "$d" $(args_for "$j") --out "/tmp/gb/$d-$j" \
      --results "$OUT/parts/$d-$j" --images "$OUT/images/$j" >"$OUT/logs/$d-$j.log" 2>&1 &
    pids+=($!)
  done
done
for p in "${pids[@]}"; do wait "$p"; done
python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
from utility import generality_markdown
out = Path(sys.argv[1])
sets = {}
for part in sorted((out / "parts").glob("*.json")):
    d = json.loads(part.read_text())
    job = part.stem[len(d["dataset"]) + 1:]
    recipe = "-generic-v1" if job == "gv1" else "-generic" if job.startswith("g") else ""
    s = sets.setdefault(d["dataset"] + recipe, {k: v for k, v in d.items() if k != "rows"} | {"rows": []})
    s["rows"] += d["rows"]
order = {"ceiling": 0, "default": 1, "warmup": 2, "gan": 3}
for name, s in sets.items():  # the generic recipe's table shows the same set's ceiling
    base = name.split("-generic")[0]
    src = next((sets[b] for b in (base + "-generic", base) if b in sets and b != name), None)
    if src and not any(r.get("row") == "ceiling" for r in s["rows"]):
        s["rows"] += [r for r in src["rows"] if r.get("row") == "ceiling"]
for name, s in sets.items():
    s["rows"].sort(key=lambda r: (order.get(r.get("row"), 9), -(r.get("epsilon_target") or 0)))
    s["device"] = "GPU machine (benchmarks/device_generality.sh)"
    (out / f"results/generality-{name}.json").write_text(json.dumps(s, indent=2) + "\n")
    (out / f"results/generality-{name}.md").write_text(
        f"Dataset `{s['dataset']}`, {s['role']} set, on the GPU machine: {json.dumps({k: v for k, v in s.items() if k != 'rows'})}\n\n"
        + generality_markdown(s["rows"]))
    print(name); print(generality_markdown(s["rows"]))
EOF
tail -qn 2 "$OUT"/logs/*.log | cut -c1-300
