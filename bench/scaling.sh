#!/usr/bin/env bash
# images/s of the Fashion-MNIST ConvNet (1 thread per rank, batch 100 per rank) against the
# number of ranks, for dtrain's C++ DDP (train_fashion_mnist) and PyTorch's DDP on gloo
# (bench/torch_ddp_fashion_mnist.py, the environment's torch) side by side, and the plot of
# docs/performance.md (docs/scaling.svg, labelled with this machine). On a machine with C cores,
# ranks beyond C share cores: the curves then show what oversubscription costs.
#   bash bench/scaling.sh [build/bin] [max ranks, default 4]      STEPS=150 by default
set -euo pipefail
bin=${1:-build/bin}
max=${2:-4}
steps=${STEPS:-150}
csv=${OUT:-bench-results}/scaling.csv
here=$(dirname "$0")
mkdir -p "$(dirname "$csv")"
ips() { /usr/bin/python3 -c "import json,sys; print(round(json.loads(sys.argv[1][7:])['images_per_sec']))" "$1"; }
echo "ranks,dtrain,pytorch_ddp" > "$csv"
for n in $(seq 1 "$max"); do
  # Alternate which runs first, so that neither always gets the cooler machine.
  for impl in $( (( n % 2 )) && echo "dtrain torch" || echo "torch dtrain"); do
    if [ "$impl" = dtrain ]; then
      line=$("$bin/dtrain" run -n "$n" --master-port 0 -- "$bin/train_fashion_mnist" --threads 1 \
        --max-steps "$steps" 2>&1 | grep -o 'RESULT .*')
      d=$(ips "$line")
    else
      line=$(OMP_NUM_THREADS=1 "$bin/dtrain" run -n "$n" --master-port 0 -- python3 \
        "$here/torch_ddp_fashion_mnist.py" --max-steps "$steps" --backend gloo 2>&1 | grep -o 'RESULT .*')
      t=$(ips "$line")
    fi
  done
  echo "$n,$d,$t" | tee -a "$csv"
done
machine="$(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(date +%Y-%m-%d)"
/usr/bin/python3 "$here/../tools/plot_scaling.py" "$csv" docs/scaling.svg "$machine"
echo "wrote docs/scaling.svg"
