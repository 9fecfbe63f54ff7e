#!/usr/bin/python3
"""torch_peer: the torch.distributed (gloo backend) side of `dtrain bench`.

Started by the driver, N processes with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
OMP_NUM_THREADS=1 set:
    /usr/bin/python3 bench/peers/torch_peer.py --coll allreduce --sizes 4096,1048576 \
        [--dtype f32] [--op sum] [--iters 20] [--warmup 5] [--check 1] [--timeout 60]
Rank 0 prints one JSON result line per collective and size on stdout. It mirrors
bench/bench_common.{h,cc} exactly (layouts, input values, expected results, the timing loop,
statistics, busbw factors, the JSON fields): a change there must be made here too.
"""

import argparse
import resource
import datetime
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist

DTYPES = {"f32": torch.float32, "f64": torch.float64, "i32": torch.int32, "i64": torch.int64}
ELEM_SIZE = {"f32": 4, "f64": 8, "i32": 4, "i64": 8}
OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
       "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
REDUCTIONS = ("allreduce", "reduce", "reducescatter")
COLLECTIVES = ("allreduce", "broadcast", "reduce", "allgather", "gather", "scatter",
               "reducescatter", "alltoall", "barrier", "sendrecv")
# torch 1.13's gloo backend has no reduce_scatter (ProcessGroupGloo throws); skip it cleanly.
UNSUPPORTED = {"reducescatter": "torch.distributed's gloo backend has no reduce_scatter"}


def process_cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--coll", required=True)
    p.add_argument("--sizes", default="4096")
    p.add_argument("--dtype", default="f32", choices=sorted(DTYPES))
    p.add_argument("--op", default="sum", choices=sorted(OPS))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--check", default="1")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--algo", default="")
    p.add_argument("--straggle-ms", type=float, default=0.0)
    a = p.parse_args()
    a.coll = [c for c in a.coll.split(",") if c]
    for c in a.coll:
        if c not in COLLECTIVES:
            p.error(f"unknown collective {c!r}: use one of {', '.join(COLLECTIVES)}")
    a.sizes = [int(s) for s in a.sizes.split(",") if s]
    a.check = a.check != "0"
    return a


def layout_for(coll, requested_bytes, n, dtype):
    """bench_common.cc layout_for: (bytes, count, in_count, out_count, block)."""
    es = ELEM_SIZE[dtype]
    count = requested_bytes // es
    in_count = out_count = block = 0
    if coll == "barrier":
        return 0, 0, 0, 0, 0
    if coll in ("allreduce", "broadcast", "reduce"):
        in_count = block = count
    elif coll == "sendrecv":
        in_count = out_count = block = count
    elif coll in ("allgather", "gather"):
        block = count // n
        in_count, out_count = block, block * n
    elif coll in ("scatter", "reducescatter"):
        block = count // n
        in_count, out_count = block * n, block
    elif coll == "alltoall":
        block = count // n
        in_count = out_count = block * n
    total = max(in_count, out_count)
    return total * es, total, in_count, out_count, block


def busbw_factor(coll, n):
    if coll == "allreduce":
        return 2.0 * (n - 1) / n
    if coll in ("reducescatter", "allgather", "alltoall", "gather", "scatter"):
        return (n - 1) / n
    if coll in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    return 0.0


def input_values(op, rank, index):
    """bench_common.cc input_value over int64 tensors (rank: an int or a tensor), as float64."""
    if op == "prod":
        return 1.0 - 2.0 * ((rank + index) % 3 == 0).to(torch.float64)
    return ((5 * rank + 3 * (index % 17)) % 17 - 8).to(torch.float64)


def reduce_all(op, n, index):
    acc = input_values(op, 0, index)
    for r in range(1, n):
        v = input_values(op, r, index)
        if op == "sum":
            acc = acc + v
        elif op == "prod":
            acc = acc * v
        elif op == "min":
            acc = torch.minimum(acc, v)
        else:
            acc = torch.maximum(acc, v)
    return acc


def expected(coll, op, rank, n, block, k):
    if coll in ("allreduce", "reduce"):
        return reduce_all(op, n, k)
    if coll == "broadcast":
        return input_values(op, 0, k)
    if coll in ("allgather", "gather"):
        return input_values(op, torch.div(k, block, rounding_mode="floor"), k % block)
    if coll == "scatter":
        return input_values(op, 0, rank * block + k)
    if coll == "reducescatter":
        return reduce_all(op, n, rank * block + k)
    if coll == "alltoall":
        return input_values(op, torch.div(k, block, rounding_mode="floor"), rank * block + k % block)
    if coll == "sendrecv":
        return input_values(op, (rank + n - 1) % n, k)
    raise ValueError(coll)


def count_wrong(coll, op, rank, n, lay, out, dtype):
    _, _, in_count, out_count, block = lay
    if coll == "barrier" or (coll in ("reduce", "gather") and rank != 0):
        return 0
    if coll in ("allreduce", "reduce", "broadcast", "sendrecv"):
        m = in_count
    elif coll in ("allgather", "gather", "alltoall"):
        m = out_count
    else:
        m = block
    if m == 0:
        return 0
    k = torch.arange(m, dtype=torch.int64)
    want = expected(coll, op, rank, n, block, k).to(DTYPES[dtype])
    return int((out[:m] != want).sum().item())


def summarize(seconds):
    s = sorted(seconds)
    n = len(s)
    median = s[n // 2] if n % 2 == 1 else 0.5 * (s[n // 2 - 1] + s[n // 2])
    rank = min(max(math.ceil(0.99 * n), 1), n)
    return 1e6 * median, 1e6 * s[rank - 1]


class Bench:
    def __init__(self, args):
        self.a = args
        self.rank = dist.get_rank()
        self.n = dist.get_world_size()

    def max_over_ranks(self, v):
        t = torch.tensor([v], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def sum_over_ranks(self, v):
        t = torch.tensor([v], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.item()

    def run_size(self, coll, nbytes):
        a, rank, n = self.a, self.rank, self.n
        lay = layout_for(coll, nbytes, n, a.dtype)
        total_bytes, count, in_count, out_count, block = lay
        tdtype = DTYPES[a.dtype]
        in_place = coll in ("allreduce", "broadcast", "reduce")
        pristine = input_values(a.op, rank, torch.arange(max(in_count, 1), dtype=torch.int64)).to(tdtype)
        inp = pristine.clone()
        out = inp if in_place else torch.empty(max(out_count, 1), dtype=tdtype)
        op = OPS[a.op]

        def prepare(poison=False):
            if in_place:
                inp.copy_(pristine)
            elif poison:
                out.fill_(127 if not tdtype.is_floating_point else 3.0e38 if tdtype == torch.float32 else 1e300)

        if coll == "allreduce":
            def run(): dist.all_reduce(inp, op=op)
        elif coll == "broadcast":
            def run(): dist.broadcast(inp, src=0)
        elif coll == "reduce":
            def run(): dist.reduce(inp, dst=0, op=op)
        elif coll == "allgather":
            outs = list(out[: n * block].split(block)) if block > 0 else [out[:0] for _ in range(n)]
            src = inp[:block]
            def run(): dist.all_gather(outs, src)
        elif coll == "gather":
            outs = list(out[: n * block].split(block)) if rank == 0 and block > 0 else None
            src = inp[:block]
            def run(): dist.gather(src, gather_list=outs, dst=0)
        elif coll == "scatter":
            ins = list(inp[: n * block].split(block)) if rank == 0 and block > 0 else None
            dst = out[:block]
            def run(): dist.scatter(dst, scatter_list=ins, src=0)
        elif coll == "alltoall":
            src, dst = inp[: n * block], out[: n * block]
            def run(): dist.all_to_all_single(dst, src)
        elif coll == "barrier":
            def run(): dist.barrier()
        elif coll == "sendrecv":
            nxt, prv = (rank + 1) % n, (rank + n - 1) % n
            src, dst = inp[:in_count], out[:out_count]
            def run():
                r = dist.irecv(dst, src=prv)
                s = dist.isend(src, dst=nxt)
                s.wait()
                r.wait()
        else:
            raise ValueError(coll)

        for _ in range(a.warmup):
            prepare()
            dist.barrier()
            run()
        wrong = -1
        if a.check:
            prepare(poison=True)
            dist.barrier()
            run()
            wrong = int(self.sum_over_ranks(float(count_wrong(coll, a.op, rank, n, lay, out, a.dtype))))
        seconds, wait_cpu = [], []
        straggle = a.straggle_ms / 1000.0
        straggler = rank == n - 1
        waiters = self.sum_over_ranks(0.0 if straggler else 1.0) if straggle > 0 else 0.0
        for _ in range(a.iters):
            prepare()
            dist.barrier()
            cpu0 = process_cpu_seconds()
            t0 = time.perf_counter()
            if straggle > 0 and straggler:
                time.sleep(straggle)
            run()
            t = time.perf_counter() - t0
            cpu = process_cpu_seconds() - cpu0
            seconds.append(self.max_over_ranks(t))
            if straggle > 0 and waiters > 0:
                wait_cpu.append(self.sum_over_ranks(0.0 if straggler else cpu) / waiters)
        if rank != 0:
            return
        median_us, p99_us = summarize(seconds)
        algbw = total_bytes / (median_us * 1e-6) / 1e9 if median_us > 0 else 0.0
        line = {"impl": "torch", "coll": coll, "np": n, "bytes": total_bytes, "count": count,
                "dtype": a.dtype, "op": a.op if coll in REDUCTIONS else "none",
                "time_us": median_us, "p99_us": p99_us, "algbw_gbs": algbw,
                "busbw_gbs": algbw * busbw_factor(coll, n), "wrong": wrong, "algo": "gloo"}
        if wait_cpu:
            line["wait_cpu_us"] = summarize(wait_cpu)[0]
        print(json.dumps(line), flush=True)


def main():
    a = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.timeout))
    bench = Bench(a)
    for coll in a.coll:
        if coll in UNSUPPORTED:
            if bench.rank == 0:
                print(f"torch: {coll} skipped, {UNSUPPORTED[coll]}", file=sys.stderr, flush=True)
            continue
        for nbytes in ([0] if coll == "barrier" else a.sizes):
            bench.run_size(coll, nbytes)
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # one line naming the rank, then a non-zero exit the driver reports
        print(f"torch_peer rank {os.environ.get('RANK', '?')}: {type(e).__name__}: {e}",
              file=sys.stderr, flush=True)
        sys.exit(1)
