#!/usr/bin/env bash
# Builds dtrain and runs the main job: Fashion-MNIST trained data parallel by two processes on
# this machine, through `dtrain run` (DistributedDataParallel over dtrain's shared-memory
# transport), one epoch. Extra arguments go to train_fashion_mnist, e.g. --strategy optimizer.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target dtrain train_fashion_mnist
build/bin/dtrain run -n 2 -- build/bin/train_fashion_mnist --epochs 1 "$@"
