"""Backend "dtrain" on a device: `dtrain run -n N -- python device_workers.py NAME DEVICE`.

NAME is `collectives` (every collective on tensors of DEVICE against values computed locally),
`ddp` (DistributedDataParallel on DEVICE: the same losses on every rank, and the weights of one
process trained on the whole batch), `fsdp2` (torch's fully_shard per block with
reshard_after_forward both ways: losses and gathered weights against one process) or `horovod`
(Horovod's API, `import dtrain.torch as hvd`: its collectives, and its DistributedOptimizer
with momentum against one process). DEVICE is cpu or cuda (several ranks share one GPU: dtrain
stages CUDA tensors through host memory).
Each rank prints "rank R: NAME on DEVICE checked" and exits 0; any mismatch raises.
scripts/gpu_check.sh runs these on a GPU; tests/python/test_backend.py runs them on CPU.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import dtrain.torch  # noqa: F401  registers "dtrain" (torch < 2.15 has no entry-point hook)


def init(device):
    dist.init_process_group("dtrain")
    rank, world = dist.get_rank(), dist.get_world_size()
    if device == "cuda":
        torch.cuda.set_device(0)  # every rank on the one GPU
    return rank, world, torch.device(device)


def check(got, want, what, tol=1e-5):
    if not torch.allclose(got.double().cpu(), want.double().cpu(), rtol=tol, atol=tol):
        raise AssertionError(f"rank {dist.get_rank()}: {what}: got {got.flatten()[:8].tolist()}, "
                             f"want {want.flatten()[:8].tolist()}")


def collectives(device):
    rank, world, dev = init(device)
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for n in (7, 1 << 16):
            v = lambda r: (torch.arange(n, device=dev) % 5 + r + 1).to(dtype)  # noqa: E731
            t = v(rank)
            dist.all_reduce(t)
            check(t, sum(v(r).double() for r in range(world)), f"all_reduce {dtype} x{n}", 1e-2)
            t = v(rank)
            dist.broadcast(t, 0)
            check(t, v(0), f"broadcast {dtype} x{n}")
            out = torch.empty(n * world, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, v(rank))
            check(out, torch.cat([v(r) for r in range(world)]), f"all_gather {dtype} x{n}")
            out = torch.empty(n, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(out, torch.cat([v(rank)] * world))
            check(out, sum(v(r).double() for r in range(world)), f"reduce_scatter {dtype}", 1e-2)
    work = dist.all_reduce(torch.ones(5, device=dev), async_op=True)
    check(work.get_future().wait()[0], torch.full((5,), float(world)), "future of all_reduce")
    print(f"rank {rank}: collectives on {device} checked", flush=True)


def _model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 4))


def _batch(step, world, device):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(4 * world, 16, generator=g)
    y = torch.randint(0, 4, (4 * world,), generator=g)
    return x.to(device), y.to(device)


def _reference(device, world, steps, momentum=0.0):
    """One process on the whole batch: the losses and weights the distributed runs must reach."""
    model = _model(0).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    losses = []
    for step in range(steps):
        x, y = _batch(step, world, device)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def _train_like_one_process(model, rank, world, dev, steps, what, opt=None, mean_of=None):
    """Trains `model` (wrapped, or stepped by `opt`) on this rank's share of each batch; the mean
    loss over the ranks (`mean_of`, else torch's all_reduce) of every step must be the one
    process's. Returns that process's model, to compare the weights with."""
    momentum = opt.param_groups[0]["momentum"] if opt is not None else 0.0
    want_losses, ref = _reference(dev, world, steps, momentum)
    if opt is None:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if mean_of is None:
        def mean_of(t):
            dist.all_reduce(t)
            return t / world
    for step in range(steps):
        x, y = _batch(step, world, dev)
        opt.zero_grad()
        loss = F.cross_entropy(model(x[rank::world]), y[rank::world])
        loss.backward()
        opt.step()
        mean = mean_of(loss.detach().clone())
        check(mean, torch.tensor(want_losses[step]), f"{what} loss of step {step}", 1e-4)
    return ref


def ddp(device):
    rank, world, dev = init(device)
    model = nn.parallel.DistributedDataParallel(_model(0).to(dev),
                                                device_ids=[0] if device == "cuda" else None)
    ref = _train_like_one_process(model, rank, world, dev, 5, "ddp")
    for (name, p), q in zip(model.module.named_parameters(), ref.parameters()):
        check(p.detach(), q.detach(), f"ddp weight {name}", 1e-4)
    print(f"rank {rank}: ddp on {device} checked", flush=True)


def fsdp2(device):
    from torch.distributed.fsdp import fully_shard
    rank, world, dev = init(device)
    for reshard in (True, False):
        model = _model(0).to(dev)
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
        ref = _train_like_one_process(model, rank, world, dev, 4,
                                      f"fsdp2 (reshard_after_forward={reshard})")
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            check(p.full_tensor().detach(), q.detach(),
                  f"fsdp2 (reshard_after_forward={reshard}) weight {name}", 1e-4)
    print(f"rank {rank}: fsdp2 on {device} checked", flush=True)


def horovod(device):
    import dtrain.torch as hvd
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    if device == "cuda":
        torch.cuda.set_device(0)  # every rank on the one GPU
    dev = torch.device(device)
    v = lambda r: torch.arange(6, dtype=torch.float32, device=dev) + r  # noqa: E731
    everyone = sum(v(r) for r in range(world))
    check(hvd.allreduce(v(rank), op=hvd.Sum), everyone, "hvd.allreduce sum")
    check(hvd.allreduce(v(rank)), everyone / world, "hvd.allreduce average")
    got = hvd.grouped_allreduce([v(rank), 2 * v(rank)], op=hvd.Sum)
    check(torch.cat(got), torch.cat([everyone, 2 * everyone]), "hvd.grouped_allreduce")
    rows = lambda r: torch.full((r + 1, 2), float(r), device=dev)  # noqa: E731
    check(hvd.allgather(rows(rank)), torch.cat([rows(r) for r in range(world)]), "hvd.allgather")
    check(hvd.broadcast(v(rank), root_rank=0), v(0), "hvd.broadcast")
    # The DistributedOptimizer's averaged gradients and the broadcast state (SGD's momentum
    # buffers, on DEVICE) against one process.
    model = _model(rank).to(dev)  # different on each rank until the broadcast
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    ref = _train_like_one_process(model, rank, world, dev, 5, "hvd.DistributedOptimizer", opt,
                                  hvd.allreduce)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        check(p.detach(), q.detach(), f"hvd.DistributedOptimizer weight {name}", 1e-4)
    hvd.shutdown()
    print(f"rank {rank}: horovod on {device} checked", flush=True)


if __name__ == "__main__":
    name, device = sys.argv[1], sys.argv[2]
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit(f"device_workers: no GPU visible (CUDA_VISIBLE_DEVICES="
                 f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    globals()[name](device)
    if dist.is_initialized():
        dist.destroy_process_group()
