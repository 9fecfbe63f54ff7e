#!/usr/bin/env bash
# Configures, builds and runs dtrain's whole test suite (ctest), in build/.
# Usage: scripts/test.sh [ctest arguments, e.g. -R store]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# ccache keys on paths relative to the checkout: a fresh clone elsewhere, and the wheel the
# packaging test builds (build/wheel), reuse what another build compiled.
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_BUILD_TESTS=ON >/dev/null
cmake --build build -j"$jobs"
# The Python package in the environment the build is for, as the README's install command leaves
# it (the tests themselves use build/python).
if [ -f build/python/dtrain/__init__.py ]; then cmake --install build --component python >/dev/null; fi
# Tests spawn several processes each: one test at a time keeps them from starving on 2 cores.
ctest --test-dir build --output-on-failure --timeout 300 -j1 "$@"
# Every parser of outside bytes under libFuzzer (clang, ASan, UBSan; its own build-fuzz/), for a
# short budget per target; longer runs and the sanitizer suites: scripts/fuzz.sh SECONDS,
# scripts/sanitize.sh asan|tsan. Only when the whole suite ran (no ctest arguments).
if [ $# -eq 0 ]; then bash scripts/fuzz.sh "${FUZZ_SECONDS:-15}"; fi
