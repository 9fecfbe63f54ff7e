#!/usr/bin/env bash
# The 33.7M transformer (bench/transformer_lm.py, bench/transformer_lm.h), data-parallel on NP
# ranks, 16 tokens per rank a step: dtrain's C++ DDP and ZeRO-3 (bench/transformer_bench.cc) and
# torch's DDP and FSDP2 on backend dtrain and on gloo (bench/torch_transformer.py), ROUNDS rounds,
# the C++ and Python jobs taking turns to go first; prints the median step [range over rounds],
# samples/s, rank 0's peak resident memory and the speed-up over the same wrapper on gloo
# (docs/performance.md, "torch's tools on dtrain against dtrain's own").
#   bash bench/transformer.sh [build dir]      ROUNDS=3 STEPS=8 NP=2 by default
#   the Python is $DTRAIN_PYTHON or the venv of scripts/install-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${ROUNDS:-3}
steps=${STEPS:-8}
np=${NP:-2}
python=${DTRAIN_PYTHON:-/opt/dtrain/venv/bin/python}
export PYTHONPATH="$PWD/$build/python${PYTHONPATH:+:$PYTHONPATH}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cpp() {
  "$build/bin/dtrain" run -n "$np" --no-prefix -- "$build/bin/transformer_bench" --rounds 1 \
    --steps "$steps" --layouts ddp,zero3 | grep -o 'RESULT .*' | sed 's/^RESULT //' >>"$out/all.jsonl"
}
py() {
  "$build/bin/dtrain" run -n "$np" --no-prefix -- "$python" bench/torch_transformer.py --rounds 1 \
    --steps "$steps" --runs ddp:dtrain,ddp:gloo,fsdp2:dtrain,fsdp2:gloo --json "$out/round.jsonl" \
    >/dev/null
  cat "$out/round.jsonl" >>"$out/all.jsonl"
}
for r in $(seq 1 "$rounds"); do
  if (( r % 2 )); then cpp; py; else py; cpp; fi
  echo "round $r of $rounds done"
done
"$python" - "$out/all.jsonl" <<'PY'
import collections, json, statistics, sys
step, peak = collections.defaultdict(list), collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    step[r["run"]].append(r["median_step_s"] * 1e3)
    peak[r["run"]].append(r["peak_rss_bytes"] / 2**20)
world = json.loads(open(sys.argv[1]).readline())["world_size"]
gloo = {"ddp": statistics.median(step["ddp:gloo"]), "fsdp2": statistics.median(step["fsdp2:gloo"])}
names = {"cpp-ddp": "dtrain C++ DDP", "cpp-zero3": "dtrain C++ ZeRO-3", "ddp:dtrain": "torch DDP on dtrain",
         "ddp:gloo": "torch DDP on gloo", "fsdp2:dtrain": "FSDP2 on dtrain", "fsdp2:gloo": "FSDP2 on gloo"}
print(f"# {world} ranks: median step ms [range over rounds], samples/s, rank 0's peak resident MiB, "
      f"speed-up over torch DDP on gloo / FSDP2 on gloo")
for run, name in names.items():
    v = step[run]
    m = statistics.median(v)
    print(f"{name:>20} {m:7.1f} [{min(v):.1f}, {max(v):.1f}] {world * 1e3 / m:6.2f} samples/s "
          f"{statistics.median(peak[run]):6.0f} MiB  {gloo['ddp'] / m:.2f}x / {gloo['fsdp2'] / m:.2f}x")
PY
