"""Training steps of transformer blocks cut by torch's DTensor tensor parallelism
(``parallelize_module``), on backend "dtrain" or gloo: the Python side of bench/tensor_parallel.sh,
which runs it beside bench/tensor_parallel_bench.cc (the same blocks on dtrain's C++
tensor-parallel layers), alternating (docs/performance.md, "Tensor parallelism").

    dtrain run -n 2 -- python3 bench/torch_tensor_parallel.py --backend dtrain --blocks 4

A block is tensor_parallel_bench's: LayerNorm, causal self-attention (q, k, v ColwiseParallel,
so each rank holds heads / ranks heads; the output projection RowwiseParallel), LayerNorm, MLP
(hidden -> ffn ColwiseParallel, GELU, ffn -> hidden RowwiseParallel), each with its residual;
the same arithmetic as the C++ layers (attention written out, not torch's fused kernel). Random
input, mean squared error against a random target, SGD; rank 0 prints one RESULT line with the
median step time of --steps timed steps after --warmup.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

import dtrain.torch  # noqa: F401  registers the backend


class Block(nn.Module):
    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.out = nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def attention(self, x, local_heads):
        b, s, _ = x.shape

        def split(t):  # this rank's heads: [b, local_heads, s, head_dim]
            return t.reshape(b, s, local_heads, -1).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        future = torch.ones(s, s, dtype=torch.bool).triu(1)
        context = scores.masked_fill(future, float("-inf")).softmax(-1) @ v
        return self.out(context.transpose(1, 2).reshape(b, s, -1))

    def forward(self, x):
        local_heads = self.heads // self.ranks
        h = x + self.attention(self.norm1(x), local_heads)
        return h + self.fc2(F.gelu(self.fc1(self.norm2(h))))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="dtrain", choices=["dtrain", "gloo"])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=2048)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--batch", type=int, default=4, help="sequences per step")
    p.add_argument("--sequence", type=int, default=64, help="tokens per sequence")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(a.backend)
    ranks = dist.get_world_size()
    mesh = init_device_mesh("cpu", (ranks,))
    torch.manual_seed(0)
    model = nn.Sequential(*(Block(a.hidden, a.heads, a.ffn) for _ in range(a.blocks)))
    plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
            "out": RowwiseParallel(), "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    for block in model:
        block.ranks = ranks
        parallelize_module(block, mesh, plan)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(a.batch, a.sequence, a.hidden, generator=g)
    y = torch.randn(a.batch, a.sequence, a.hidden, generator=g)
    times = []
    for step in range(a.warmup + a.steps):
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        if step >= a.warmup:
            times.append((time.perf_counter() - start) * 1e3)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({
            "layers": f"dtensor:{a.backend}", "ranks": ranks, "blocks": a.blocks,
            "hidden": a.hidden, "heads": a.heads, "ffn": a.ffn, "batch": a.batch,
            "sequence": a.sequence, "step_ms": statistics.median(times)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
