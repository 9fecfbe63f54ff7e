"""A deep MLP on Fashion-MNIST cut into pipeline stages: torch.distributed.pipelining on dtrain.

    dtrain run -n 2 -- python3 examples/python/pipeline_fashion_mnist.py --stages 2
    dtrain run -n 4 -- python3 examples/python/pipeline_fashion_mnist.py --stages 2 --schedule GPipe

The ranks are stages x replicas (a DeviceMesh of ("pp", "dp")), on backend "dtrain". The model is
the C++ example's (examples/train_pipeline.cc): Flatten, then --layers Linear layers of --hidden
units with ReLU between them, He-initialised, cut into stages of about equal parameter counts
(dtrain.pipeline.balance_by_parameters). Each replica trains on its own share of every epoch
(torch's DistributedSampler); its batch is cut into --microbatches micro-batches that torch's
--schedule runs through the stages; each stage's gradients are averaged over its replicas.
World rank 0 prints the test accuracy and last one machine-readable line:
    RESULT {"stages": 2, "replicas": 1, "schedule": "1F1B", "steps": ..., "final_loss": ...,
            "test_accuracy": ..., "images_per_sec": ...}
"""
import argparse
import gzip
import json
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.pipelining as pp
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data
from torch.distributed.device_mesh import init_device_mesh

import dtrain.pipeline
import dtrain.torch  # registers backend "dtrain" (an installed dtrain needs no import)

DATA = "/usr/share/datasets/fashion-mnist"
SCHEDULES = ["GPipe", "1F1B"]  # torch's schedules of one stage per rank


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
    parser.add_argument("--schedule", default="1F1B", choices=SCHEDULES)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64, help="images per replica per step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--train-samples", type=int, default=0, help="0 = all 60,000")
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("dtrain")
    world, rank = dist.get_world_size(), dist.get_rank()
    stages = args.stages or world
    if world % stages:
        raise SystemExit(f"pipeline_fashion_mnist: {world} ranks cannot make {stages} stages")
    replicas = world // stages
    mesh = init_device_mesh("cpu", (stages, replicas), mesh_dim_names=("pp", "dp"))
    stage_index, replica = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    torch.manual_seed(0)  # the same model on every rank; each keeps its stage
    model = make_model(args.layers, args.hidden)
    cuts = dtrain.pipeline.balance_by_parameters(model, stages)
    module = model[cuts[stage_index]:cuts[stage_index + 1]]
    stage = pp.PipelineStage(module, stage_index, stages, torch.device("cpu"),
                             group=mesh["pp"].get_group())
    schedule = getattr(pp, f"Schedule{args.schedule}")(
        stage, n_microbatches=args.microbatches, loss_fn=F.cross_entropy)
    first, last = stage_index == 0, stage_index == stages - 1
    opt = torch.optim.SGD(module.parameters(), lr=args.lr, momentum=0.9)

    x, y = dataset("train", args.train_samples)
    test_x, test_y = dataset("test", 0)
    sampler = torch.utils.data.distributed.DistributedSampler(
        torch.utils.data.TensorDataset(x, y), num_replicas=replicas, rank=replica, shuffle=True,
        seed=0)
    steps, images, losses = 0, 0, []
    started = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler))
        for i in range(0, len(order), args.batch_size):
            idx = order[i:i + args.batch_size]
            if len(idx) < args.batch_size:  # torch's schedules need one micro-batch shape
                break
            opt.zero_grad()
            mb_losses = []
            schedule.step(x[idx] if first else None, target=y[idx] if last else None,
                          losses=mb_losses if last else None)
            if replicas > 1:  # the stage's gradients averaged over its replicas
                for p in module.parameters():
                    dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=mesh["dp"].get_group())
            opt.step()
            steps += 1
            images += len(idx) * replicas
            if last:
                losses.append(float(torch.stack(mb_losses).detach().mean()))
    seconds = time.perf_counter() - started

    # Test accuracy on the whole model: each stage's first replica sends its layers to every
    # rank, and each rank scores its share of the test set.
    for k in range(stages):
        owner = int(mesh.mesh[k, 0])
        for p in model[cuts[k]:cuts[k + 1]].parameters():
            dist.broadcast(p.data, src=owner)
    with torch.no_grad():
        share = torch.arange(rank, len(test_y), world)
        correct, seen = int((model(test_x[share]).argmax(1) == test_y[share]).sum()), len(share)
    totals = torch.tensor([correct, seen, sum(losses[-20:]) / max(1, len(losses[-20:]))
                           if last and replica == 0 else 0.0], dtype=torch.float64)
    dist.all_reduce(totals)
    if rank == 0:
        accuracy = float(totals[0] / max(1.0, float(totals[1])))
        print(f"test accuracy {accuracy:.4f}, {seconds:.1f} s, {images / seconds:.0f} images/s")
        print("RESULT " + json.dumps({
            "stages": stages, "replicas": replicas, "schedule": args.schedule, "steps": steps,
            "final_loss": float(totals[2]), "test_accuracy": accuracy,
            "images_per_sec": images / seconds}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
