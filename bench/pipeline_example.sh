#!/usr/bin/env bash
# examples/train_pipeline as one process (1 and 2 threads), as 2 pipeline stages and as 2
# data-parallel replicas,
# in alternating order over ROUNDS rounds: images/s (medians, and the ratio to one process) and
# each stage's parameters and training memory (docs/performance.md, "Pipeline schedules").
#   bash bench/pipeline_example.sh [ROUNDS] [extra train_pipeline flags]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
bin=build/bin
flags=(--train-samples 12000 --hidden 1024 --microbatches 4 "$@")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
configs=("one" "one2" "stages" "replicas")
for ((r = 0; r < rounds; r++)); do
  order=("${configs[@]}")
  if ((r % 2 == 1)); then order=("replicas" "stages" "one2" "one"); fi
  for c in "${order[@]}"; do
    case $c in
      one) "$bin/train_pipeline" --threads 1 --batch-size 256 "${flags[@]}" ;;
      one2) "$bin/train_pipeline" --threads 2 --batch-size 256 "${flags[@]}" ;;
      stages) "$bin/dtrain" run -n 2 --no-prefix -- "$bin/train_pipeline" --stages 2 --threads 1 \
                --batch-size 256 "${flags[@]}" ;;
      replicas) "$bin/dtrain" run -n 2 --no-prefix -- "$bin/train_pipeline" --stages 1 --threads 1 \
                  --batch-size 128 "${flags[@]}" ;;
    esac 2>/dev/null | grep '^RESULT ' | sed "s/^RESULT /$c /" >> "$out/results"
  done
done
/usr/bin/python3 - "$out/results" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, text = line.split(" ", 1)
    runs.setdefault(name, []).append(json.loads(text))
base = statistics.median(r["images_per_sec"] for r in runs["one"])
print("| run | images/s (median) | x one process | parameters per stage | training memory per stage, MiB | peak micro-batches | test accuracy |")
print("|---|---|---|---|---|---|---|")
label = {"one": "1 process, 1 thread", "one2": "1 process, 2 threads", "stages": "2 stages x 1 replica, 1 thread each",
         "replicas": "1 stage x 2 replicas (128 images each), 1 thread each"}
for name in ("one", "one2", "stages", "replicas"):
    rs = runs.get(name, [])
    if not rs:
        continue
    ips = statistics.median(r["images_per_sec"] for r in rs)
    last = rs[-1]
    mem = " / ".join(f"{m:.1f}" for m in last["training_memory_mib"])
    params = " / ".join(f"{p:,}" for p in last["stage_parameters"])
    peaks = " / ".join(str(p) for p in last["peak_microbatches"])
    print(f"| {label[name]} | {ips:,.0f} | {ips / base:.2f} | {params} | {mem} | {peaks} | {last['test_accuracy']:.4f} |")
PY
