"""The example's training as a PyTorch user writes it for torchrun's elastic restarts: the
Fashion-MNIST ConvNet of build/bin/train_fashion_mnist (bench/torch_ddp_fashion_mnist.py's), SGD
with momentum, batch 100 per rank, torch's DistributedSampler, DDP on gloo; rank 0 saves model,
optimizer, generator and position with torch.save every --checkpoint-every steps (to /dev/shm:
memory, as dtrain's in-memory commits), and every (re)start loads the newest.
bench/fault_recovery.sh runs it under `dtrain chaos` beside dtrain's own recovery
(docs/fault_tolerance.md).

    dtrain chaos --schedule kill:20s --seed 1 -- torchrun --standalone --nproc-per-node 4 \\
        --max-restarts 1000 bench/torch_elastic_fashion_mnist.py --epochs 2

With DTRAIN_SAMPLE_LOG set (dtrain chaos sets it) every rank appends a line per trained sample,
`epoch index step restart` (restart: torchrun's TORCHELASTIC_RESTART_COUNT), before its
gradients leave. Rank 0 prints one `RESULT {json}` line at the end, as train_fashion_mnist does.
"""
import argparse
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from torch_ddp_fashion_mnist import DATA, ConvNet, read_idx


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--checkpoint-every", type=int, default=1)
    p.add_argument("--checkpoint-dir", default="/dev/shm",
                   help="under it, one directory per torchrun job (TORCHELASTIC_RUN_ID)")
    p.add_argument("--backend", default="gloo", help="gloo, or dtrain (import dtrain.torch)")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.backend == "dtrain":
        import dtrain.torch  # noqa: F401  registers the backend
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # torchrun's agent store (--standalone, torch 2.15) keeps the keys of earlier attempts:
    # without a prefix of its own, a restarted group reads the address of the rank that was
    # killed and fails to connect (gloo and dtrain alike). torch 2.0 and earlier prefixed it by
    # attempt.
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group(a.backend, store=dist.PrefixStore(f"/attempt_{restart}", agent),
                            rank=rank, world_size=world)
    images = read_idx(f"{DATA}/train-images-idx3-ubyte.gz").float().div_(255).unsqueeze(1)
    labels = read_idx(f"{DATA}/train-labels-idx1-ubyte.gz").long()
    torch.manual_seed(1)
    net = ConvNet()
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=a.momentum)
    directory = os.path.join(a.checkpoint_dir,
                             "torch-elastic-" + os.environ.get("TORCHELASTIC_RUN_ID", "none"))
    path = os.path.join(directory, "checkpoint.pt")
    epoch, done, step, recent = 0, 0, 0, []
    if os.path.exists(path):  # every rank reads rank 0's: one machine, or a shared directory
        state = torch.load(path, weights_only=False)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        epoch, done, step, recent = state["epoch"], state["batch"], state["step"], state["recent"]
        if rank == 0:
            print(f"restart {restart}: resumed from {path} (epoch {epoch}, step {step})",
                  flush=True)
    model = nn.parallel.DistributedDataParallel(net)
    sampler = torch.utils.data.DistributedSampler(range(len(images)), num_replicas=world,
                                                  rank=rank, shuffle=True, seed=a.seed)
    log_path = os.environ.get("DTRAIN_SAMPLE_LOG")
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if log_path else None
    if rank == 0:
        os.makedirs(directory, exist_ok=True)
    start, trained_here = time.perf_counter(), 0
    while epoch < a.epochs:
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler))
        batches = (len(order) + a.batch_size - 1) // a.batch_size
        for b in range(done, batches):
            idx = order[b * a.batch_size:(b + 1) * a.batch_size]
            opt.zero_grad()
            loss = F.cross_entropy(model(images[idx]), labels[idx])
            if log is not None:  # before this rank's gradients leave (the example's rule)
                os.write(log, "".join(f"{epoch} {i} {step + 1} {restart}\n"
                                      for i in idx.tolist()).encode())
            loss.backward()
            opt.step()
            step += 1
            trained_here += len(idx) * world
            recent = (recent + [loss.item()])[-20:]
            last = b + 1 == batches
            if rank == 0 and (step % a.checkpoint_every == 0 or last):
                state = {"model": net.state_dict(), "optimizer": opt.state_dict(),
                         "rng": torch.get_rng_state(), "epoch": epoch + 1 if last else epoch,
                         "batch": 0 if last else b + 1, "step": step, "recent": recent}
                torch.save(state, path + ".tmp")
                os.replace(path + ".tmp", path)  # whole, or the previous one
        epoch, done = epoch + 1, 0
    seconds = time.perf_counter() - start
    if rank == 0:
        print("RESULT " + json.dumps({"strategy": "torch-ddp-elastic", "backend": a.backend,
                                      "world_size": world, "steps": step,
                                      "images_per_sec": trained_here / max(seconds, 1e-9),
                                      "final_loss": sum(recent) / max(len(recent), 1)}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
