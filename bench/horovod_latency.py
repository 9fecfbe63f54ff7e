"""Microseconds per blocking call of Horovod's API on dtrain (allreduce, allgather, broadcast of
4 floats): the median of 5 timings of 2000 calls after 200 warm-up calls, printed by rank 0.

    dtrain run -n 2 -- /opt/dtrain/venv/bin/python bench/horovod_latency.py

Run it alternately with two builds' packages on PYTHONPATH to compare them (docs/performance.md,
"Horovod's API: what agreeing on each call costs").
"""
import statistics
import time

import torch

import dtrain.torch as hvd


def per_call(call, calls=2000):
    for _ in range(200):
        call()
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    hvd.init()
    x = torch.ones(4)
    results = {}
    for name, call in [("allreduce", lambda: hvd.allreduce(x, op=hvd.Sum)),
                       ("allgather", lambda: hvd.allgather(x)),
                       ("broadcast", lambda: hvd.broadcast_(x, 0))]:
        results[name] = statistics.median(per_call(call) for _ in range(5))
    if hvd.rank() == 0:
        print("RESULT " + " ".join(f"{k}={v:.1f}us" for k, v in results.items()), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
