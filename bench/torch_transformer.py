"""torch's data-parallel wrappers on a transformer where communication matters, over backend
"dtrain" against the same over gloo, in one run, alternating rounds (docs/performance.md).

    dtrain run -n 2 -- python3 bench/torch_transformer.py --wrap ddp --rounds 3 --steps 10
    dtrain run -n 2 -- python3 bench/torch_transformer.py --wrap fsdp2 --rounds 3 --steps 10

The model is bench/transformer_lm.py's (33.7M parameters); each rank trains on --tokens tokens
per step (16 by default), so the step is mostly communication: DDP's all-reduce of 135 MB of
gradients, or FSDP2's all-gather of each block's parameters (forward and backward) and
reduce-scatter of its gradients (`fully_shard` per encoder layer and on the whole). Each round
builds the model from the same seed, wraps it on one backend's group (the default group is
gloo's, a second group over the same ranks is dtrain's), and times --steps steps after one
warm-up step; the order of the backends alternates from round to round. Rank 0 prints each
backend's median step time [lowest, highest round], samples/s, the peak of the process's
resident memory during its rounds (the high-water mark, reset as each round starts), the ratio gloo/dtrain, and whether the two backends' losses
agree step by step; --json writes every round.
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
        dist.barrier(group=group)
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
    p.add_argument("--wrap", choices=["ddp", "fsdp2"], default="ddp")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--tokens", type=int, default=16, help="tokens per rank per step")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--json", help="write every round as a JSON line here (rank 0)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {"gloo": dist.group.WORLD, "dtrain": dist.new_group(backend="dtrain")}
    step_s = {b: [] for b in groups}
    peak = {b: [] for b in groups}
    losses = {}
    lines = []
    for r in range(a.rounds):
        for b in (list(groups) if r % 2 == 0 else list(reversed(groups))):
            s, l, m = run_round(a.wrap, groups[b], a.steps, a.tokens, rank)
            step_s[b].append(s)
            peak[b].append(m)
            losses.setdefault(b, l)
            lines.append({"round": r + 1, "backend": b, "wrap": a.wrap, "world_size": world,
                          "median_step_s": s, "peak_rss_bytes": m, "losses": l})
    if rank == 0:
        n_params = parameters(TransformerLM())
        print(f"# {a.wrap}, transformer of {n_params / 1e6:.1f}M parameters, {a.tokens} tokens "
              f"per rank per step, {world} ranks, torch {torch.__version__}, {a.rounds} rounds of "
              f"{a.steps} steps: median step ms [lowest, highest round], samples/s, rank 0's peak "
              f"resident MiB while training (the process's, model and optimizer included)")
        for b in groups:
            v = step_s[b]
            print(f"{b:>7} {statistics.median(v) * 1e3:8.1f} [{min(v) * 1e3:.1f}, "
                  f"{max(v) * 1e3:.1f}]  {world / statistics.median(v):7.2f} samples/s  "
                  f"{statistics.median(peak[b]) / 2**20:7.0f} MiB")
        ratios = [g / d for g, d in zip(step_s["gloo"], step_s["dtrain"])]
        print(f"gloo/dtrain: {statistics.median(ratios):.2f}x [{min(ratios):.2f}, "
              f"{max(ratios):.2f}]")
        same = all(abs(x - y) <= 1e-5 * max(1.0, abs(y))
                   for x, y in zip(losses["dtrain"], losses["gloo"]))
        print(f"losses step by step: {'equal' if same else 'DIFFER'} "
              f"(dtrain {losses['dtrain'][:3]}..., gloo {losses['gloo'][:3]}...)")
        if a.json:
            with open(a.json, "w") as f:
                for line in lines:
                    f.write(json.dumps(line) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
