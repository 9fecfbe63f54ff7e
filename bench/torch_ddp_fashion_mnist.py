"""PyTorch DDP on the same Fashion-MNIST ConvNet as build/bin/train_fashion_mnist: the reference
that dtrain's data-parallel throughput is compared with (docs/performance.md).

    OMP_NUM_THREADS=1 build/bin/dtrain run -n 2 -- python3 bench/torch_ddp_fashion_mnist.py --max-steps 300
    ... torch_ddp_fashion_mnist.py --backend dtrain     # the same script on dtrain's backend

Uses the environment's torch (gloo backend, or dtrain's with --backend dtrain and
PYTHONPATH=build/python unless the package is installed; RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT
from the launcher) and Debian's dataset-fashion-mnist; prints one `RESULT {json}` line from rank 0, with
the same fields as train_fashion_mnist.
"""
import argparse
import gzip
import json
import struct
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        magic, n = struct.unpack(">II", f.read(8))
        dims = [n, 28, 28] if magic == 2051 else [n]
        if magic == 2051:
            f.read(8)  # rows, columns
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
        return data.view(*dims)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.BatchNorm2d(16), nn.ReLU(),
                                    nn.MaxPool2d(2))
        self.layer2 = nn.Sequential(nn.Conv2d(16, 32, 5, padding=2), nn.BatchNorm2d(32), nn.ReLU(),
                                    nn.MaxPool2d(2))
        self.fc = nn.Linear(7 * 7 * 32, 10)

    def forward(self, x):
        return self.fc(self.layer2(self.layer1(x)).reshape(x.size(0), -1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--max-steps", type=int, default=300)
    p.add_argument("--backend", default="gloo", help="gloo, or dtrain (import dtrain.torch)")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.backend == "dtrain":
        import dtrain.torch  # noqa: F401  registers the backend
    # Under `dtrain run` (as under torchrun) this meets the launcher's store on MASTER_PORT.
    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    images = read_idx(f"{DATA}/train-images-idx3-ubyte.gz").float().div_(255).unsqueeze(1)
    labels = read_idx(f"{DATA}/train-labels-idx1-ubyte.gz").long()
    torch.manual_seed(1)
    model = nn.parallel.DistributedDataParallel(ConvNet())
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    order = torch.randperm(len(images))[rank::world]
    steps = min(a.max_steps, len(order) // a.batch_size)
    losses = []
    start = None
    for step in range(steps):
        if step == 1:
            start = time.perf_counter()  # the first step warms up
        idx = order[step * a.batch_size:(step + 1) * a.batch_size]
        opt.zero_grad()
        loss = F.cross_entropy(model(images[idx]), labels[idx])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    ips = (steps - 1) * a.batch_size * world / seconds
    if rank == 0:
        print("RESULT " + json.dumps({"strategy": "torch-ddp", "backend": a.backend,
                                      "world_size": world, "steps": steps,
                                      "images_per_sec": ips,
                                      "final_loss": sum(losses[-20:]) / len(losses[-20:])}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
