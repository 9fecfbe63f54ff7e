#!/usr/bin/env bash
# Horovod-style training from Python on dtrain (examples/python/horovod_fashion_mnist.py), with
# glibc's malloc (--no-jemalloc) and with the jemalloc `dtrain run` preloads by default, against the C++ example with the same
# algorithm (train_fashion_mnist --strategy optimizer) and against PyTorch DDP on gloo
# (bench/torch_ddp_fashion_mnist.py): the Fashion-MNIST ConvNet, 2 ranks, 1 thread each, batch 100
# per rank, STEPS steps; the four alternate in rotating order, ROUNDS times. Prints each run's
# images/s and the medians and ratios (docs/performance.md, "Horovod's API from Python").
#   bash bench/horovod_python.sh [build/bin/dtrain]      ROUNDS=5 STEPS=300 NP=2 by default
set -euo pipefail
cd "$(dirname "$0")/.."
dtrain=${1:-build/bin/dtrain}
bin=$(dirname "$dtrain")
rounds=${ROUNDS:-5}
steps=${STEPS:-300}
np=${NP:-2}
export PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
run() {
  case $1 in
    python) "$dtrain" run --no-jemalloc -n "$np" -- python3 examples/python/horovod_fashion_mnist.py \
              --threads 1 --max-steps "$steps" --log-every 100000 ;;
    # The same, with the allocator the C++ programs link (docs/pytorch.md, "Speed").
    python_jemalloc) "$dtrain" run -n "$np" -- \
              python3 examples/python/horovod_fashion_mnist.py --threads 1 \
              --max-steps "$steps" --log-every 100000 ;;
    cpp) "$dtrain" run -n "$np" -- "$bin/train_fashion_mnist" --strategy optimizer --threads 1 \
              --max-steps "$steps" ;;
    # PyTorch's DDP as a gloo user runs it (no jemalloc), the reference of the earlier figures.
    ddp_gloo) "$dtrain" run --no-jemalloc -n "$np" -- python3 bench/torch_ddp_fashion_mnist.py \
              --max-steps "$steps" --backend gloo ;;
  esac
}
declare -A ips
names=(python python_jemalloc cpp ddp_gloo)
for r in $(seq 1 "$rounds"); do
  for k in 0 1 2 3; do
    b=${names[$(( (r + k) % 4 ))]}
    line=$(run "$b" | grep -o 'RESULT .*' | sed 's/^RESULT //')
    v=$(/usr/bin/python3 -c 'import json,sys; print("%.0f" % json.loads(sys.argv[1])["images_per_sec"])' "$line")
    echo "round $r $b: $v images/s"
    ips[$b]+="$v "
  done
done
/usr/bin/python3 - "${ips[python]}" "${ips[python_jemalloc]}" "${ips[cpp]}" "${ips[ddp_gloo]}" <<'PY'
import statistics, sys
p, j, c, g = ([float(x) for x in a.split()] for a in sys.argv[1:5])
def show(name, xs):
    return f"{name} {statistics.median(xs):.0f} [{min(xs):.0f}, {max(xs):.0f}]"
print("median images/s: " + ", ".join([show("python-hvd", p), show("python-hvd+jemalloc", j),
                                        show("c++ optimizer", c), show("ddp-gloo", g)]))
for mine, xs in (("python-hvd", p), ("python-hvd+jemalloc", j)):
    for name, other in (("c++ optimizer", c), ("ddp-gloo", g)):
        r = [a / b for a, b in zip(xs, other)]
        print(f"{mine} / {name}: {statistics.median(r):.3f}x [{min(r):.3f}, {max(r):.3f}]")
PY
