#!/usr/bin/env bash
# What being ready for live recovery costs a Horovod elastic script (docs/fault_tolerance.md,
# "A commit per step costs no copy of the model"): bench/transformer_recovery.py's 52.5M-parameter
# transformer at 4 ranks under `dtrain run --live`, one epoch with a `state.commit()` after every
# step and one with none, ROUNDS rounds in turn; prints each run's samples/s and, last, the
# median with commits against the median without.
#   bash bench/elastic_commit_cost.sh [build/bin/dtrain] [transformer_recovery.py flags]  ROUNDS=3
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/medians.sh
dtrain=${1:-build/bin/dtrain}
shift || true
rounds=${ROUNDS:-3}
python=${DTRAIN_PYTHON:-/opt/dtrain/venv/bin/python}
export PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
declare -A runs
for ((round = 1; round <= rounds; ++round)); do
  for every in 1 0; do
    # --commit-every larger than the run's steps: no commit at all.
    line=$("$dtrain" run -n 4 --live -- "$python" bench/transformer_recovery.py live --epochs 1 \
      --commit-every "$([ "$every" = 0 ] && echo 1000000000 || echo "$every")" "$@" \
      2> /dev/null | grep -a 'RESULT' | sed 's/.*"samples_per_sec": \([0-9.]*\).*/\1/')
    echo "round $round, commit every $every step(s): $line samples/s"
    runs[$every]="${runs[$every]:-} $line"
  done
done
none=$(echo "${runs[0]}" | median)
m=$(echo "${runs[1]}" | median)
echo "a commit every step: median $m samples/s, none $none: $(against "$m" "$none")"
