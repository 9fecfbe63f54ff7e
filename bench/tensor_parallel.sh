#!/usr/bin/env bash
# Tensor parallelism, dtrain's C++ layers against torch's DTensor on backend dtrain and on gloo:
# the same transformer blocks (bench/tensor_parallel_bench.cc, bench/torch_tensor_parallel.py),
# NP ranks, ROUNDS rounds, the order rotating from round to round; prints each round's median
# step time and, last, the medians over the rounds [range] and the ratios to dtrain's layers
# (docs/performance.md, "Tensor parallelism").
#   bash bench/tensor_parallel.sh [build dir] [flags for both, e.g. --blocks 4 --hidden 1024]
#   ROUNDS=5 NP=2 by default; the Python is $DTRAIN_PYTHON or the venv of scripts/install-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
rounds=${ROUNDS:-5}
np=${NP:-2}
python=${DTRAIN_PYTHON:-/opt/dtrain/venv/bin/python}
export PYTHONPATH="$PWD/$build/python${PYTHONPATH:+:$PYTHONPATH}"
runs=(dtrain dtensor:dtrain dtensor:gloo)
declare -A ms
for r in $(seq 1 "$rounds"); do
  for i in 0 1 2; do
    run=${runs[$(( (i + r) % 3 ))]}
    if [ "$run" = dtrain ]; then
      cmd=("$build/bin/tensor_parallel_bench" "$@")
    else
      cmd=("$python" bench/torch_tensor_parallel.py --backend "${run#dtensor:}" "$@")
    fi
    line=$("$build/bin/dtrain" run -n "$np" --no-prefix -- "${cmd[@]}" | grep -o 'RESULT .*')
    v=$("$python" -c 'import json,sys; print("%.2f" % json.loads(sys.argv[1][7:])["step_ms"])' "$line")
    echo "round $r $run: $v ms a step"
    ms[$run]+="$v "
  done
done
"$python" - "${ms[dtrain]}" "${ms[dtensor:dtrain]}" "${ms[dtensor:gloo]}" <<'PY'
import statistics, sys
runs = ["dtrain's C++ layers", "DTensor on dtrain", "DTensor on gloo"]
vals = [[float(x) for x in a.split()] for a in sys.argv[1:]]
base = statistics.median(vals[0])
for name, v in zip(runs, vals):
    m = statistics.median(v)
    print(f"{name:>20}: {m:7.1f} ms [{min(v):.1f}, {max(v):.1f}], {m / base:.2f}x dtrain's layers")
PY
