"""The transformer of bench/transformer_lm.py trained by torch's DDP on backend "dtrain", its
gradients reduced exactly (f32), with int8, int4, bf16 or fp16 on the wire
(dtrain.torch.comm_hooks; bf16-plain and fp16-plain without error feedback), or through torch's
own 16-bit hooks (torch-bf16, torch-fp16: cast down, all-reduce, cast back), for
bench/wire_formats.sh (docs/performance.md, "Fewer bytes on the wire").

    dtrain run -n 2 -- python3 bench/wire_training.py --wire int8 --seed 1

Each rank trains on --batch sequences of --seq tokens a step from a synthetic corpus of --corpus
sequences (bench/transformer_recovery.py's, which the model learns by heart, so the loss falls),
--epochs epochs in the order of torch's DistributedSampler, SGD with momentum; --seed sets the
initial weights and the order. Rank 0 prints each epoch's mean loss, then one line
`RESULT {json}`: the wire, seed, steps, the median step time (after the first step), and
final_loss, the mean loss of the last 20 steps.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import dtrain.torch  # noqa: F401  the backend
from dtrain.torch import comm_hooks

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformer_lm import TransformerLM, parameters  # noqa: E402
from transformer_recovery import batch_of, sequence_losses  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wire", default="exact",
                   choices=["exact", "int8", "int4", "bf16", "fp16", "bf16-plain", "fp16-plain",
                            "torch-bf16", "torch-fp16"])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=2, help="sequences per rank per step")
    p.add_argument("--seq", type=int, default=16, help="tokens per sequence")
    p.add_argument("--corpus", type=int, default=256, help="sequences per epoch")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many (0: no limit)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    dist.init_process_group("dtrain")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(a.seed)
    model = TransformerLM(layers=a.layers)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if a.wire.startswith("torch-"):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, getattr(default_hooks, a.wire[6:] + "_compress_hook"))
    elif a.wire.endswith("-plain"):  # no error feedback
        ddp.register_comm_hook(None, getattr(comm_hooks, a.wire[:4] + "_compress_hook"))
    elif a.wire != "exact":
        ddp.register_comm_hook(comm_hooks.CompressState(),
                               getattr(comm_hooks, a.wire + "_compress_hook"))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    sampler = torch.utils.data.DistributedSampler(range(a.corpus), num_replicas=world, rank=rank,
                                                  shuffle=True, seed=a.seed)
    step, times, recent = 0, [], []
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        order, losses = list(sampler), []
        for b in range(0, len(order), a.batch):
            if a.max_steps and step >= a.max_steps:
                break
            x, y = batch_of(order[b:b + a.batch], a.seq)
            start = time.perf_counter()
            opt.zero_grad()
            loss = sequence_losses(ddp, x, y).mean()
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - start)
            step += 1
            losses.append(loss.item())
        recent = (recent + losses)[-20:]
        if rank == 0 and losses:
            print(f"epoch {epoch}: mean loss {statistics.mean(losses):.4f} ({len(losses)} steps)",
                  flush=True)
    if rank == 0:
        print("RESULT " + json.dumps({
            "wire": a.wire, "seed": a.seed, "world_size": world,
            "parameters": parameters(model), "steps": step,
            "median_step_s": statistics.median(times[1:] or times),
            "final_loss": statistics.mean(recent)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
