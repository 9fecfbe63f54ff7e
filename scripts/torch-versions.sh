#!/usr/bin/env bash
# Builds dtrain against another torch and runs the tests that use torch there (the C++ ones of
# src/torch and the Python package's). CI tests the torch scripts/install-deps.sh installs; this
# checks the others dtrain supports (2.11 to 2.15), one environment and one build folder each.
# Usage: scripts/torch-versions.sh VERSION [ctest arguments]
#   e.g. scripts/torch-versions.sh 2.11.0          (about 40 minutes on 2 cores)
#   DTRAIN_BASE_PYTHON=/path/to/python3.12 scripts/torch-versions.sh 2.11.0   (another Python)
#   DTRAIN_TARGETS="dtrain train_fashion_mnist" scripts/torch-versions.sh 2.11.0
#                                 (builds those targets alone and runs no test: what
#                                 scripts/gpu_check.sh pack-torch carries to a GPU machine)
# The environment is /opt/dtrain/venv-torch-VERSION-pyX.Y (DTRAIN_BASE_PYTHON, default Debian's
# /usr/bin/python3; torch from PyPI); the build is build-torch-VERSION-pyX.Y/. Run
# scripts/install-deps.sh first for the Debian packages.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: scripts/torch-versions.sh VERSION [ctest arguments], e.g. 2.11.0}
shift
base=${DTRAIN_BASE_PYTHON:-/usr/bin/python3}
pyver=$("$base" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
venv=/opt/dtrain/venv-torch-$version-py$pyver
py=$venv/bin/python
if [ ! -x "$py" ]; then
  echo "torch-versions: making $venv ($base)"
  "$base" -m venv "$venv"
fi
# torch, and what the tests use (the wheel's build backend among them, as scripts/install-deps.sh).
if ! "$py" -c "import torch, numpy, pytest, yaml, scikit_build_core, build, expecttest
assert torch.__version__.split('+')[0] == '$version'" 2>/dev/null; then
  echo "torch-versions: installing torch $version from PyPI into $venv"
  "$py" -m pip install --progress-bar on --disable-pip-version-check "torch==$version" numpy \
    pytest pyyaml scikit-build-core build expecttest
fi
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
build=build-torch-$version-py$pyver
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_BUILD_TESTS=ON \
  -DPython3_EXECUTABLE="$py" -DDTRAIN_TEST_DIRS="torch" >/dev/null
if [ -n "${DTRAIN_TARGETS:-}" ]; then
  # shellcheck disable=SC2086 # a list of targets
  cmake --build "$build" -j"${DTRAIN_JOBS:-$(nproc)}" --target $DTRAIN_TARGETS
  exit 0
fi
cmake --build "$build" -j"${DTRAIN_JOBS:-$(nproc)}"
# Only tests/torch and the Python package's tests are built there.
if [ $# -eq 0 ]; then set -- -E '^format\.'; fi
ctest --test-dir "$build" --output-on-failure --timeout 600 -j1 "$@"
