#!/usr/bin/env bash
# What ZeRO's snapshots in memory cost a run (docs/fault_tolerance.md, "ZeRO"): train_sharded
# at 3 ranks, stage 3, under `dtrain run --live`, with a snapshot in memory every step, every 10
# steps, and none (--snapshot-every 0; --checkpoint-dir given but never written), ROUNDS rounds
# in turn; prints each run's images/s and, last, each mode's median against none's.
#   bash bench/sharded_snapshot_cost.sh [build/bin/dtrain] [train_sharded flags]   ROUNDS=5
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/medians.sh
dtrain=${1:-build/bin/dtrain}
shift || true
bin=$(dirname "$dtrain")
rounds=${ROUNDS:-5}
spare=$(mktemp -d /dev/shm/sharded-snapshot-cost-XXXXXX)
trap 'rm -rf "$spare"' EXIT
declare -A runs
for ((round = 1; round <= rounds; ++round)); do
  for every in 1 10 0; do
    rm -rf "${spare:?}"/*
    line=$("$dtrain" run -n 3 --live -- "$bin/train_sharded" --threads 1 --stage 3 --epochs 1 \
      --snapshot-every "$every" --checkpoint-dir "$spare" --checkpoint-every 1000000000 "$@" \
      2> /dev/null | grep -a 'RESULT' | sed 's/.*"images_per_sec":\([0-9.]*\).*/\1/')
    echo "round $round, snapshot every $every step(s): $line images/s"
    runs[$every]="${runs[$every]:-} $line"
  done
done
none=$(echo "${runs[0]}" | median)
for every in 1 10; do
  m=$(echo "${runs[$every]}" | median)
  echo "every $every: median $m images/s, none $none: $(against "$m" "$none")"
done
