#!/usr/bin/env bash
# The emulated-cluster measurements of docs/scaling.md: all-reduce on 2, 4 and 8 hosts made of
# network namespaces (scripts/netns-hosts.sh) with links shaped as 1 GbE and 10 GbE, dtrain and
# its peers (OpenMPI over TCP, Gloo, PyTorch's gloo) in the same invocation, alternating over
# $ROUNDS rounds (default 3); dtrain first measures the links (--calibrate) and prints the cost
# model's time beside each measured one (--model). Needs root. JSON lines and the calibration
# files land in $OUT (default bench-results/emulated). Small buffers (4 and 64 KiB) take a
# millisecond or less, so they run in an invocation of their own with $SMALL_ITERS iterations
# (default 200): ten of them measure how 8 ranks on 2 cores happened to be scheduled.
#   [ROUNDS=3] [SMALL_ITERS=200] [OUT=dir] [PROFILES="1gbe 10gbe"] [HOSTS="2 4 8"] [PER_HOST="1 2"]
#   sudo bash bench/emulated_clusters.sh [build/bin/dtrain]
set -euo pipefail
dtrain=$(realpath "${1:-build/bin/dtrain}")
here=$(dirname "$(realpath "$0")")
hosts_script="$here/../scripts/netns-hosts.sh"
out=${OUT:-bench-results/emulated}
mkdir -p "$out"
if ! why=$("$hosts_script" check); then echo "emulated_clusters: skipped: $why"; exit 0; fi
name=emu$$
trap '"$hosts_script" down "$name" >/dev/null 2>&1 || true' EXIT
for profile in ${PROFILES:-1gbe 10gbe}; do
  # A 1 GbE link moves 16 MiB in about 0.3 s: larger sizes only where the link is faster.
  large=1M,16M
  [ "$profile" = 1gbe ] || large=1M,16M,64M
  for hosts in ${HOSTS:-2 4 8}; do
    for per_host in ${PER_HOST:-1 2}; do
      np=$((hosts * per_host))
      (( np <= 8 )) || continue
      echo "== all-reduce, $hosts hosts x $per_host rank(s), $profile"
      "$hosts_script" up "$name" "$hosts" 10.79.$((hosts * 10 + per_host)) --profile "$profile" 2>/dev/null
      for part in small large; do
        sizes=4K,64K iters=${SMALL_ITERS:-200} warmup=20
        [ "$part" = small ] || sizes=$large iters=10 warmup=5
        "$dtrain" bench allreduce --np "$np" --netns "$name" --peers mpi-tcp,gloo,torch \
          --sizes "$sizes" --iters "$iters" --warmup "$warmup" --rounds "${ROUNDS:-3}" --model \
          --calibrate "$out/links_${profile}_${hosts}x${per_host}_$part.json" \
          --json "$out/allreduce_${profile}_${hosts}x${per_host}_$part.jsonl" ||
          echo "== that configuration failed (see above); going on"
      done
      "$hosts_script" down "$name"
    done
  done
done
