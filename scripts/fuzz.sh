#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang with AddressSanitizer and UBSan) in build-fuzz/
# and runs each for SECONDS (default 20) from its committed corpus (tests/fuzz/corpus/<name>/),
# new inputs going to build-fuzz/corpus/<name>/. A crash stops the script, naming the target and
# the input file (crash-*) to turn into a test.
#   bash scripts/fuzz.sh [SECONDS]      e.g. 600 before resolving a change to a parser
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DDTRAIN_FUZZ=ON -DDTRAIN_BUILD_TESTS=OFF -DDTRAIN_BUILD_EXAMPLES=OFF \
  -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON -DCMAKE_DISABLE_FIND_PACKAGE_TensorFlow=ON >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_all
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export DTRAIN_LOG_LEVEL=off  # the refusals are expected: their log lines would only slow the runs
for target in store_request handshake torch_store safetensors identity ps_server ps_checkpoint \
    tfrecord tar_shard pipeline_schedule sched_trace; do
  work=build-fuzz/corpus/$target
  mkdir -p "$work"
  stamp=$(mktemp)  # failing inputs newer than this are this run's
  if [ ! -x "build-fuzz/bin/${target}_fuzz" ]; then
    echo "fuzz: build-fuzz/bin/${target}_fuzz was not built" >&2
    exit 1
  fi
  echo "fuzz: $target for ${seconds} s"
  (cd build-fuzz && "./bin/${target}_fuzz" -max_total_time="$seconds" -max_len=65536 \
    -timeout=10 -print_final_stats=1 "corpus/$target" "../tests/fuzz/corpus/$target" 2>&1 |
    grep -aE "^(stat::number_of_executed_units|==[0-9]+== ?ERROR|SUMMARY|.*crash-|.*runtime error|terminate called|.*what\(\): | +#[0-9]+ )" ||
    true)
  found=$(find build-fuzz -maxdepth 1 \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) -newer "$stamp")
  rm -f "$stamp"
  if [ -n "$found" ]; then
    echo "fuzz: $target found a failing input: $found (run: build-fuzz/bin/${target}_fuzz $found)"
    exit 1
  fi
done
echo "fuzz: every target ran ${seconds} s without a failure"
