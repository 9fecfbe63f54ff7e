#!/usr/bin/env bash
# Recovery from the same faults, side by side (docs/fault_tolerance.md, "dtrain chaos"): the
# example at 4 ranks under `dtrain chaos --schedule SCHEDULE --seed SEED`, recovered by
#   live      dtrain run --live --replace: the survivors go on, replacements take their state
#   commit    dtrain run --max-restarts: every worker restarts from the in-memory commit
#   torchrun  torchrun --max-restarts: PyTorch's elastic restart of every worker from a
#             torch.save checkpoint in /dev/shm each step (bench/torch_elastic_fashion_mnist.py,
#             DDP on gloo)
# Each prints its CHAOS line (its fault-free run is part of it); the table in the docs is made
# from them.
#   bash bench/fault_recovery.sh [build/bin/dtrain]    SCHEDULE=kill:20s SEED=1 EPOCHS=2 ONLY=
set -euo pipefail
cd "$(dirname "$0")/.."
dtrain=${1:-build/bin/dtrain}
bin=$(dirname "$dtrain")
schedule=${SCHEDULE:-kill:20s}
seed=${SEED:-1}
epochs=${EPOCHS:-2}
python=${DTRAIN_PYTHON:-/opt/dtrain/venv/bin/python}
torchrun=$(dirname "$python")/torchrun
export PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
out=$(mktemp -d "${TMPDIR:-/tmp}/fault-recovery-XXXXXX")
chaos() {
  local name=$1
  shift
  "$dtrain" chaos --schedule "$schedule" --seed "$seed" --dir "$out/$name" -- "$@" \
    > "$out/$name.log" 2>&1 || true
  echo "$name: $(grep -a '^CHAOS ' "$out/$name.log" | tail -n 1)"
}
for name in ${ONLY:-live commit torchrun}; do
  case $name in
    live) chaos live "$dtrain" run -n 4 --live --replace 1000 -- "$bin/train_fashion_mnist" \
            --threads 1 --epochs "$epochs" ;;
    commit) chaos commit "$dtrain" run -n 4 --max-restarts 1000 -- "$bin/train_fashion_mnist" \
              --threads 1 --epochs "$epochs" ;;
    torchrun) chaos torchrun "$torchrun" --standalone --nproc-per-node 4 --max-restarts 1000 \
                bench/torch_elastic_fashion_mnist.py --epochs "$epochs" ;;
  esac
done
echo "runs' output: $out"
