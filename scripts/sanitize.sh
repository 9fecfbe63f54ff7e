#!/usr/bin/env bash
# The test suite under sanitizers, each in a build folder of its own:
#   bash scripts/sanitize.sh asan [ctest args]   AddressSanitizer + UBSan, every C++ test (build-asan/)
#   bash scripts/sanitize.sh tsan [ctest args]   ThreadSanitizer, the transport, store, comm, ps and data
#                                               tests (build-tsan/; LibTorch is not instrumented)
# Python's tests are left out: the interpreter would need the sanitizer runtime preloaded. Slow
# on 2 cores (a full build each, tests 2-10x slower): run before resolving a change to threads,
# rings or parsers; CI runs the fuzzers (scripts/fuzz.sh) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/sanitize.sh asan|tsan [ctest args]}
shift
case "$kind" in
  asan)
    dir=build-asan
    flags=(-DDTRAIN_SANITIZE=address,undefined)
    export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:detect_stack_use_after_return=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    ;;
  tsan)
    dir=build-tsan
    flags=(-DDTRAIN_SANITIZE=thread "-DDTRAIN_TEST_DIRS=common;store;transport;comm;ps;data"
           -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON -DCMAKE_DISABLE_FIND_PACKAGE_TensorFlow=ON)
    # The tests' ranks are forked children that may _exit with threads running (a crash, on
    # purpose), and some fork from a parent that runs a store server's threads: neither is a bug,
    # but TSan reports the first (thread leak) and kills the second (die_after_fork).
    # tests/tsan.supp lists the reports that are not races, each with its reason.
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:report_thread_leaks=0:die_after_fork=0:suppressions=$PWD/tests/tsan.supp"
    ;;
  *)
    echo "scripts/sanitize.sh: '$kind' is not asan or tsan" >&2
    exit 2
    ;;
esac
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_BUILD_TESTS=ON \
  -DDTRAIN_BUILD_EXAMPLES=ON "${flags[@]}" >/dev/null
cmake --build "$dir" -j"$(nproc)"
ctest --test-dir "$dir" --output-on-failure --timeout 900 -j1 -E '^python\.|^install\.' "$@"
