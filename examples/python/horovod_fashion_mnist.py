"""A Horovod training script, unchanged but for its import line, on dtrain.

    dtrain run -n 2 -- python3 examples/python/horovod_fashion_mnist.py --epochs 1
    mpirun -np 2 -x MASTER_PORT=29500 python3 examples/python/horovod_fashion_mnist.py
    srun -n 2 python3 examples/python/horovod_fashion_mnist.py

It follows Horovod's own examples/pytorch/pytorch_mnist.py (init, a DistributedSampler over
hvd.size() replicas, broadcast of the parameters and optimizer state from rank 0,
hvd.DistributedOptimizer, metrics averaged with hvd.allreduce), on Debian's Fashion-MNIST
(dataset-fashion-mnist) with the ConvNet and hyperparameters of the C++ example
examples/train_fashion_mnist.cc, so that the two can be compared (bench/python_vs_cpp.sh).
"""
import argparse
import gzip
import json
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data

import dtrain.torch as hvd  # was: import horovod.torch as hvd

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path, images):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if images:
        count, rows, cols = (int.from_bytes(raw[i:i + 4], "big") for i in (4, 8, 12))
        pixels = torch.frombuffer(bytearray(raw[16:]), dtype=torch.uint8)
        return pixels.reshape(count, 1, rows, cols).float().div_(255.0)
    return torch.frombuffer(bytearray(raw[8:]), dtype=torch.uint8).long()


def dataset(split, limit):
    stem = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(DATA, f"{stem}-images-idx3-ubyte.gz"), True)
    y = read_idx(os.path.join(DATA, f"{stem}-labels-idx1-ubyte.gz"), False)
    if limit:
        x, y = x[:limit], y[:limit]
    return torch.utils.data.TensorDataset(x, y)


class ConvNet(nn.Module):
    """The PyTorch tutorial's ConvNet, as in examples/train_fashion_mnist.cc."""

    def __init__(self):
        super().__init__()
        self.layer1 = nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.BatchNorm2d(16), nn.ReLU(),
                                    nn.MaxPool2d(2))
        self.layer2 = nn.Sequential(nn.Conv2d(16, 32, 5, padding=2), nn.BatchNorm2d(32),
                                    nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(7 * 7 * 32, 10)

    def forward(self, x):
        x = self.layer2(self.layer1(x))
        return self.fc(x.reshape(x.size(0), -1))


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(value), name=name).item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=100, help="per rank")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--fp16-allreduce", action="store_true")
    parser.add_argument("--limit", type=int, default=0, help="use the first N training images")
    parser.add_argument("--max-steps", type=int, default=0, help="stop after N steps (0: no limit)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads per rank (0: the cores divided by the local ranks)")
    parser.add_argument("--log-every", type=int, default=100, help="steps between progress lines")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // hvd.local_size()))

    train = dataset("train", args.limit)
    test = dataset("test", 0)
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train, num_replicas=hvd.size(), rank=hvd.rank(), seed=args.seed)
    # Whole batches indexed at once (TensorDataset takes a list of indices): no per-image collate.
    train_loader = torch.utils.data.DataLoader(
        train, batch_size=None,
        sampler=torch.utils.data.BatchSampler(train_sampler, args.batch_size, drop_last=False))
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    test_loader = torch.utils.data.DataLoader(test, batch_size=1000, sampler=test_sampler)

    model = ConvNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average)
    if hvd.rank() == 0:
        print(f"horovod_fashion_mnist: {hvd.size()} rank(s), batch {args.batch_size} per rank, "
              f"{torch.get_num_threads()} thread(s), {len(train)} training images", flush=True)

    steps, timed_images, timed_from, losses = 0, 0, None, []
    for epoch in range(args.epochs):
        model.train()
        train_sampler.set_epoch(epoch)
        for step, (data, target) in enumerate(train_loader, 1):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
            steps += 1
            losses.append(loss.item())
            if timed_from is None:
                timed_from = time.perf_counter()  # the first step warms up
            else:
                timed_images += data.size(0) * hvd.size()
            if hvd.rank() == 0 and (step % args.log_every == 0 or step == len(train_loader)):
                rate = timed_images / max(time.perf_counter() - timed_from, 1e-9)
                print(f"epoch {epoch} step {step}/{len(train_loader)} loss {loss.item():.4f} "
                      f"images/s {rate:.0f}", flush=True)
            if steps == args.max_steps:
                break
        if steps == args.max_steps:
            break
    images_per_sec = timed_images / max(time.perf_counter() - timed_from, 1e-9)

    model.eval()
    correct, seen, loss_sum = 0, 0, 0.0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            loss_sum += F.cross_entropy(output, target, reduction="sum").item()
            correct += (output.argmax(1) == target).sum().item()
            seen += target.numel()
    accuracy = metric_average(correct / seen, "avg_accuracy")
    test_loss = metric_average(loss_sum / seen, "avg_loss")
    if hvd.rank() == 0:
        print(f"test loss {test_loss:.4f} test accuracy {accuracy:.4f}", flush=True)
        print("RESULT " + json.dumps({"strategy": "horovod-python", "world_size": hvd.size(),
                                      "steps": steps, "images_per_sec": images_per_sec,
                                      "final_loss": sum(losses[-20:]) / len(losses[-20:]),
                                      "test_accuracy": accuracy}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
