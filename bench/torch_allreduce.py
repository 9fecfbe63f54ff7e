"""dist.all_reduce from Python: torch.distributed on dtrain's backend against torch's gloo backend,
in one run, alternating rounds (docs/performance.md, "PyTorch on dtrain").

    build/bin/dtrain run -n 2 -- python3 bench/torch_allreduce.py --rounds 5

The default group is gloo's and a second group over the same ranks is dtrain's; each round times
both on every size (the order alternates from round to round). A size's time in a round is the
median over its iterations of the slowest rank's time; the table shows each backend's median over
the rounds with the lowest and highest round, and the median (and range) of the rounds' ratios
gloo/dtrain: above 1, dtrain is faster. Float32 sums; every result is checked.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

import dtrain.torch  # noqa: F401  registers the backend (torch < 2.15 has no entry-point hook)

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(s):
    s = s.strip().upper().rstrip("B").rstrip("I")
    return int(s[:-1]) * UNITS[s[-1]] if s[-1] in UNITS else int(s)


def iterations(nbytes):
    if nbytes <= 64 << 10:
        return 200
    if nbytes <= 1 << 20:
        return 50
    if nbytes <= 16 << 20:
        return 10
    return 5


def time_one(group, t, iters, warmup, world):
    # On a GPU a call may return before the reduction is done (gloo's): time until it is.
    sync = torch.cuda.synchronize if t.is_cuda else (lambda: None)
    for _ in range(warmup):
        dist.all_reduce(t, group=group)
    times = []
    dist.barrier(group=group)
    for _ in range(iters):
        t.fill_(1.0)
        sync()
        start = time.perf_counter()
        dist.all_reduce(t, group=group)
        sync()
        times.append(time.perf_counter() - start)
    if not bool((t == world).all()):
        raise SystemExit(f"rank {dist.get_rank()}: wrong all_reduce result on {group}")
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="4K,64K,1M,16M,64M", help="bytes per rank, comma-separated")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", help="write every round's result as a JSON line here (rank 0)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where the tensors are (cuda: every rank on GPU 0)")
    a = p.parse_args()
    torch.set_num_threads(1)
    device = torch.device(a.device)
    if a.device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {"gloo": dist.group.WORLD, "dtrain": dist.new_group(backend="dtrain")}
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    results = {(n, b): [] for n in sizes for b in groups}
    lines = []
    for r in range(a.rounds):
        order = list(groups) if r % 2 == 0 else list(reversed(groups))
        for n in sizes:
            t = torch.ones(n // 4, device=device)
            for b in order:
                times = time_one(groups[b], t, iterations(n), a.warmup, world)
                # The slowest rank's time of each iteration, then the median over iterations.
                per_iter = torch.tensor(times, dtype=torch.float64, device=device)
                dist.all_reduce(per_iter, op=dist.ReduceOp.MAX, group=groups["gloo"])
                us = statistics.median(per_iter.cpu().tolist()) * 1e6
                results[(n, b)].append(us)
                lines.append({"round": r + 1, "bytes": n, "backend": b, "world_size": world,
                              "device": a.device, "median_us": us})
    if rank == 0:
        print(f"# dist.all_reduce f32 sum on {a.device}, torch {torch.__version__}, {world} ranks, "
              f"{a.rounds} rounds: median us of the "
              f"rounds [lowest, highest]; ratio gloo/dtrain, median [range]")
        print(f"{'bytes':>10} {'dtrain us':>26} {'gloo us':>26} {'ratio':>22}")
        for n in sizes:
            d, g = results[(n, "dtrain")], results[(n, "gloo")]
            ratios = [gg / dd for gg, dd in zip(g, d)]
            print(f"{n:>10} {statistics.median(d):>10.1f} [{min(d):6.1f}, {max(d):6.1f}] "
                  f"{statistics.median(g):>10.1f} [{min(g):6.1f}, {max(g):6.1f}] "
                  f"{statistics.median(ratios):>8.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]")
        if a.json:
            with open(a.json, "w") as f:
                for line in lines:
                    f.write(json.dumps(line) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
