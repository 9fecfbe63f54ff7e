"""Training with checkpoints from Python, killed and resumed: `python3 resume_workers.py train
DIR OUT KILL_AT` (harness variables). A small model with BatchNorm and dropout (so the generator
matters) trains two epochs on synthetic data with dtrain's DistributedSampler and an optimizer
(Adam or SGD with momentum; adam-background: Adam with its state and the parameters copied by
the writing thread, the optimizer step waiting for the copy), checkpointing every 3 steps; KILL_AT > 0 makes every rank exit hard
after that step (a write may be in flight), KILL_AT < 0 after step -KILL_AT once the writes
finished. At the end rank 0 saves the weights to OUT and every
rank logs the samples it trained to OUT.samples.<rank>."""
import os
import sys

import torch
import torch.distributed as dist

import dtrain.torch

BATCH = 5
EPOCHS = 2


def data():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(60, 6, generator=g)
    y = (x.sum(1, keepdim=True) > 0).float()
    return x, y


def model_and_optimizer(kind):
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    if kind.startswith("adam"):
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, opt


def train(ckpt_dir, out, kill_at, kind="adam"):
    kill_at = int(kill_at)
    torch.set_num_threads(1)
    dist.init_process_group("dtrain")
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = data()
    model, opt = model_and_optimizer(kind)
    ckpt = dtrain.torch.CheckpointManager(ckpt_dir, keep=2,
                                          copy_in_background=kind == "adam-background")
    sampler = dtrain.torch.DistributedSampler(len(x), seed=3)
    loaded = ckpt.load_latest(model, opt)
    step, epoch, consumed = 0, 0, 0
    if loaded is not None:
        step, epoch, consumed = loaded.step, loaded.epoch, loaded.epoch_consumed
        print(f"rank {rank}: resumed from {loaded.path} (step {step}, epoch {epoch}, "
              f"{consumed} samples of it done, saved at world size {loaded.world_size})",
              flush=True)
    log = open(f"{out}.samples.{rank}", "a")
    while epoch < EPOCHS:
        sampler.set_epoch(epoch, consumed)
        indices = list(sampler)
        for k in range(0, len(indices), BATCH):
            batch = indices[k:k + BATCH]
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x[batch]), y[batch])
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
            ckpt.wait_copied()  # the last save's copy, before the step changes the tensors
            opt.step()
            step += 1
            log.write(f"{epoch} {' '.join(map(str, batch))}\n")
            log.flush()
            trained = min(k + BATCH, len(indices))
            if step % 3 == 0:
                ckpt.save(model, opt, step=step, epoch=epoch,
                          epoch_consumed=sampler.consumed(trained), epoch_size=len(x),
                          values={"loss": loss.item()})
            if step == abs(kill_at):
                if kill_at < 0:
                    ckpt.wait()  # the checkpoints saved so far are complete
                os._exit(17)  # hard; with KILL_AT > 0, the write possibly in flight
        epoch, consumed = epoch + 1, 0
    ckpt.wait()
    if rank == 0:
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, out)
    dist.destroy_process_group()
    print(f"rank {rank}: trained to step {step}", flush=True)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
