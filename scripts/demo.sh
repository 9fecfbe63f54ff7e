#!/usr/bin/env bash
# Builds dtrain and runs the main job: a real two-process run through `dtrain run`.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target dtrain p2p_demo
build/bin/dtrain run -n 2 -- build/bin/p2p_demo
