"""torch 2.x's own parallelism on a c10d backend: `python parallel_workers.py NAME BACKEND [ARGS]`.

Started by tests/python/harness.py (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Each NAME trains
or moves tensors with one of torch's tools (FSDP2, DTensor tensor and sequence parallelism,
DeviceMesh, pipelining, distributed checkpoints) and checks the losses and weights against one
process doing the same work on the whole batch, within the tolerance written at the check. Each
rank prints "rank R: NAME ... checked" and exits 0; any mismatch raises.

The model is a small transformer (tests/python/parallel_workers.py's TinyLM): embeddings, two
pre-norm blocks of attention and MLP with separate q/k/v/o and w1/w2 projections (what torch's
tensor-parallel plans name), and an output head.
"""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import dtrain.torch  # noqa: F401  registers "dtrain"

VOCAB, DIM, HEADS, SEQ = 64, 32, 4, 8
STEPS, LR = 4, 0.05


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds HEADS / tp of them.
        q, k, v = (f(x).view(b, s, -1, DIM // HEADS).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = nn.LayerNorm(DIM), Attention(), nn.LayerNorm(DIM), MLP()

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, blocks=2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


def make_model(blocks=2):
    torch.manual_seed(0)
    return TinyLM(blocks)


def batch(step, n):
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, VOCAB, (n, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def sgd(params):
    return torch.optim.SGD(params, lr=LR)


def reference(n, steps=STEPS, blocks=2, optimizer=sgd, clip=0.0):
    """One process on batches of n: the losses and the model every distributed run must reach."""
    model = make_model(blocks)
    opt = optimizer(model.parameters())
    losses = []
    for step in range(steps):
        x, y = batch(step, n)
        opt.zero_grad()
        loss = lm_loss(model(x), y)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return losses, model


def init(backend):
    dist.init_process_group(backend, timeout=timedelta(seconds=60))
    return dist.get_rank(), dist.get_world_size()


def full(t):
    """A parameter's whole value, whether a DTensor (FSDP2, TP) or a plain tensor."""
    t = t.detach()
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def check(got, want, what, tol):
    got, want = torch.as_tensor(got).double(), torch.as_tensor(want).double()
    if not torch.allclose(got, want, rtol=tol, atol=tol):
        diff = (got - want).abs().max().item()
        raise AssertionError(f"rank {dist.get_rank()}: {what}: max difference {diff:.3g} > {tol} "
                             f"(got {got.flatten()[:4].tolist()}, want {want.flatten()[:4].tolist()})")


def check_weights(model, ref, what, tol):
    ours = {n.removeprefix("module."): p for n, p in model.named_parameters()}  # DDP's names too
    for name, q in ref.named_parameters():
        check(full(ours[name]), q.detach(), f"{what}: weight {name}", tol)


def mean_over_ranks(loss, group=None):
    t = loss.detach().clone()
    dist.all_reduce(t, group=group)
    return t / dist.get_world_size(group)


def train_data_parallel(model, rank, world, what, tol, micro=1, before_micro=None, optimizer=sgd,
                        clip=0.0, one_process_optimizer=None):
    """Each rank trains on its share of the batch (micro-batches of it accumulated when micro > 1);
    the mean loss and the weights must be the one process's on the whole batch. `optimizer`
    makes the optimizer from parameters (the one process's: `one_process_optimizer`, else the
    same); `clip` > 0 clips the gradients' global norm."""
    want, ref = reference(4 * world, optimizer=one_process_optimizer or optimizer, clip=clip)
    opt = optimizer(model.parameters())
    for step in range(STEPS):
        x, y = batch(step, 4 * world)
        x, y = x[rank::world], y[rank::world]
        opt.zero_grad()
        total = 0.0
        for m in range(micro):
            if before_micro:
                before_micro(model, last=m == micro - 1)
            loss = lm_loss(model(x[m::micro]), y[m::micro]) / micro
            loss.backward()
            total = total + loss.detach()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        check(mean_over_ranks(total), want[step], f"{what}: loss of step {step}", tol)
    check_weights(model, ref, what, tol)


def shard_blocks(model, **kwargs):
    from torch.distributed.fsdp import fully_shard
    for b in model.blocks:
        fully_shard(b, **kwargs)
    fully_shard(model, **kwargs)
    return model


def fsdp2(backend, variant):
    """fully_shard per block: `reshard` / `keep` (reshard_after_forward True / False), `bf16`
    (bf16 parameters, fp32 gradient reduction), `accumulate` (two micro-batches, the first
    without gradient sync or resharding), `hsdp` (a 2-D mesh: replicas of 2-way shards)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    rank, world = init(backend)
    if variant in ("reshard", "keep"):
        model = shard_blocks(make_model(), reshard_after_forward=variant == "reshard")
        train_data_parallel(model, rank, world, f"fsdp2 {variant}", 2e-5)
    elif variant == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        model = shard_blocks(make_model(), mp_policy=policy)
        # bf16 forward and backward against fp32 in one process: bf16's 8 bits of mantissa.
        train_data_parallel(model, rank, world, "fsdp2 bf16", 3e-2)
    elif variant == "accumulate":
        def before_micro(model, last):
            model.set_requires_gradient_sync(last)
            model.set_reshard_after_backward(last)
        model = shard_blocks(make_model())
        train_data_parallel(model, rank, world, "fsdp2 accumulate", 2e-5, micro=2,
                            before_micro=before_micro)
    elif variant == "hsdp":
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("replicate", "shard"))
        model = shard_blocks(make_model(), mesh=mesh)
        train_data_parallel(model, rank, world, "hsdp", 2e-5)
    else:
        raise ValueError(variant)
    print(f"rank {rank}: fsdp2 {variant} checked", flush=True)


def zero(backend, stage, kind, clip="0"):
    """ZeRO's stages with torch's own tools: 1 is DDP with ZeroRedundancyOptimizer (optimizer
    state sharded), 2 FSDP2 keeping parameters whole after forward, 3 FSDP2 resharding them;
    KIND is sgd (with momentum), adam or adamw; CLIP > 0 clips the gradients' global norm."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    rank, world = init(backend)
    stage, clip = int(stage), float(clip)
    # Adam's eps well above rounding: attention's key biases get gradients that are zero but for
    # rounding, which Adam would otherwise scale up to whole steps of noise.
    cls, extra = {"sgd": (torch.optim.SGD, {"momentum": 0.9}),
                  "adam": (torch.optim.Adam, {"eps": 1e-3}),
                  "adamw": (torch.optim.AdamW, {"eps": 1e-3, "weight_decay": 0.1})}[kind]
    lr = LR if kind == "sgd" else 0.01

    def plain_optimizer(params):
        return cls(params, lr=lr, **extra)

    if stage == 1:
        model = nn.parallel.DistributedDataParallel(make_model())

        def optimizer(params):
            return ZeroRedundancyOptimizer(params, optimizer_class=cls, lr=lr, **extra)

        train_data_parallel(model, rank, world, f"zero-1 {kind}", 2e-5, optimizer=optimizer,
                            clip=clip, one_process_optimizer=plain_optimizer)
    else:
        model = shard_blocks(make_model(), reshard_after_forward=stage == 3)
        train_data_parallel(model, rank, world, f"zero-{stage} {kind}", 2e-5,
                            optimizer=plain_optimizer, clip=clip)
    print(f"rank {rank}: zero {stage} {kind} checked", flush=True)


def tp_plan(sequence_parallel):
    """torch's Megatron-style plan for a Block: q/k/v and w1 split by columns, o and w2 by rows;
    with sequence parallelism the norms run on sequence shards between them."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel)
    if not sequence_parallel:
        return {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
                "attn.v": ColwiseParallel(), "attn.o": RowwiseParallel(),
                "mlp.w1": ColwiseParallel(), "mlp.w2": RowwiseParallel()}
    return {
        "norm1": SequenceParallel(), "norm2": SequenceParallel(),
        "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
        "attn.o": RowwiseParallel(output_layouts=Shard(1)),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.w1": ColwiseParallel(), "mlp.w2": RowwiseParallel(output_layouts=Shard(1)),
    }


def parallelize_blocks(model, mesh, sequence_parallel):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (parallelize_module, PrepareModuleInput,
                                                   SequenceParallel)
    for b in model.blocks:
        parallelize_module(b, mesh, tp_plan(sequence_parallel))
    if sequence_parallel:
        # The residual stream between blocks is each rank's sequence shard, a plain tensor: the
        # embedding output is cut, the final norm runs on shards, the head sees it all again.
        parallelize_module(model, mesh, {
            "blocks.0": PrepareModuleInput(input_layouts=(Replicate(),),
                                           desired_input_layouts=(Shard(1),),
                                           use_local_output=True),
            "norm": SequenceParallel(),
            "head": PrepareModuleInput(input_layouts=(Shard(1),),
                                       desired_input_layouts=(Replicate(),),
                                       use_local_output=True),
        })
    return model


def plain(t):
    """A model output as a plain tensor (a DTensor's whole value), still part of the graph."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def tp(backend, variant):
    """parallelize_module over a 1-D mesh of every rank: `tp` (column/row parallel projections),
    `sp` (with sequence parallel norms). Every rank sees the whole batch."""
    from torch.distributed.device_mesh import init_device_mesh
    rank, world = init(backend)
    mesh = init_device_mesh("cpu", (world,))
    model = parallelize_blocks(make_model(), mesh, variant == "sp")
    want, ref = reference(8)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = batch(step, 8)
        opt.zero_grad()
        loss = lm_loss(plain(model(x)), y)
        loss.backward()
        opt.step()
        check(loss.detach(), want[step], f"{variant}: loss of step {step}", 2e-5)
    check_weights(model, ref, variant, 2e-5)
    print(f"rank {rank}: {variant} checked", flush=True)


def fsdp_tp(backend):
    """2-D parallelism on 4 ranks: tensor parallel within pairs, FSDP2 across them."""
    from torch.distributed.device_mesh import init_device_mesh
    rank, world = init(backend)
    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    model = parallelize_blocks(make_model(), mesh["tp"], False)
    shard_blocks(model, mesh=mesh["dp"])
    dp, dp_rank = world // 2, mesh["dp"].get_local_rank()
    want, ref = reference(4 * dp)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = batch(step, 4 * dp)
        opt.zero_grad()
        loss = lm_loss(plain(model(x[dp_rank::dp])), y[dp_rank::dp])
        loss.backward()
        opt.step()
        check(mean_over_ranks(loss, mesh["dp"].get_group()), want[step], f"fsdp+tp: loss of step {step}", 2e-5)
    check_weights(model, ref, "fsdp+tp", 2e-5)
    print(f"rank {rank}: fsdp+tp checked", flush=True)


def redistribute(backend):
    """DTensor between placements on a 1-D and a 2-D mesh: each result's whole value is the
    tensor it started from (a Partial one: the sum of every rank's part)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    rank, world = init(backend)
    torch.manual_seed(7)
    whole = torch.randn(world * 3, world * 2 + 1)
    meshes = [init_device_mesh("cpu", (world,))]
    if world % 2 == 0 and world > 2:
        meshes.append(init_device_mesh("cpu", (2, world // 2)))
    for mesh in meshes:
        dims = mesh.ndim
        layouts = [[Replicate()] * dims, [Shard(0)] * dims, [Shard(1)] * dims,
                   [Shard(0)] + [Shard(1)] * (dims - 1)]
        for src in layouts:
            for dst in layouts:
                t = distribute_tensor(whole, mesh, src).redistribute(mesh, dst)
                check(t.full_tensor(), whole, f"{mesh.shape}: {src} -> {dst}", 0)
        # A Partial tensor: each rank holds a part; the whole is their sum.
        part = whole * (rank + 1)
        partial = DTensor.from_local(part, meshes[0], [Partial()])
        want = whole * sum(r + 1 for r in range(world))
        for dst in ([Replicate()], [Shard(0)], [Shard(1)]):
            got = partial.redistribute(meshes[0], dst).full_tensor()
            check(got, want, f"Partial -> {dst}", 1e-5)
    print(f"rank {rank}: redistribute checked", flush=True)


SCHEDULES = {
    # name: stages per rank, and whether rank r holds stages r and 2*world-1-r (a V) rather than
    # r, r + world, ...
    "GPipe": (1, False), "1F1B": (1, False), "Interleaved1F1B": (2, False),
    "LoopedBFS": (2, False), "InterleavedZeroBubble": (2, False), "ZBVZeroBubble": (2, True),
}


def stages_of(r, world, name):
    per_rank, vee = SCHEDULES[name]
    return [r, 2 * world - 1 - r] if vee else [r + k * world for k in range(per_rank)]


def pipeline(backend, name):
    """torch.distributed.pipelining: one block of TinyLM per stage (1 stage per rank, 2 for the
    multi-stage schedules), 4 micro-batches per step. The loss and the weights must be those of
    one process on the whole batch."""
    import torch.distributed.pipelining as pp
    rank, world = init(backend)
    n = world * SCHEDULES[name][0]
    model = make_model(blocks=n)
    ids = stages_of(rank, world, name)
    mods = [StageModule(model, i, n) for i in ids]
    stages = [pp.PipelineStage(m, i, n, torch.device("cpu")) for m, i in zip(mods, ids)]
    schedule_cls = getattr(pp, f"Schedule{name}")
    kwargs = dict(n_microbatches=4, loss_fn=lm_loss)
    schedule = schedule_cls(stages[0] if len(stages) == 1 else stages, **kwargs)
    opt = torch.optim.SGD([p for m in mods for p in m.parameters()], lr=LR)
    last = n - 1 in ids
    last_rank = next(r for r in range(world) if n - 1 in stages_of(r, world, name))
    want, ref = reference(8, blocks=n)
    for step in range(STEPS):
        x, y = batch(step, 8)
        opt.zero_grad()
        losses = []
        schedule.step(x if 0 in ids else None, target=y if last else None,
                      losses=losses if last else None)
        opt.step()
        # The micro-batch losses are on the last stage's rank; it tells the others.
        t = torch.tensor(sum(l.item() for l in losses) / len(losses) if last else 0.0)
        dist.broadcast(t, src=last_rank)
        check(t, want[step], f"pipeline {name}: loss of step {step}", 2e-5)
    ours = {k: p for m in mods for k, p in m.named_parameters_of_model()}
    for k, q in ref.named_parameters():
        if k in ours:
            check(ours[k].detach(), q.detach(), f"pipeline {name}: weight {k}", 2e-5)
    print(f"rank {rank}: pipeline {name} checked", flush=True)


class StageModule(nn.Module):
    """Stage i of n: block i of the model, with the embedding before it on stage 0 and the final
    norm and head after it on stage n-1 (parameters shared with `model`, names kept)."""

    def __init__(self, model, i, n):
        super().__init__()
        self.i, self.n = i, n
        self.embed = model.embed if i == 0 else None
        self.block = model.blocks[i]
        self.norm = model.norm if i == n - 1 else None
        self.head = model.head if i == n - 1 else None

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        x = self.block(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x

    def named_parameters_of_model(self):
        for n, p in self.named_parameters():
            yield (n.replace("block.", f"blocks.{self.i}.", 1), p)


def _dcp_model(layout, world):
    """TinyLM laid out as `layout`: `fsdp` (fully_shard per block), `tp` (column/row parallel
    over every rank) or `plain` (whole, in this process)."""
    from torch.distributed.device_mesh import init_device_mesh
    model = make_model()
    if layout == "fsdp":
        shard_blocks(model)
    elif layout == "tp":
        parallelize_blocks(model, init_device_mesh("cpu", (world,)), False)
    return model


def _full_state(model, opt):
    """Every weight and Adam moment whole, by name (gathered on every rank)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    msd, osd = get_state_dict(model, opt)
    out = {f"model.{k}": full(v).clone() for k, v in msd.items()}
    for name, st in osd["state"].items():
        for k in ("exp_avg", "exp_avg_sq"):
            out[f"optim.{name}.{k}"] = full(st[k]).clone()
    return out


def dcp_save(backend, folder):
    """Trains TinyLM with FSDP2 and Adam for two steps, saves model and optimizer with dcp.save
    and (while a third step runs) dcp.async_save on a group of its own, and writes the whole
    state it saved to FOLDER/want.pt for dcp_load to compare with."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    rank, world = init(backend)
    model = _dcp_model("fsdp", world)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    def step(i):
        x, y = batch(i, 4 * world)
        opt.zero_grad()
        lm_loss(model(x[rank::world]), y[rank::world]).backward()
        opt.step()

    step(0)
    step(1)
    msd, osd = get_state_dict(model, opt)
    want = _full_state(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(folder, "sync"))
    # torch's advice: the background writer's collectives on a group apart from training's.
    writer_group = dist.new_group(backend=backend)
    pending = dcp.async_save({"model": msd, "optim": osd},
                             checkpoint_id=os.path.join(folder, "async"), process_group=writer_group)
    step(2)  # training goes on while the checkpoint is written; it must hold step 1's state
    pending.result()
    if rank == 0:
        torch.save(want, os.path.join(folder, "want.pt"))
    dist.barrier()
    print(f"rank {rank}: dcp saved", flush=True)


def dcp_load(backend, folder, which, layout):
    """Loads FOLDER/WHICH (sync or async) into TinyLM laid out as LAYOUT at this world size, and
    checks every weight and Adam moment against what dcp_save saved."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    rank, world = init(backend)
    model = _dcp_model(layout, world)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    # Adam's state exists once it stepped: one step of zero gradients makes it, then load.
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=os.path.join(folder, which))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    want = torch.load(os.path.join(folder, "want.pt"))
    got = _full_state(model, opt)
    assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
    for k, v in want.items():
        check(got[k], v, f"dcp {which} -> {layout} on {world}: {k}", 0)
    print(f"rank {rank}: dcp {which} into {layout} on {world} checked", flush=True)


def compiled_ddp(backend):
    """DDP around a torch.compile'd TinyLM (inductor, CPU): the one process's losses and weights."""
    rank, world = init(backend)
    model = nn.parallel.DistributedDataParallel(make_model())
    compiled = torch.compile(model)
    want, ref = reference(4 * world)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = batch(step, 4 * world)
        opt.zero_grad()
        loss = lm_loss(compiled(x[rank::world]), y[rank::world])
        loss.backward()
        opt.step()
        check(mean_over_ranks(loss), want[step], f"compiled ddp: loss of step {step}", 2e-5)
    check_weights(model.module, ref, "compiled ddp", 2e-5)
    print(f"rank {rank}: compiled ddp checked", flush=True)


def partial_dtype(backend, dtype):
    """A Partial DTensor of DTYPE made whole (an all-reduce underneath): the sum, or an error."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate
    rank, world = init(backend)
    mesh = init_device_mesh("cpu", (world,))
    part = torch.arange(6).to(getattr(torch, dtype))
    got = DTensor.from_local(part, mesh, [Partial()]).redistribute(mesh, [Replicate()])
    check(got.to_local().to(torch.complex128).real if got.is_complex() else got.to_local().double(),
          torch.arange(6).double() * world, f"Partial {dtype} -> Replicate", 0)
    print(f"rank {rank}: partial {dtype} checked", flush=True)


def mismatched_mesh(backend):
    """Rank 0 builds a 2-D mesh where the others build a 1-D one, then all train with FSDP2."""
    from torch.distributed.device_mesh import init_device_mesh
    dist.init_process_group(backend, timeout=timedelta(seconds=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    shape = (2, world // 2) if rank == 0 else (world,)
    mesh = init_device_mesh("cpu", shape)
    model = shard_blocks(make_model(), mesh=mesh)
    x, y = batch(0, 4 * world)
    lm_loss(model(x[rank::world]), y[rank::world]).backward()
    print(f"rank {rank}: mismatched mesh trained", flush=True)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
    dist.destroy_process_group()
    if sys.argv[2:3] == ["gloo"]:
        sys.stdout.flush()
        os._exit(0)  # see workers.py: torch's gloo can abort at interpreter exit
