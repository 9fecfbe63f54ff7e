#!/usr/bin/env bash
# images/s of train_fashion_mnist (DDP, 1 thread per rank, batch 100 per rank) against the number
# of ranks, and the plot of docs/performance.md (docs/scaling.svg). On a machine with C cores,
# ranks beyond C share cores: the curve then shows what oversubscription costs.
#   bash bench/scaling.sh [build/bin] [max ranks, default 4]
set -euo pipefail
bin=${1:-build/bin}
max=${2:-4}
steps=${STEPS:-150}
csv=${OUT:-bench-results}/scaling.csv
mkdir -p "$(dirname "$csv")"
echo "ranks,images_per_sec" > "$csv"
for n in $(seq 1 "$max"); do
  if [ "$n" = 1 ]; then
    line=$("$bin/train_fashion_mnist" --threads 1 --max-steps "$steps" 2>&1 | grep -o 'RESULT .*')
  else
    line=$("$bin/dtrain" run -n "$n" -- "$bin/train_fashion_mnist" --threads 1 --max-steps "$steps" \
      2>&1 | grep -o 'RESULT .*')
  fi
  ips=$(python3 -c "import json,sys; print(round(json.loads(sys.argv[1][7:])['images_per_sec']))" "$line")
  echo "$n,$ips" | tee -a "$csv"
done
python3 "$(dirname "$0")/../tools/plot_scaling.py" "$csv" docs/scaling.svg
echo "wrote docs/scaling.svg"
