#!/usr/bin/env bash
# Recovery from the same faults, side by side (docs/fault_tolerance.md, "dtrain chaos"): the
# example at 4 ranks under `dtrain chaos --schedule SCHEDULE --seed SEED`, recovered by
#   live      dtrain run --live: the survivors go on; a new worker takes the dead one's place
#             and their state (the example: --replace, one started after each death; the
#             transformer: --spares 10, a pool started with the job and forked from a process
#             that imported torch, --preload torch,torch._dynamo; LIVE= sets the flags)
#   commit    dtrain run --max-restarts: every worker restarts from the in-memory commit
#   torchrun  torchrun --max-restarts: PyTorch's elastic restart of every worker from a
#             torch.save checkpoint in /dev/shm each step (bench/torch_elastic_fashion_mnist.py,
#             DDP on gloo)
#   torchft   torchft's live recovery (PyPI's torchft, installed under TORCHFT_DIR on first
#             use): a quorum per step through its lighthouse, replica groups of one process
#             each restarted by torchrun, state from a live peer (bench/torchft_fashion_mnist.py)
# With MODEL=transformer the job is bench/transformer_recovery.py's 52.5M-parameter transformer
# instead (live: Horovod's elastic API on dtrain; no `commit` run), for EPOCHS epochs of its
# corpus. Each prints its CHAOS line (its fault-free run is part of it); the tables in the docs
# are made from them. SPREAD=N then runs dtrain's job N more times without faults, each with
# another --seed (initial weights, sample order), and prints each run's eval_loss: the spread a
# faulted run's eval_loss is to fall within.
#   bash bench/fault_recovery.sh [build/bin/dtrain]    SCHEDULE=kill:20s SEED=1 EPOCHS=2 ONLY=
#                                                      MODEL=example TORCHFT_DIR=/opt/dtrain/torchft
#                                                      LIVE="--spares 1 --replace 1000" SPREAD=0
set -euo pipefail
cd "$(dirname "$0")/.."
dtrain=${1:-build/bin/dtrain}
bin=$(dirname "$dtrain")
schedule=${SCHEDULE:-kill:20s}
seed=${SEED:-1}
epochs=${EPOCHS:-2}
model=${MODEL:-example}
python=${DTRAIN_PYTHON:-/opt/dtrain/venv/bin/python}
torchrun=$(dirname "$python")/torchrun
export PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
torchft_dir=${TORCHFT_DIR:-/opt/dtrain/torchft}
torchft_version=0.2.0
out=$(mktemp -d "${TMPDIR:-/tmp}/fault-recovery-XXXXXX")
chaos() {
  local name=$1
  shift
  "$dtrain" chaos --schedule "$schedule" --seed "$seed" --dir "$out/$name" -- "$@" \
    > "$out/$name.log" 2>&1 || true
  echo "$name: $(grep -a '^CHAOS ' "$out/$name.log" | tail -n 1)"
}
# Beside the environment's packages, not in them: torchft pins OpenTelemetry packages that the
# environment has no other use for.
install_torchft() {
  [ -f "$torchft_dir/torchft-$torchft_version.dist-info/METADATA" ] && return
  "$python" -m pip install -q --disable-pip-version-check --target "$torchft_dir" --no-deps \
    "torchft==$torchft_version"
  "$python" -m pip install -q --disable-pip-version-check --target "$torchft_dir" \
    "opentelemetry-api>=1.39.0" "opentelemetry-sdk>=1.39.0" \
    "opentelemetry-exporter-otlp-proto-http>=1.39.0"
}
case $model in
  example) runs="live commit torchrun torchft" live=${LIVE:---replace 1000} ;;
  transformer) runs="live torchrun torchft" live=${LIVE:---spares 10 --preload torch,torch._dynamo} ;;
  *) echo "fault_recovery.sh: MODEL is example or transformer, not $model" >&2; exit 2 ;;
esac
for name in ${ONLY:-$runs}; do
  [ "$name" = torchft ] && install_torchft
  # shellcheck disable=SC2086 # $live holds several flags
  case $model:$name in
    example:live) chaos live "$dtrain" run -n 4 --live $live -- \
                    "$bin/train_fashion_mnist" --threads 1 --epochs "$epochs" ;;
    example:commit) chaos commit "$dtrain" run -n 4 --max-restarts 1000 -- \
                      "$bin/train_fashion_mnist" --threads 1 --epochs "$epochs" ;;
    example:torchrun) chaos torchrun "$torchrun" --standalone --nproc-per-node 4 \
                        --max-restarts 1000 bench/torch_elastic_fashion_mnist.py \
                        --epochs "$epochs" ;;
    example:torchft) PYTHONPATH="$PYTHONPATH:$torchft_dir" chaos torchft "$python" \
                       bench/torchft_fashion_mnist.py --replica-groups 4 --epochs "$epochs" ;;
    transformer:live) chaos live "$dtrain" run -n 4 --live $live -- "$python" \
                        bench/transformer_recovery.py live --epochs "$epochs" ;;
    transformer:torchrun) chaos torchrun "$torchrun" --standalone --nproc-per-node 4 \
                            --max-restarts 1000 bench/transformer_recovery.py torchrun \
                            --epochs "$epochs" ;;
    transformer:torchft) PYTHONPATH="$PYTHONPATH:$torchft_dir" chaos torchft "$python" \
                           bench/transformer_recovery.py torchft --replica-groups 4 \
                           --epochs "$epochs" ;;
    *) echo "fault_recovery.sh: no run $name for MODEL=$model" >&2; exit 2 ;;
  esac
done
# The jobs' own default seeds are 42 (the example) and 0 (the transformer); no spares, which
# change nothing without faults.
for k in $(seq 1 "${SPREAD:-0}"); do
  case $model in
    example) job=("$bin/train_fashion_mnist" --threads 1 --epochs "$epochs" --seed $((42 + k))) ;;
    transformer) job=("$python" bench/transformer_recovery.py live --epochs "$epochs" --seed "$k") ;;
  esac
  "$dtrain" run -n 4 --live -- "${job[@]}" > "$out/spread-$k.log" 2>&1 || true
  echo "fault-free, seed ${job[-1]}: $(grep -ao '"eval_loss": *[0-9.eE+-]*' "$out/spread-$k.log" \
    | tail -n 1)"
done
echo "runs' output: $out"
