#!/usr/bin/env python3
"""torch_nccl_peer: torch.distributed's own NCCL backend (ProcessGroupNCCL) beside gpu_bench.

The same measurement as gpu_bench's "allreduce" part, with the same sizes, values and modes:
in-place f32 sum all-reduce on a world of one, "sync" (each call waited for:
torch.cuda.synchronize) and "pipelined" (`iters` calls, then one synchronize), `rounds` rounds,
the median per op. Needs a PyTorch built with CUDA and NCCL (a lent GPU machine's, not Debian's).
    python3 bench/peers/torch_nccl_peer.py [--rounds 5] [--iters 20] [--json FILE]
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30]


def label(n):
    for shift, unit in ((30, "G"), (20, "M"), (10, "K")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def per_op(iters, warmup, op, each):
    for _ in range(warmup):
        op()
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        op()
        if each:
            torch.cuda.synchronize()
    if not each:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    print(f"torch_nccl_peer on {torch.cuda.get_device_name(0)}: torch {torch.__version__}, "
          f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
    rows = []
    for nbytes in SIZES:
        t = torch.arange(nbytes // 4, device="cuda", dtype=torch.float32) % 251
        want = t.clone()
        times = {"sync": [], "pipelined": []}
        for _ in range(args.rounds):
            for mode in ("sync", "pipelined"):
                times[mode].append(per_op(args.iters, 3, lambda: dist.all_reduce(t), mode == "sync"))
        if not torch.equal(t, want):
            raise SystemExit(f"torch_nccl_peer: all_reduce on a world of one changed a {label(nbytes)} tensor")
        for mode, seconds in times.items():
            us = statistics.median(seconds) * 1e6
            rows.append({"device": torch.cuda.get_device_name(0), "part": "allreduce",
                         "impl": "torch-nccl", "mode": mode, "bytes": nbytes, "median_us": us,
                         "rounds": len(seconds)})
            print(f"allreduce  torch-nccl  {mode:10s} {label(nbytes):>6s} {us:10.1f} us")
        del t, want
    if args.json:
        with open(args.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
