#!/usr/bin/env bash
# The 33.7M transformer (bench/transformer_lm.py, bench/transformer_lm.h), data-parallel on NP
# ranks, 16 tokens per rank a step: dtrain's C++ DDP and ZeRO-3 (bench/transformer_bench.cc) and
# torch's DDP and FSDP2 on backend dtrain and on gloo (bench/torch_transformer.py), ROUNDS rounds,
# the C++ and Python jobs taking turns to go first; prints the median step [range over rounds],
# samples/s, rank 0's peak resident memory and the speed-up over the same wrapper on gloo
# (docs/performance.md, "torch's tools on dtrain against dtrain's own").
#   bash bench/transformer.sh [build dir]      ROUNDS=3 STEPS=8 NP=2 by default
#   the Python is $DTRAIN_PYTHON or the venv of scripts/install-deps.sh.
# PROFILE=10gbe (or any of `scripts/netns-hosts.sh profiles`; needs root) runs one rank on each of
# NP emulated hosts whose links are shaped so, instead of NP ranks over shared memory. The last
# line says how much of the machine's CPU sat idle during the jobs: communication can hide behind
# backward only in CPU time the ranks leave (an emulated link's TCP runs on the same cores).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${ROUNDS:-3}
steps=${STEPS:-8}
np=${NP:-2}
python=${DTRAIN_PYTHON:-/opt/dtrain/venv/bin/python}
export PYTHONPATH="$PWD/$build/python${PYTHONPATH:+:$PYTHONPATH}"
profile=${PROFILE:-}
out=$(mktemp -d)
hosts=tfm$$
cleanup() {
  rm -rf "$out"
  [[ -z $profile ]] || scripts/netns-hosts.sh down "$hosts" >/dev/null 2>&1 || true
}
trap cleanup EXIT
if [[ -n $profile ]]; then
  if ! why=$(scripts/netns-hosts.sh check); then echo "transformer: skipped: $why"; exit 0; fi
  scripts/netns-hosts.sh up "$hosts" "$np" 10.79.95 --profile "$profile" >/dev/null
fi
# The job's workers: NP ranks here, or one on each emulated host (gloo's own sockets on its link).
launch() {
  if [[ -z $profile ]]; then
    "$build/bin/dtrain" run -n "$np" --no-prefix -- "$@"
  else
    # One thread each, as dtrain run gives ranks sharing a machine (a host counts only its own).
    GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 scripts/netns-hosts.sh job "$hosts" \
      "$build/bin/dtrain" run -n 1 --nnodes "$np" --node-rank '{node}' --master-addr '{host0}' \
      --master-port 29653 --no-prefix -- "$@"
  fi
}
# /proc/stat's idle and busy jiffies (every CPU), summed over the jobs.
cpu() { awk '/^cpu / { print $5 + $6, $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
idle=0 busy=0
timed() {
  local before after
  read -ra before < <(cpu)
  "$@"
  read -ra after < <(cpu)
  idle=$((idle + after[0] - before[0])) busy=$((busy + after[1] - before[1]))
}
cpp() {
  launch "$build/bin/transformer_bench" --rounds 1 \
    --steps "$steps" --layouts ddp,zero3 | grep -o 'RESULT .*' | sed 's/^RESULT //' >>"$out/all.jsonl"
}
py() {
  launch "$python" bench/torch_transformer.py --rounds 1 \
    --steps "$steps" --runs ddp:dtrain,ddp:gloo,fsdp2:dtrain,fsdp2:gloo --json "$out/round.jsonl" \
    >/dev/null
  cat "$out/round.jsonl" >>"$out/all.jsonl"
}
for r in $(seq 1 "$rounds"); do
  if (( r % 2 )); then timed cpp; timed py; else timed py; timed cpp; fi
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
echo "# ${profile:-shared memory}: the machine's CPU idle $(awk -v i="$idle" -v b="$busy" \
  'BEGIN { printf "%.1f", 100 * i / (i + b) }')% of the jobs' time ($(nproc) CPUs)"
