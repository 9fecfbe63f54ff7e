#!/usr/bin/env bash
# The collective measurements of docs/performance.md, in one go: all-reduce against the peers
# over TCP only (np 2 and 4), over shared memory (auto), and the CPU a rank burns while it waits
# on a straggler. Each invocation alternates dtrain and its peers over $ROUNDS rounds (default 5)
# and shows medians and the median of the rounds' ratios: the machine is noisy. Prints the
# tables; JSON lines land in $OUT (default bench-results/).
#   [ROUNDS=5] [OUT=dir] bash bench/collectives.sh [build/bin/dtrain]
set -euo pipefail
dtrain=${1:-build/bin/dtrain}
out=${OUT:-bench-results}
mkdir -p "$out"
sizes=4K,64K,1M,16M,64M
common=(--sizes "$sizes" --iters 30 --warmup 5 --rounds "${ROUNDS:-5}")
for np in 2 4; do
  echo "== all-reduce, TCP only, np $np"
  "$dtrain" bench allreduce --np "$np" --transport tcp --peers gloo,mpi-tcp,torch "${common[@]}" \
    --json "$out/allreduce_tcp_np$np.jsonl"
  echo "== all-reduce, shared memory (auto), np $np"
  "$dtrain" bench allreduce --np "$np" --transport auto --peers gloo,mpi "${common[@]}" \
    --json "$out/allreduce_shm_np$np.jsonl"
done
echo "== CPU while waiting 5 ms on the last rank, np 2"
"$dtrain" bench allreduce --np 2 --sizes 4K,1M --iters 20 --warmup 3 --straggle-ms 5 \
  --rounds "${ROUNDS:-5}" --peers gloo,mpi,torch --json "$out/allreduce_straggle_np2.jsonl"
