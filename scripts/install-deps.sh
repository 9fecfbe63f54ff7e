#!/usr/bin/env bash
# Installs what dtrain needs to build, test and run its main job: Debian's packages, then a
# Python virtual environment holding PyTorch from PyPI (Debian's own python3 refuses pip installs,
# PEP 668, and its torch is 1.13). Idempotent: what is present is skipped, so a second run takes
# seconds. Run as root (or with sudo available) on Debian 12.
#   scripts/install-deps.sh            packages, and the environment at $DTRAIN_VENV
#   DTRAIN_VENV=DIR                    where the environment is (default /opt/dtrain/venv)
#   DTRAIN_TORCH_VERSION=2.15.0        which torch to install into it (default: the one below)
#   --tensorflow                       also TensorFlow (tensorflow-cpu and tf_keras from PyPI, about
#                                      600 MB): the build has dtrain.tensorflow, the tests test it
set -euo pipefail

tensorflow=""
for arg in "$@"; do
  case "$arg" in
    --bench) ;;  # accepted for older instructions: the bench's peers are always installed
    --tensorflow) tensorflow=1 ;;
    -h|--help)
      sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
      exit 0 ;;
    *) echo "install-deps: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done
venv=${DTRAIN_VENV:-/opt/dtrain/venv}
# The newest torch dtrain is tested with; scripts/torch-versions.sh builds and tests any other.
torch_version=${DTRAIN_TORCH_VERSION:-2.15.0}

packages=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config git
  # libraries used by every target
  libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev libssl-dev zlib1g-dev
  # the tool: dtrain run's Prometheus endpoint (served by libmicrohttpd), dtrain submit's YAML
  prometheus-cpp-dev libmicrohttpd-dev libyaml-cpp-dev
  # tests and benchmarks; clang with libFuzzer and the sanitizer runtimes (scripts/fuzz.sh)
  libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-dev
  # the library tree's format (scripts/check-format.sh, run by the tests)
  clang-format
  # the test that loads dtrain run's metrics page in a headless browser (metrics_test)
  chromium
  # process tools used by the tests (ps, kill, ip)
  procps iproute2
  # the emulated clusters of scripts/netns-hosts.sh: loss and delay spikes without netem
  nftables
  # the Fashion-MNIST job's data, and jemalloc (LibTorch itself comes with torch, below)
  dataset-fashion-mnist libjemalloc-dev
  # the Gloo and MPI backends, and the gloo/mpi peers of `dtrain bench`
  libgloo-dev libopenmpi-dev openmpi-bin
  # the Python package: headers, the virtual environment, pybind11 for a build without torch
  python3-dev python3-venv pybind11-dev
  # tests/launch/engines_test: a throwaway single-node Slurm (slurmctld, slurmd, srun, munge)
  # and the Kubernetes manifests read with PyYAML
  slurm-wlm munge python3-yaml
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} Debian packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Python environment: Debian's interpreter (the python3 first on PATH may be another), torch
# from PyPI (a CUDA build, several GB with its nvidia-* packages; it runs on CPU too), and what
# the tests and `pip install .` use. The build, the tests and `dtrain run` use its interpreter.
py="$venv/bin/python"
if [ ! -x "$py" ]; then
  echo "install-deps: making the virtual environment $venv (Debian's /usr/bin/python3)"
  $sudo mkdir -p "$(dirname "$venv")"
  $sudo /usr/bin/python3 -m venv "$venv"
fi
have=$("$py" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)
if [ "$have" != "$torch_version" ]; then
  echo "install-deps: installing torch $torch_version from PyPI into $venv (found: ${have:-none};" \
       "about 3 GB, a minute or more)"
  $sudo "$py" -m pip install --progress-bar on --disable-pip-version-check \
    "torch==$torch_version"
fi
# numpy, pytest, PyYAML (the Kubernetes manifests' tests), the build backend of `pip install .`,
# expecttest (torch's own test suite imports it: bench/torch_suite.py) and mypy (the package's
# types and stubs: tests/python/test_typing.py)
if ! "$py" -c "import numpy, pytest, yaml, scikit_build_core, build, expecttest, mypy" \
    2>/dev/null; then
  $sudo "$py" -m pip install -q --disable-pip-version-check numpy pytest pyyaml \
    scikit-build-core build expecttest "mypy==2.4.1"
fi
# The release dtrain.tensorflow is built and tested against (cmake/python_env.cmake's range).
tf_version=2.21.0
if [ -n "$tensorflow" ]; then
  have_tf=$("$py" -c 'import importlib.metadata as m; print(m.version("tensorflow-cpu"))' \
            2>/dev/null || true)
  if [ "$have_tf" != "$tf_version" ]; then
    echo "install-deps: installing tensorflow-cpu $tf_version from PyPI into $venv (found:" \
         "${have_tf:-none}; about 600 MB)"
    $sudo "$py" -m pip install -q --disable-pip-version-check "tensorflow-cpu==$tf_version"
  fi
  # Keras 2 (tf.keras under TF_USE_LEGACY_KERAS=1, which Horovod's own Keras scripts need on
  # TensorFlow 2.16 and later). Without its dependencies: it names `tensorflow`, whose CPU build
  # is the tensorflow-cpu above.
  if ! "$py" -c 'import importlib.util as u; exit(u.find_spec("tf_keras") is None)'; then
    $sudo "$py" -m pip install -q --disable-pip-version-check --no-deps "tf_keras==$tf_version"
  fi
fi
echo "install-deps: done; the Python environment is $venv (python: $py, torch $("$py" -c \
'import torch; print(torch.__version__)'))"
