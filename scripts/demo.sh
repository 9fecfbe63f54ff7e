#!/usr/bin/env bash
# Builds dtrain, installs it, and runs the main job: Fashion-MNIST trained data parallel by two
# processes on this machine, through `dtrain run` (DistributedDataParallel over dtrain's
# shared-memory transport), one epoch. Extra arguments go to train_fashion_mnist, e.g.
# --strategy optimizer.
# It installs under /usr/local (CMAKE_INSTALL_PREFIX): the dtrain tool, the headers, the
# libraries and the CMake package (find_package(dtrain), dtrain.pc); and the Python package into
# the environment scripts/install-deps.sh made (/opt/dtrain/venv: import dtrain, import
# dtrain.torch), whose torch every part of dtrain is built against.
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
# What `cmake --install` installs, and the main job's trainer; not the tests.
available=$(ninja -C build -t targets all 2>/dev/null |
  grep -oE '^(dtrain_core_shared|dtrain_torch_shared|dtrain_python_[a-z]+):' | tr -d ':' || true)
cmake --build build -j"$(nproc)" --target dtrain train_fashion_mnist $available
cmake --install build >/dev/null
ldconfig
build/bin/dtrain run -n 2 -- build/bin/train_fashion_mnist --epochs 1 "$@"
