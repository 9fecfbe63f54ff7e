#!/usr/bin/env bash
# A user's first programs against an installed dtrain, the way the README says to write them:
#   1. `cmake --install` into a scratch prefix;
#   2. the README's five-line CMakeLists.txt ("Use dtrain in your project") builds
#      examples/ddp_mlp.cc as train.cc against find_package(dtrain) and dtrain::torch, plus
#      examples/allreduce.cc against dtrain::core;
#   3. pkg-config builds examples/allreduce.cc;
#   4. each runs on 2 ranks under the installed `dtrain run`, and its answer is checked;
#   5. a project that adds dtrain's tree with add_subdirectory configures with dtrain::core and
#      dtrain::torch and without our tests and examples;
#   6. the installed `dtrain sched-sim` finds the traces installed beside it (share/dtrain/pollux),
#      and `dtrain docs` the documentation (share/dtrain/docs), to which every --help points.
# Usage: consumer.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
test -f "$prefix/lib/cmake/dtrain/dtrainConfig.cmake"
test -f "$prefix/lib/pkgconfig/dtrain.pc"
test -f "$prefix/include/dtrain/dtrain.h"

project=$work/project
mkdir "$project"
python3 "$src/tools/docs_snippets.py" cmake "$src/README.md" "Use dtrain in your project" \
  >"$project/CMakeLists.txt"
cat >>"$project/CMakeLists.txt" <<'CMAKE'
add_executable(allreduce allreduce.cc)
target_link_libraries(allreduce PRIVATE dtrain::core)
CMAKE
cp "$src/examples/ddp_mlp.cc" "$project/train.cc"
cp "$src/examples/allreduce.cc" "$project/allreduce.cc"
cmake -S "$project" -B "$project/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >"$work/configure.log" || { cat "$work/configure.log"; exit 1; }
cmake --build "$project/build"

expect() {  # expect TEXT COMMAND...: runs it and checks that TEXT is in its output
  local text=$1 out
  shift
  out=$("$@" 2>&1) || { echo "$out"; echo "FAILED: $*"; exit 1; }
  grep -qF -- "$text" <<<"$out" || { echo "$out"; echo "'$text' not in the output of: $*"; exit 1; }
}
expect "sum 1 (expected 1)" "$prefix/bin/dtrain" run -n 2 --master-port 0 -- "$project/build/allreduce"
expect "parameters identical on every rank: yes" \
  "$prefix/bin/dtrain" run -n 2 --master-port 0 -- "$project/build/train"
expect "$prefix/share/dtrain/pollux" "$prefix/bin/dtrain" sched-sim --help
expect "tiresias/spread" "$prefix/bin/dtrain" sched-sim \
  "$prefix/share/dtrain/pollux/workloads/workload-6.csv"
expect "$prefix/share/dtrain/docs" "$prefix/bin/dtrain" docs --path
expect "Training data in shard files" "$prefix/bin/dtrain" docs
expect "dtrain data write --from FOLDER" "$prefix/bin/dtrain" docs data
# Every topic a --help or the variables' table names is there.
helps=$("$prefix/bin/dtrain" --help; "$prefix/bin/dtrain" env)
for command in $("$prefix/bin/dtrain" --help | awk '/^Subcommands:/ {on = 1; next} on && NF {print $1}'); do
  helps+=$("$prefix/bin/dtrain" "$command" --help)
done
topics=$(grep -o 'dtrain docs [a-z_]*' <<<"$helps" | sort -u | cut -d' ' -f3)
test -n "$topics"
for topic in $topics; do
  "$prefix/bin/dtrain" docs "$topic" >/dev/null || { echo "dtrain docs $topic: no such topic"; exit 1; }
done

PKG_CONFIG_PATH=$prefix/lib/pkgconfig
export PKG_CONFIG_PATH
# shellcheck disable=SC2046
c++ -O1 "$src/examples/allreduce.cc" -o "$work/allreduce_pc" $(pkg-config --cflags --libs dtrain) \
  -Wl,-rpath,"$prefix/lib"
expect "sum 1 (expected 1)" "$prefix/bin/dtrain" run -n 2 --master-port 0 -- "$work/allreduce_pc"

parent=$work/parent
mkdir "$parent"
cat >"$parent/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(parent CXX)
add_subdirectory("$src" dtrain)
add_executable(allreduce "$src/examples/allreduce.cc")
target_link_libraries(allreduce PRIVATE dtrain::core)
CMAKE
cmake -S "$parent" -B "$parent/build" -G Ninja >"$work/parent.log" || { cat "$work/parent.log"; exit 1; }
targets=$(ninja -C "$parent/build" -t targets all)
grep -q "^allreduce:" <<<"$targets" || { echo "add_subdirectory: no allreduce target"; exit 1; }
if grep -qE "^(collectives_test|ddp_mlp|train_fashion_mnist):" <<<"$targets"; then
  echo "add_subdirectory built dtrain's own tests or examples"
  exit 1
fi
echo "installed dtrain: find_package, pkg-config and add_subdirectory all work"
