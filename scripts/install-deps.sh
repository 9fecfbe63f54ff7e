#!/usr/bin/env bash
# Installs every Debian package dtrain needs to build, test and run its main job.
# Idempotent: packages already present are skipped, so a second run takes a second.
# Run as root (or with sudo available) on Debian 12.
#   scripts/install-deps.sh   what the build, the tests, the backends and the Python package need
# (--bench is accepted for older instructions: python3-torch, the torch peer of `dtrain bench`,
# is always installed now, since the Python package needs it.)
set -euo pipefail

for arg in "$@"; do
  case "$arg" in
    --bench) ;;
    -h|--help)
      echo "usage: scripts/install-deps.sh"
      exit 0 ;;
    *) echo "install-deps: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

packages=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config git
  # libraries used by every target
  libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev libssl-dev zlib1g-dev
  # the tool: dtrain run's Prometheus endpoint, dtrain submit's YAML job files
  prometheus-cpp-dev libyaml-cpp-dev
  # tests and benchmarks; clang with libFuzzer and the sanitizer runtimes (scripts/fuzz.sh)
  libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-dev
  # the library tree's format (scripts/check-format.sh, run by the tests)
  clang-format
  # process tools used by the tests (ps, kill, ip)
  procps iproute2
  # the emulated clusters of scripts/netns-hosts.sh: loss and delay spikes without netem
  nftables
  # dtrain_torch and the Fashion-MNIST job: LibTorch, the data, jemalloc, OpenBLAS as libblas.so.3
  libtorch-dev dataset-fashion-mnist libjemalloc-dev libopenblas0-pthread
  # the Gloo and MPI backends, and the gloo/mpi peers of `dtrain bench`
  libgloo-dev libopenmpi-dev openmpi-bin
  # the Python package (torch.distributed backend): Debian's torch, pybind11, headers; its tests
  python3-torch python3-dev pybind11-dev python3-pytest python3-numpy
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

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
