"""hvd.broadcast_optimizer_state against the whole state pickled through broadcast_object, as it
was sent before (docs/performance.md): the optimizer state of bench/transformer_recovery.py's
52.5M-parameter transformer (SGD momentum, 210 MB), alternating rounds.

    dtrain run -n 3 -- python3 bench/optimizer_broadcast.py [--rounds 4]

Rank 0 prints each way's median seconds [lowest, highest round].
"""
import argparse
import os
import statistics
import sys
import time

import torch

import dtrain.torch as hvd
from dtrain.torch.functions import broadcast_object

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformer_lm import TransformerLM  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--layers", type=int, default=14)
    a = p.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(1)
    model = TransformerLM(layers=a.layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for param in model.parameters():
        param.grad = torch.randn_like(param)
    opt.step()  # the momentum buffers exist
    times = {"pickled": [], "tensors": []}
    for r in range(a.rounds):
        for way in ("pickled", "tensors") if r % 2 == 0 else ("tensors", "pickled"):
            hvd.allreduce(torch.zeros(1), name=f"start.{r}.{way}")  # start together
            start = time.perf_counter()
            if way == "pickled":
                state = broadcast_object(opt.state_dict(), 0)
                if hvd.rank() != 0:
                    opt.load_state_dict(state)
            else:
                hvd.broadcast_optimizer_state(opt, root_rank=0)
            times[way].append(time.perf_counter() - start)
    if hvd.rank() == 0:
        print(", ".join(f"{way} {statistics.median(t):.3f} s [{min(t):.3f}-{max(t):.3f}]"
                        for way, t in times.items()), flush=True)


if __name__ == "__main__":
    main()
