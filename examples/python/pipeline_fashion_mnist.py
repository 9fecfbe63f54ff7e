"""A deep MLP on Fashion-MNIST cut into pipeline stages with dtrain.pipeline (torch modules).

    dtrain run -n 2 -- python3 examples/python/pipeline_fashion_mnist.py --stages 2
    dtrain run -n 4 -- python3 examples/python/pipeline_fashion_mnist.py --stages 2 --schedule zb-h1

The ranks are stages x replicas (dtrain.ParallelLayout). The model is the C++ example's
(examples/train_pipeline.cc): Flatten, then --layers Linear layers of --hidden units with ReLU
between them, He-initialised, cut into stages of about equal parameter counts. Each replica
trains on its own share of every epoch (torch's DistributedSampler); its batch is cut into
--microbatches micro-batches that the --schedule runs through the stages. World rank 0 prints
the test accuracy and last one machine-readable line:
    RESULT {"stages": 2, "replicas": 1, "schedule": "1f1b", "steps": ..., "final_loss": ...,
            "test_accuracy": ..., "images_per_sec": ...}
"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data

import dtrain
import dtrain.pipeline

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
    return x, y


def make_model(layers, hidden):
    modules = [nn.Flatten()]
    width = 28 * 28
    for i in range(layers):
        out = 10 if i + 1 == layers else hidden
        linear = nn.Linear(width, out)
        nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")
        nn.init.zeros_(linear.bias)
        modules.append(linear)
        if i + 1 < layers:
            modules.append(nn.ReLU())
        width = out
    return nn.Sequential(*modules)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=0, help="pipeline stages (0 = every rank)")
    parser.add_argument("--schedule", default="1f1b",
                        choices=[name for name, _, _ in dtrain.pipeline.schedules()])
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64, help="images per replica per step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--train-samples", type=int, default=0, help="0 = all 60,000")
    args = parser.parse_args()

    torch.set_num_threads(1)
    world = dtrain.init()
    stages = args.stages or world.size
    layout = dtrain.ParallelLayout(world, pipeline_stages=stages)
    torch.manual_seed(0)  # the same model on every rank; each keeps its stage
    model = make_model(args.layers, args.hidden)
    cuts = dtrain.pipeline.balance_by_parameters(model, stages)
    stage = model[cuts[layout.stage]:cuts[layout.stage + 1]]
    pipe = dtrain.pipeline.Pipeline([stage], layout.pipeline_group, schedule=args.schedule,
                                    microbatches=args.microbatches, data_group=layout.data_group)
    opt = torch.optim.SGD(pipe.parameters(), lr=args.lr, momentum=0.9)

    x, y = dataset("train", args.train_samples)
    test_x, test_y = dataset("test", 0)
    sampler = torch.utils.data.distributed.DistributedSampler(
        torch.utils.data.TensorDataset(x, y), num_replicas=layout.replicas,
        rank=layout.replica, shuffle=True, seed=0)
    steps, images, losses = 0, 0, []
    started = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler))
        for i in range(0, len(order), args.batch_size):
            idx = order[i:i + args.batch_size]
            if len(idx) < args.microbatches:
                break
            opt.zero_grad()
            loss = pipe.step(x[idx], y[idx], F.cross_entropy)
            opt.step()
            steps += 1
            images += len(idx) * layout.replicas
            if loss is not None:
                losses.append(loss.item())
    seconds = time.perf_counter() - started

    # Test accuracy: each replica scores its share through its pipeline; sums over the job.
    correct = seen = 0
    share = torch.arange(layout.replica, len(test_y), layout.replicas)
    for i in range(0, len(share), 1000):
        idx = share[i:i + 1000]
        out = pipe.forward(test_x[idx])
        if out is not None:
            correct += int((out.argmax(1) == test_y[idx]).sum())
            seen += len(idx)
    last = pipe.holds_last_stage() and layout.replica == 0
    totals = np.array([correct, seen, np.mean(losses[-20:]) if last and losses else 0.0],
                      np.float64)
    world.allreduce(totals)
    if world.rank == 0:
        accuracy = totals[0] / max(1.0, totals[1])
        print(f"test accuracy {accuracy:.4f}, {seconds:.1f} s, {images / seconds:.0f} images/s")
        print("RESULT " + json.dumps({
            "stages": stages, "replicas": layout.replicas, "schedule": args.schedule,
            "steps": steps, "final_loss": float(totals[2]), "test_accuracy": float(accuracy),
            "images_per_sec": images / seconds}), flush=True)
    world.barrier()


if __name__ == "__main__":
    try:
        main()
    except dtrain.Error as e:  # the full text: rank, stage, step, action, peer
        raise SystemExit(f"pipeline_fashion_mnist: {e}")
