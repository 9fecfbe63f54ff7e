#!/usr/bin/env bash
# Data-parallel training of the Fashion-MNIST example across emulated hosts (docs/scaling.md):
# one rank alone, and two ranks alone at once (each without the other: what a rank computes while
# another shares the machine's cores, as each emulated host's rank does), give the compute time
# per step; then one rank on each of 2 hosts whose links are shaped as each profile, under
# `dtrain run` per host; and `dtrain predict` for the same shape, from the compute time of two at
# once and the links as `dtrain bench --calibrate` measured them there. Needs root.
#   [STEPS=300] [PROFILES="1gbe 10gbe"] sudo bash bench/emulated_training.sh [build]
set -euo pipefail
build=$(realpath "${1:-build}")
here=$(dirname "$(realpath "$0")")
hosts_script="$here/../scripts/netns-hosts.sh"
steps=${STEPS:-300}
if ! why=$("$hosts_script" check); then echo "emulated_training: skipped: $why"; exit 0; fi
train=("$build/bin/train_fashion_mnist" --max-steps "$steps" --batch-size 64 --threads 1 --epochs 1)
rate() { grep -o '"images_per_sec":[0-9.]*' | cut -d: -f2; }
alone=$("$build/bin/dtrain" run -n 1 -- "${train[@]}" | rate)
name=emt$$
for i in 0 1; do
  "$build/bin/dtrain" run -n 1 --master-port $((29660 + i)) -- "${train[@]}" >"/tmp/$name.solo.$i.log" 2>&1 &
done
wait
shared=$(cat "/tmp/$name.solo.0.log" "/tmp/$name.solo.1.log" | rate | awk '{ s += $1 } END { printf "%.1f", s / NR }')
rm -f "/tmp/$name.solo."*
compute_ms=$(awk -v r="$shared" 'BEGIN { printf "%.3f", 64 * 1000 / r }')
params=29034  # the ConvNet's: convolutions 416 + 12,832, batch norms 32 + 64, the linear layer 15,690
echo "one rank alone: $alone images/s; two alone at once: $shared images/s each, $compute_ms ms per step of 64"
trap '"$hosts_script" down "$name" >/dev/null 2>&1 || true' EXIT
for profile in ${PROFILES:-1gbe 10gbe}; do
  "$hosts_script" up "$name" 2 10.79.99 --profile "$profile" 2>/dev/null
  links=$(mktemp /tmp/links.XXXXXX.json)
  # The links, measured as the training will use them.
  "$build/bin/dtrain" bench allreduce --np 2 --netns "$name" --sizes 4K --iters 5 --warmup 2 \
    --calibrate "$links" >/dev/null 2>&1
  for i in 0 1; do
    "$hosts_script" run "$name" "$i" "$build/bin/dtrain" run --nnodes 2 --node-rank "$i" \
      --master-addr 10.79.99.1 --master-port 29640 -n 1 -- "${train[@]}" >"/tmp/$name.$i.log" 2>&1 &
  done
  wait
  both=$(rate <"/tmp/$name.0.log")
  per_rank=$(awk -v r="$both" 'BEGIN { printf "%.1f", r / 2 }')
  predicted=$("$build/bin/dtrain" predict --params "$params" --compute-ms "$compute_ms" --per-host 1 \
    --network "$links" --ranks 2 --layouts ddp | tail -1 | awk '{ print $3 }' | tr -d '%')
  # The model's efficiency is against the compute time it was given (two ranks at once).
  predicted_rate=$(awk -v s="$shared" -v e="$predicted" 'BEGIN { printf "%.1f", s * e / 100 }')
  echo "$profile: 2 hosts x 1 rank: $per_rank images/s per rank (efficiency against one alone" \
    "$(awk -v a="$per_rank" -v b="$alone" 'BEGIN { printf "%.1f%%", 100 * a / b }')), predicted" \
    "$predicted_rate images/s ($predicted% of two alone at once), measured/predicted" \
    "$(awk -v a="$per_rank" -v b="$predicted_rate" 'BEGIN { printf "%.2f", a / b }')"
  "$hosts_script" down "$name"
  rm -f "$links"
done
