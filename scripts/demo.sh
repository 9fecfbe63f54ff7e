#!/usr/bin/env bash
# Builds dtrain and runs the main job: Fashion-MNIST trained data parallel by two processes on
# this machine, through `dtrain run` (DistributedDataParallel over dtrain's shared-memory
# transport), one epoch. Extra arguments go to train_fashion_mnist, e.g. --strategy optimizer.
# It also installs the Python package, so that `import dtrain.torch` works for /usr/bin/python3.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target dtrain train_fashion_mnist
# The Python package (import dtrain; import dtrain.torch: the torch.distributed backend and
# Horovod's API), when it was configured, installed for /usr/bin/python3
# (/usr/local/lib/python3.11/dist-packages).
targets=$(ninja -C build -t targets all 2>/dev/null | grep -o '^dtrain_python_[a-z]*' || true)
if [ -n "$targets" ]; then
  cmake --build build -j"$(nproc)" --target $targets
  cmake --install build --component python >/dev/null
fi
build/bin/dtrain run -n 2 -- build/bin/train_fashion_mnist --epochs 1 "$@"
