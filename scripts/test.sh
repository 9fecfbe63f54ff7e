#!/usr/bin/env bash
# Configures, builds and runs dtrain's whole test suite (ctest), in build/.
# Usage: scripts/test.sh [ctest arguments, e.g. -R store]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_BUILD_TESTS=ON >/dev/null
cmake --build build -j"$jobs"
# Tests spawn several processes each: one test at a time keeps them from starving on 2 cores.
ctest --test-dir build --output-on-failure --timeout 300 -j1 "$@"
