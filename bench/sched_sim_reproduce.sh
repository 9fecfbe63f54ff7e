#!/usr/bin/env bash
# The anchor of `dtrain sched-sim` (docs/scheduling.md): the Tiresias baseline of Pollux's
# simulator replayed on its 32 published workloads (8 per job load: 0.5x, 1x, 1.5x, 2x), each
# average JCT beside the one Pollux's artifact published (data/pollux/published_average_jct.csv).
#   bash bench/sched_sim_reproduce.sh [build/bin/dtrain]
# Prints one row per workload and the largest relative difference; exits 1 above 10%.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dtrain="${1:-$here/build/bin/dtrain}"
data="$here/data/pollux"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for load in 0.5 1.0 1.5 2.0; do
  dir="$data/workloads"; [[ "$load" == 1.0 ]] || dir="$data/workloads-$load"
  for w in "$dir"/workload-*.csv; do
    name="$(basename "$w" .csv)"
    "$dtrain" sched-sim --policy tiresias --placement spread --json "$out/$load-$name.json" "$w" > /dev/null
  done
done
/usr/bin/python3 - "$out" "$data/published_average_jct.csv" <<'PY'
import csv, json, os, sys
out, published = sys.argv[1], sys.argv[2]
worst = 0.0
print(f"{'load':>5} {'workload':<11} {'dtrain (s)':>11} {'published (s)':>14} {'diff':>7}")
for row in csv.DictReader(open(published)):
    if row["policy"] != "tiresias":
        continue
    path = os.path.join(out, f"{row['load']}-{row['workload']}.json")
    ours = json.load(open(path))[0]["average_jct"]
    theirs = float(row["average_jct"])
    diff = (ours - theirs) / theirs
    worst = max(worst, abs(diff))
    print(f"{row['load']:>5} {row['workload']:<11} {ours:>11.1f} {theirs:>14.1f} {100 * diff:>6.2f}%")
print(f"largest difference: {100 * worst:.2f}%")
sys.exit(0 if worst <= 0.10 else 1)
PY
