#!/usr/bin/env bash
# The GPU checks of dtrain, for a machine with a GPU but without Debian's libraries (a lent GPU
# machine runs another distribution, where nothing can be installed). Two steps:
#
#   scripts/gpu_check.sh pack [BUILD]   here: strips the GPU test and benchmark of BUILD
#                                       (default build/) into .gpu/, with the shared libraries
#                                       they need that a CUDA machine may lack (NCCL excepted: the
#                                       GPU machine's own is used, it is too large to carry)
#   scripts/gpu_check.sh pack-torch BUILD
#                                       here: adds the Python package, the dtrain command and
#                                       train_fashion_mnist of BUILD, built for the GPU machine's
#                                       torch and Python (e.g. DTRAIN_BASE_PYTHON=python3.12
#                                       DTRAIN_TARGETS="dtrain dtrain_python_core
#                                       dtrain_python_torch dtrain_python_files
#                                       train_fashion_mnist" scripts/torch-versions.sh 2.11.0
#                                       builds build-torch-2.11.0-py3.12/), with the Debian
#                                       libraries they need and a part of Fashion-MNIST
#   scripts/gpu_check.sh run OUT        there: runs them from .gpu/ and writes logs and the
#                                       backend records into OUT
#
# `run` executes nccl_backend_test (the nccl backend at world size 1 and the native backend's
# CUDA tensors with three ranks on one GPU, each through the shared collectives suite) and
# gpu_bench (dtrain's nccl all_reduce against NCCL itself, the staging against plain copies),
# then, where python3 has a CUDA build of torch, bench/peers/torch_nccl_peer.py (PyTorch's own
# NCCL backend on the same sizes), and with a packed Python package, backend "dtrain" from torch
# on CUDA tensors (tests/python/device_workers.py: collectives, DDP, FSDP2 and Horovod's API, on
# 2 ranks sharing the GPU and on 1 rank through NCCL), dist.all_reduce on CUDA tensors, dtrain
# against torch's gloo, in one run, and train_fashion_mnist on the GPU (1 rank on the nccl
# backend, 2 on the native one sharing it) against the same runs on the CPU: the test
# accuracies must agree.
set -uo pipefail
cd "$(dirname "$0")/.." || exit

case "${1:-}" in
pack)
  build=${2:-build}
  for b in nccl_backend_test gpu_bench; do
    [[ -x $build/bin/$b ]] || { echo "gpu_check: $build/bin/$b is missing: build it (ninja -C $build $b)" >&2; exit 1; }
  done
  rm -rf .gpu && mkdir -p .gpu/lib
  for b in nccl_backend_test gpu_bench; do strip -o .gpu/$b "$build/bin/$b"; done
  # Everything they link but the C and C++ runtimes (newer on any CUDA machine) and NCCL.
  for lib in $(ldd .gpu/nccl_backend_test .gpu/gpu_bench | awk '/=>/ {print $3}' | sort -u); do
    case $(basename "$lib") in
      libc.so* | libm.so* | libstdc++* | libgcc_s* | libpthread* | libdl.so* | librt.so* | libnccl*) ;;
      *) cp -L "$lib" .gpu/lib/ ;;
    esac
  done
  # The test records its results under its build directory's path (DTRAIN_BIN_DIR).
  readlink -f "$build/bin" > .gpu/bin_dir
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
  du -sh .gpu
  ;;
pack-torch)
  build=${2:?usage: scripts/gpu_check.sh pack-torch BUILD}
  [[ -f $build/python/dtrain/__init__.py && -x $build/bin/dtrain ]] ||
    { echo "gpu_check: $build has no Python package or dtrain command: build it first" >&2; exit 1; }
  mkdir -p .gpu/lib .gpu/python
  rm -rf .gpu/python/dtrain && cp -r "$build/python/dtrain" .gpu/python/
  find .gpu/python -name '*.so' -exec strip --strip-debug {} +
  strip -o .gpu/dtrain "$build/bin/dtrain"
  rm -f .gpu/train_fashion_mnist
  if [[ -x $build/bin/train_fashion_mnist ]]; then
    strip -o .gpu/train_fashion_mnist "$build/bin/train_fashion_mnist"
    # The first 12,000 training images (all 60,000 would take half of what a call carries) and
    # the whole test set, as the example reads them: gzipped IDX files with their counts.
    python3 - "${DTRAIN_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}" .gpu/fashion-mnist <<'PY'
import gzip, os, shutil, struct, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
for kind, size in (("images-idx3", 28 * 28), ("labels-idx1", 1)):
    with gzip.open(f"{src}/train-{kind}-ubyte.gz") as f:
        head = bytearray(f.read(16 if size > 1 else 8))
        struct.pack_into(">I", head, 4, 12000)
        with gzip.open(f"{dst}/train-{kind}-ubyte.gz", "wb", compresslevel=9) as out:
            out.write(head + f.read(12000 * size))
    shutil.copy(f"{src}/t10k-{kind}-ubyte.gz", dst)
PY
  fi
  # What they link beyond the C and C++ runtimes, Python, torch and its nvidia-* libraries
  # (the GPU machine's own torch brings those).
  packed=(.gpu/dtrain .gpu/python/dtrain/*.so)
  [[ -x .gpu/train_fashion_mnist ]] && packed+=(.gpu/train_fashion_mnist)
  for lib in $(ldd "${packed[@]}" | awk '/=>/ {print $3}' | sort -u); do
    case $(basename "$lib") in
      libc.so* | libm.so* | libstdc++* | libgcc_s* | libpthread* | libdl.so* | librt.so* | \
      libpython* | libtorch* | libc10* | libnccl* | libcudart* | libcu* | libnv* | libshm* | libgomp*) ;;
      *) cp -L "$lib" .gpu/lib/ ;;
    esac
  done
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
  du -sh .gpu
  ;;
run)
  out=${2:?usage: scripts/gpu_check.sh run OUT}
  mkdir -p "$out"
  [[ -x .gpu/nccl_backend_test || -x .gpu/dtrain ]] || { echo "gpu_check: no .gpu/ here: run 'scripts/gpu_check.sh pack' first and carry .gpu" >&2; exit 1; }
  nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib"))' 2>/dev/null ||
             dirname "$(find /usr /opt -name 'libnccl.so.2' 2>/dev/null | head -1)")
  export LD_LIBRARY_PATH=$PWD/.gpu/lib:$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  {
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    echo "NCCL from: $nccl_dir"
    ldd .gpu/nccl_backend_test | grep -E 'not found|nccl|cudart'
  } 2>&1 | tee "$out/machine.txt"
  status=0
  if [[ -x .gpu/nccl_backend_test ]]; then
    bin_dir=$(cat .gpu/bin_dir)
    mkdir -p "$bin_dir" && rm -rf "$bin_dir/../backend_support"
    timeout 300 .gpu/nccl_backend_test --gtest_brief=0 2>&1 | tee "$out/nccl_backend_test.txt" || status=1
    cp "$bin_dir"/../backend_support/*.jsonl "$out"/ 2>/dev/null
    timeout 200 .gpu/gpu_bench --rounds 5 --iters 20 --json "$out/gpu_bench.jsonl" 2>&1 |
      tee "$out/gpu_bench.txt" || status=1
  fi
  if [[ -x .gpu/dtrain ]]; then
    # Backend "dtrain" from the machine's own torch, on CUDA tensors, 2 ranks on the one GPU.
    python3 -c 'import torch, sys; print("torch", torch.__version__, "CUDA", torch.version.cuda, sys.version.split()[0])' 2>&1 | tee -a "$out/machine.txt"
    for name in collectives ddp fsdp2 horovod; do
      PYTHONPATH=$PWD/.gpu/python PYTHONUNBUFFERED=1 timeout 240 .gpu/dtrain run -n 2 -- \
        python3 tests/python/device_workers.py "$name" cuda 2>&1 | tee "$out/torch_$name.txt" || status=1
      # The same through NCCL: one rank (NCCL takes one rank per GPU).
      PYTHONPATH=$PWD/.gpu/python PYTHONUNBUFFERED=1 DTRAIN_BACKEND=nccl timeout 120 .gpu/dtrain run -n 1 -- \
        python3 tests/python/device_workers.py "$name" cuda 2>&1 | tee "$out/torch_${name}_nccl.txt" || status=1
    done
    PYTHONPATH=$PWD/.gpu/python PYTHONUNBUFFERED=1 timeout 300 .gpu/dtrain run -n 2 -- \
      python3 bench/torch_allreduce.py --device cuda --rounds 3 --sizes 4K,64K,1M,16M,64M \
      --json "$out/torch_allreduce_cuda.jsonl" 2>&1 | tee "$out/torch_allreduce_cuda.txt" || status=1
  fi
  if [[ -x .gpu/train_fashion_mnist ]]; then
    # The example's LibTorch is the machine's torch (built for the same version here).
    torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
    train() {  # NAME RANKS BACKEND DEVICE: one run, its RESULT's test accuracy into OUT/NAME.acc
      LD_LIBRARY_PATH=$torch_lib:$LD_LIBRARY_PATH DTRAIN_BACKEND=$3 timeout 240 .gpu/dtrain run \
        -n "$2" -- .gpu/train_fashion_mnist --data .gpu/fashion-mnist --epochs 2 --device "$4" \
        2>&1 | tee "$out/train_$1.txt" || status=1
      sed -n 's/.*RESULT .*"test_accuracy":\([0-9.]*\).*/\1/p' "$out/train_$1.txt" > "$out/train_$1.acc"
    }
    train cpu_1 1 native cpu
    train cuda_1_nccl 1 nccl cuda
    train cpu_2 2 native cpu
    train cuda_2_native 2 native cuda
    # The same runs on the GPU and the CPU differ only in the order of float additions.
    for pair in "cuda_1_nccl cpu_1" "cuda_2_native cpu_2"; do
      read -r gpu cpu <<<"$pair"
      if ! python3 -c 'import sys; a, b = (float(open(f).read()) for f in sys.argv[1:]); sys.exit(abs(a - b) > 0.02)' \
          "$out/train_$gpu.acc" "$out/train_$cpu.acc" 2>/dev/null; then
        echo "gpu_check: train_$gpu's test accuracy ($(cat "$out/train_$gpu.acc")) is not within 0.02 of train_$cpu's ($(cat "$out/train_$cpu.acc")) (empty: the run printed no RESULT)"
      fi
    done 2>&1 | tee "$out/train_accuracy.txt"
    if grep -q . "$out/train_accuracy.txt"; then status=1; fi
  fi
  # PyTorch's own NCCL backend, where the machine's python3 has a CUDA build of torch.
  if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    PYTHONUNBUFFERED=1 timeout 200 python3 bench/peers/torch_nccl_peer.py --rounds 5 --iters 20 \
      --json "$out/torch_nccl.jsonl" 2>&1 | tee "$out/torch_nccl.txt" || status=1
  fi
  exit $status
  ;;
*)
  sed -n '2,19p' "$0" >&2
  exit 2
  ;;
esac
