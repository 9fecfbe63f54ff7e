#!/usr/bin/env bash
# What the always-on flight recorder costs: an 8-byte all-reduce between 2 ranks (dtrain bench),
# with the recorder on (DTRAIN_FLIGHT_RECORDER=2000, the default) and off (0), in alternating
# rounds; prints each round and the medians. docs/performance.md records the figures.
#
#   bash bench/flight_recorder_cost.sh [ROUNDS] [SIZE]     (defaults: 9 rounds, 8 bytes)
set -euo pipefail
rounds=${1:-9}
size=${2:-8}
dtrain=${DTRAIN_BIN:-$(dirname "$0")/../build/bin/dtrain}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for ((i = 1; i <= rounds; i++)); do
  for entries in 2000 0; do
    DTRAIN_FLIGHT_RECORDER=$entries "$dtrain" bench allreduce --sizes "$size" --iters 50000 \
      --warmup 2000 --json "$out/$entries.$i.json" > /dev/null
  done
done
python3 - "$out" "$rounds" "$size" <<'PY'
import json, statistics, sys
out, rounds, size = sys.argv[1], int(sys.argv[2]), sys.argv[3]
times = {e: [json.loads(open(f"{out}/{e}.{i}.json").readline())["time_us"]
             for i in range(1, rounds + 1)] for e in (2000, 0)}
for i in range(rounds):
    print(f"round {i + 1}: on {times[2000][i]:.3f} us, off {times[0][i]:.3f} us")
on, off = statistics.median(times[2000]), statistics.median(times[0])
# The VM's speed drifts between rounds: each round's own ratio cancels what the two runs share.
ratio = statistics.median(a / b for a, b in zip(times[2000], times[0]))
print(f"{size}-byte all-reduce, 2 ranks, median of {rounds} rounds: recorder on {on:.3f} us, "
      f"off {off:.3f} us: {on - off:+.3f} us; median of the rounds' ratios "
      f"{(ratio - 1) * 100:+.1f}%")
PY
