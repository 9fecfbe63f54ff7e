"""Checkpoints while training: torch's distributed checkpoint (`dcp.async_save`) against dtrain's
CheckpointManager (asynchronous), on backend "dtrain", in one run, alternating rounds
(docs/performance.md).

    dtrain run -n 2 -- python3 bench/torch_checkpoint.py --rounds 3 --dir /tmp/ckpt-bench

The model is bench/transformer_lm.py's (33.7M parameters) under DDP with Adam: 135 MB of weights
and 270 MB of optimizer state. Each round trains a few steps, saves with one of the two, trains
on while the write is in flight, and waits until it is durable (files written and synced). Rank 0
prints, per saver, the median [range] of: the save call (the stall the training loop sees), the
first step after it (a step that runs beside the write), a step without a checkpoint, and the
time from the call until the checkpoint is durable. DCP's writes run on a group of their own
(torch's advice for async_save); dtrain's writer is rank 0, which copies the state and writes it
on a thread.
"""
import argparse
import os
import shutil
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import dtrain.torch  # noqa: F401  registers the backend

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformer_lm import TransformerLM, tokens  # noqa: E402


def step(model, opt, i, rank):
    x, y = tokens(i, rank, 1, 16)
    start = time.perf_counter()
    opt.zero_grad()
    F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    opt.step()
    return time.perf_counter() - start


def dcp_round(model, opt, folder, group, rank):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    msd, osd = get_state_dict(model, opt)
    start = time.perf_counter()
    pending = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=folder,
                             process_group=group)
    call = time.perf_counter() - start
    beside = step(model, opt, 100, rank)
    pending.result()
    dist.barrier(group=group)
    return call, beside, time.perf_counter() - start


def dtrain_round(model, opt, folder, rank):
    manager = dtrain.torch.CheckpointManager(folder, keep=1, async_write=True)
    start = time.perf_counter()
    manager.save(model.module, opt, step=1)
    call = time.perf_counter() - start
    beside = step(model, opt, 100, rank)
    manager.wait()
    dist.barrier()
    return call, beside, time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", default="/tmp/dtrain-checkpoint-bench")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    dist.init_process_group("dtrain")
    rank = dist.get_rank()
    writer_group = dist.new_group(backend="dtrain")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(TransformerLM())
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    plain = [step(model, opt, i, rank) for i in range(4)][1:]  # the first warms up
    results = {"dcp": [], "dtrain": []}
    for r in range(a.rounds):
        for saver in (["dcp", "dtrain"] if r % 2 == 0 else ["dtrain", "dcp"]):
            folder = os.path.join(a.dir, f"{saver}-{r}")
            if rank == 0:
                shutil.rmtree(folder, ignore_errors=True)
            dist.barrier()
            if saver == "dcp":
                results[saver].append(dcp_round(model, opt, folder, writer_group, rank))
            else:
                results[saver].append(dtrain_round(model, opt, folder, rank))
            plain.append(step(model, opt, r, rank))
    if rank == 0:
        def show(v):
            return f"{statistics.median(v) * 1e3:8.1f} [{min(v) * 1e3:.1f}, {max(v) * 1e3:.1f}]"
        print(f"# DDP transformer, Adam, {dist.get_world_size()} ranks, torch {torch.__version__}, "
              f"{a.rounds} rounds, ms: median [lowest, highest]")
        print(f"{'':>7} {'save call':>22} {'step beside the write':>24} {'until durable':>24}")
        for saver, rows in results.items():
            calls, besides, durables = zip(*rows)
            print(f"{saver:>7} {show(calls):>22} {show(besides):>24} {show(durables):>24}")
        print(f"a step without a checkpoint: {show(plain)}")
        shutil.rmtree(a.dir, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
