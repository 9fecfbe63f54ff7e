#!/usr/bin/env bash
# The parameter-server training figures of docs/performance.md, in one run:
#   1. accuracy: one epoch of train_fashion_mnist, DDP against the synchronous parameter server
#      (2 workers, 1 server, same seed and flags);
#   2. a straggler: rank 1 sleeps STRAGGLER_MS (default 60) every step; images/s (every worker's
#      own rate, added up) of sync, SSP (staleness 2, 10, 50) and async, with the ratio to sync.
#   SKIP_ACCURACY=1 runs only the second part; STEPS (200) and STRAGGLER_MS (60) tune it.
#   bash bench/ps_training.sh [build/bin]
set -euo pipefail
bin=${1:-build/bin}
steps=${STEPS:-200}
straggle=${STRAGGLER_MS:-60}
common=(--threads 1 --batch-size 100 --seed 42)

result() {  # the RESULT json of a run's output
  grep -o 'RESULT .*' | sed 's/^RESULT //'
}
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

if [ -z "${SKIP_ACCURACY:-}" ]; then
echo "== accuracy after 1 epoch (2 workers)"
ddp=$("$bin/dtrain" run -n 2 -- "$bin/train_fashion_mnist" --epochs 1 "${common[@]}" 2>&1 | result)
sync=$("$bin/dtrain" run --servers 1 -n 2 -- "$bin/train_fashion_mnist" --strategy ps \
  --ps-mode sync --epochs 1 "${common[@]}" 2>&1 | result)
printf "%-22s %14s %10s\n" strategy test_accuracy images/s
printf "%-22s %14.4f %10.0f\n" "ddp" "$(field "$ddp" test_accuracy)" "$(field "$ddp" images_per_sec)"
printf "%-22s %14.4f %10.0f\n" "ps sync (1 server)" "$(field "$sync" test_accuracy)" \
  "$(field "$sync" images_per_sec)"
fi

echo "== rank 1 sleeps ${straggle} ms per step, ${steps} steps per worker, 1 server"
base=""
printf "%-22s %10s %8s %14s\n" mode images/s ratio final_loss
for mode in "sync" "ssp 2" "ssp 10" "ssp 50" "async"; do
  set -- $mode
  extra=(--ps-mode "$1")
  [ $# -gt 1 ] && extra+=(--staleness "$2")
  r=$("$bin/dtrain" run --servers 1 -n 2 -- "$bin/train_fashion_mnist" --strategy ps "${extra[@]}" \
    --max-steps "$steps" --straggler-rank 1 --straggler-ms "$straggle" "${common[@]}" 2>&1 | result)
  ips=$(field "$r" images_per_sec)
  base=${base:-$ips}
  printf "%-22s %10.0f %8.2f %14.4f\n" "$mode" "$ips" "$(python3 -c "print($ips / $base)")" \
    "$(field "$r" final_loss)"
done
