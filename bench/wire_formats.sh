#!/usr/bin/env bash
# Fewer bytes on the wire (AllreduceOptions::wire: int8, bf16, fp16; the DDP hooks of
# dtrain.torch.comm_hooks and dtrain/torch/comm_hook.h) against exact f32, in one run
# (docs/performance.md, "Fewer bytes on the wire"):
#   1. the loss: the Fashion-MNIST example (C++ DDP, --comm-hook) and the transformer of
#      bench/wire_training.py (torch's DDP on backend dtrain), 2 ranks, SEEDS seeds each of
#      WIRES: the final loss of every run, to be read against the spread of the exact runs;
#   2. the speed of the all-reduce on this host, over shared memory and over TCP:
#      `dtrain bench allreduce --wire exact,bf16,fp16,int8,int4` at 1, 16 and 64 MiB;
#   3. the speed on 2 emulated hosts whose link is shaped as each of PROFILES (needs root;
#      skipped otherwise): the same all-reduces, and the transformer's DDP step with one rank per
#      host, each of STEP_WIRES taking turns for ROUNDS rounds (median step of each, and its
#      speed against exact). torch-bf16 is torch's own bf16 hook (cast, all-reduce, cast back),
#      bf16-plain dtrain's without error feedback (bench/wire_training.py).
#   [SEEDS="1 2 3"] [WIRES="exact int8"] [STEP_WIRES="exact int8"] [PROFILES="1gbe 10gbe"] \
#     [ROUNDS=3] [STEPS=12] [PARTS="loss local links"] bash bench/wire_formats.sh [build]
#   the Python is $DTRAIN_PYTHON or the venv of scripts/install-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build}")
python=${DTRAIN_PYTHON:-/opt/dtrain/venv/bin/python}
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
seeds=${SEEDS:-1 2 3}
wires=${WIRES:-exact int8}
step_wires=${STEP_WIRES:-exact int8}
rounds=${ROUNDS:-3}
steps=${STEPS:-12}
out=$(mktemp -d)
name=wire$$
hosts_script=scripts/netns-hosts.sh
trap '"$hosts_script" down "$name" >/dev/null 2>&1 || true; rm -rf "$out"' EXIT
field() { grep -o "\"$1\": *[0-9.e+-]*" | head -1 | sed 's/.*: *//'; }
# A job's RESULT line; its stderr (dtrain run's notices) only if it failed.
result_of() {
  if ! "$@" >"$out/job.log" 2>"$out/job.err" || ! grep '^RESULT' "$out/job.log"; then
    cat "$out/job.log" "$out/job.err" >&2
    return 1
  fi
}

parts=${PARTS:-loss local links}
if [[ " $parts " == *" loss "* ]]; then
echo "# the loss, 2 ranks on this host: final loss of each seed"
for seed in $seeds; do
  for wire in $wires; do
    hook=${wire/exact/allreduce}
    line=$(result_of "$build/bin/dtrain" run -n 2 --no-prefix -- "$build/bin/train_fashion_mnist" \
      --epochs 1 --threads 1 --seed "$seed" --comm-hook "$hook")
    echo "example seed $seed $wire: final_loss $(field final_loss <<<"$line")" \
      "test_accuracy $(field test_accuracy <<<"$line")"
  done
done
for seed in $seeds; do
  for wire in $wires; do
    line=$(result_of "$build/bin/dtrain" run -n 2 --no-prefix -- "$python" bench/wire_training.py \
      --wire "$wire" --seed "$seed" --corpus 128 --epochs 4)
    echo "transformer seed $seed $wire: final_loss $(field final_loss <<<"$line")" \
      "median_step_ms $(awk -v s="$(field median_step_s <<<"$line")" 'BEGIN { printf "%.1f", s * 1000 }')"
  done
done
fi

if [[ " $parts " == *" local "* ]]; then
  for transport in auto tcp; do
    echo "# this host, 2 ranks, --transport $transport: all_reduce, exact against each wire"
    "$build/bin/dtrain" bench allreduce --np 2 --transport "$transport" --sizes 1M,16M,64M \
      --iters 10 --warmup 3 --rounds "$rounds" --wire exact,bf16,fp16,int8,int4 2>/dev/null
  done
fi

[[ " $parts " == *" links "* ]] || exit 0
if ! why=$("$hosts_script" check); then echo "# emulated links: skipped: $why"; exit 0; fi
for profile in ${PROFILES:-1gbe 10gbe}; do
  "$hosts_script" up "$name" 2 10.79.98 --profile "$profile" >/dev/null 2>&1
  echo "# $profile, 2 hosts x 1 rank: all_reduce, exact against each wire"
  "$build/bin/dtrain" bench allreduce --np 2 --netns "$name" --sizes 1M,16M,64M --iters 5 \
    --warmup 2 --rounds "$rounds" --wire exact,bf16,fp16,int8,int4 2>/dev/null
  echo "# $profile: the transformer's DDP step, each of: $step_wires, in turn"
  for r in $(seq 1 "$rounds"); do
    for wire in $step_wires; do
      for i in 0 1; do
        "$hosts_script" run "$name" "$i" "$build/bin/dtrain" run --nnodes 2 --node-rank "$i" \
          --master-addr 10.79.98.1 --master-port 29650 -n 1 --no-prefix -- "$python" \
          bench/wire_training.py --wire "$wire" --max-steps "$steps" --epochs 1 >"$out/$i.log" 2>&1 &
      done
      wait
      if ! grep -q '^RESULT' "$out/0.log"; then cat "$out/0.log" "$out/1.log" >&2; exit 1; fi
      field median_step_s <"$out/0.log" >>"$out/$profile.$wire"
    done
  done
  med() { sort -g "$1" | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
  first=${step_wires%% *}
  e=$(med "$out/$profile.$first")
  for wire in $step_wires; do
    q=$(med "$out/$profile.$wire")
    echo "$profile transformer step: $wire $(awk -v s="$q" 'BEGIN { printf "%.1f", s * 1000 }') ms" \
      "[$(sort -g "$out/$profile.$wire" | tr '\n' ' ')]," \
      "$(awk -v a="$e" -v b="$q" 'BEGIN { printf "%.2fx", a / b }') the speed of $first"
  done
  "$hosts_script" down "$name" >/dev/null 2>&1
done
