"""Data-parallel training of a transformer where communication matters, by torch's wrappers over
backend "dtrain" and over gloo, in one run, alternating rounds (docs/performance.md).

    dtrain run -n 2 -- python3 bench/torch_transformer.py --runs ddp:gloo,ddp:dtrain
    dtrain run -n 2 -- python3 bench/torch_transformer.py --runs fsdp2:gloo,fsdp2:dtrain

Each run is WRAPPER:BACKEND: `ddp` (DistributedDataParallel) or `fsdp2` (`fully_shard` per encoder
layer and on the whole) on the default group (gloo) or a second group over the same ranks
(dtrain). The model is bench/transformer_lm.py's (33.7M parameters); each rank
trains on --tokens tokens per step (16 by default), so the step is mostly communication: DDP's
all-reduce of 135 MB of gradients, FSDP2's all-gather of each layer's parameters
(forward and backward) and reduce-scatter of its gradients. Each round builds the model from the
same seed and times --steps steps after one warm-up step, every run in turn, the order reversed
from round to round. Rank 0 prints each run's median step time [lowest, highest round],
samples/s, the peak of the process's resident memory during its rounds (the high-water mark,
reset as each round starts), the first run's time over each one's (median of the rounds'
ratios), and whether the losses agree with the first run's step by step; --json writes every
round.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import dtrain.torch  # noqa: F401  registers the backend (torch < 2.15 has no entry-point hook)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformer_lm import TransformerLM, parameters, tokens  # noqa: E402


def wrap(model, how, group):
    if how == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in model.blocks.layers:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def reset_peak_memory():
    """Starts the process's resident high-water mark (VmHWM) afresh (Linux 4.0 and later)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_memory_bytes():
    with open("/proc/self/status") as f:
        kib = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    return int(kib) * 1024


def run_round(how, group, steps, seq, rank):
    torch.manual_seed(0)
    model = wrap(TransformerLM(), how, group)
    reset_peak_memory()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    times, losses = [], []
    for step in range(steps + 1):  # step 0 warms up (allocations, DDP's bucket rebuild)
        x, y = tokens(step, rank, 1, seq)
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        elapsed = time.perf_counter() - start
        if step > 0:
            times.append(elapsed)
            losses.append(loss.item())
    return statistics.median(times), losses, peak_memory_bytes()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default="ddp:gloo,ddp:dtrain",
                   help="comma-separated WRAPPER:BACKEND (ddp or fsdp2 on gloo or dtrain)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--tokens", type=int, default=16, help="tokens per rank per step")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--json", help="write every round as a JSON line here (rank 0)")
    a = p.parse_args()
    runs = a.runs.split(",")
    for run in runs:
        if run.split(":") not in ([w, b] for w in ("ddp", "fsdp2") for b in ("gloo", "dtrain")):
            p.error(f"--runs: {run!r} is not ddp:gloo, ddp:dtrain, fsdp2:gloo or fsdp2:dtrain")
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {"gloo": dist.group.WORLD, "dtrain": dist.new_group(backend="dtrain")}
    step_s = {r: [] for r in runs}
    peak = {r: [] for r in runs}
    losses = {}
    lines = []
    for i in range(a.rounds):
        for run in (runs if i % 2 == 0 else list(reversed(runs))):
            how, backend = run.split(":")
            s, l, m = run_round(how, groups[backend], a.steps, a.tokens, rank)
            step_s[run].append(s)
            peak[run].append(m)
            losses.setdefault(run, l)
            lines.append({"round": i + 1, "run": run, "world_size": world, "median_step_s": s,
                          "peak_rss_bytes": m, "losses": l})
    if rank == 0:
        n_params = parameters(TransformerLM())
        print(f"# transformer of {n_params / 1e6:.1f}M parameters, {a.tokens} tokens per rank per "
              f"step, {world} ranks, torch {torch.__version__}, {a.rounds} rounds of {a.steps} "
              f"steps: median step ms [lowest, highest round], samples/s, rank 0's peak resident "
              f"MiB while training (the process's, model and optimizer included), {runs[0]} time "
              f"over the run's [range]")
        first = step_s[runs[0]]
        for run in runs:
            v = step_s[run]
            ratios = [f / x for f, x in zip(first, v)]
            same = all(abs(x - y) <= 1e-4 * max(1.0, abs(y))
                       for x, y in zip(losses[run], losses[runs[0]]))
            print(f"{run:>13} {statistics.median(v) * 1e3:8.1f} [{min(v) * 1e3:.1f}, "
                  f"{max(v) * 1e3:.1f}]  {world / statistics.median(v):6.2f} samples/s  "
                  f"{statistics.median(peak[run]) / 2**20:6.0f} MiB  "
                  f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]  "
                  f"losses {'equal' if same else 'DIFFER'}")
        print(f"losses of {runs[0]}: {losses[runs[0]][:3]}...")
        if a.json:
            with open(a.json, "w") as f:
                for line in lines:
                    f.write(json.dumps(line) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
