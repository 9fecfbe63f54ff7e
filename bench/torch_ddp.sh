#!/usr/bin/env bash
# PyTorch DDP on the Fashion-MNIST ConvNet (bench/torch_ddp_fashion_mnist.py: 2 ranks, 1 thread
# each, batch 100 per rank), on dtrain's backend and on gloo, alternating, ROUNDS times; prints
# each round's images/s and the medians (docs/performance.md, "PyTorch on dtrain").
#   bash bench/torch_ddp.sh [build/bin/dtrain]      ROUNDS=5 STEPS=300 NP=2 by default
set -euo pipefail
cd "$(dirname "$0")/.."
dtrain=${1:-build/bin/dtrain}
rounds=${ROUNDS:-5}
steps=${STEPS:-300}
np=${NP:-2}
export PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
declare -A ips
for r in $(seq 1 "$rounds"); do
  order="dtrain gloo"
  if (( r % 2 == 0 )); then order="gloo dtrain"; fi
  for b in $order; do
    line=$("$dtrain" run -n "$np" -- python3 bench/torch_ddp_fashion_mnist.py \
             --max-steps "$steps" --backend "$b" | grep -o 'RESULT .*' | sed 's/^RESULT //')
    v=$(/usr/bin/python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print("%.0f %.6f" % (r["images_per_sec"], r["final_loss"]))' "$line")
    echo "round $r $b: images/s and final loss: $v"
    ips[$b]+="${v%% *} "
  done
done
/usr/bin/python3 - "${ips[dtrain]}" "${ips[gloo]}" <<'PY'
import statistics, sys
d = [float(x) for x in sys.argv[1].split()]
g = [float(x) for x in sys.argv[2].split()]
ratios = [a / b for a, b in zip(d, g)]
print(f"median images/s: dtrain {statistics.median(d):.0f} [{min(d):.0f}, {max(d):.0f}], "
      f"gloo {statistics.median(g):.0f} [{min(g):.0f}, {max(g):.0f}]; "
      f"dtrain/gloo {statistics.median(ratios):.3f}x [{min(ratios):.3f}, {max(ratios):.3f}]")
PY
