"""The per-rank bodies of the Python tests: `python3 workers.py NAME BACKEND [ARGS...]`.

Each starts torch.distributed with BACKEND through env:// (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT from tests/python/harness.py or a launcher), runs its checks against values computed
locally, and exits 0; any mismatch raises, which exits non-zero with the traceback.
"""
import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import dtrain.torch  # noqa: F401  registers "dtrain"

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]


def init(backend, timeout_s=60):
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def value(rank, n, dtype):
    """Rank r's tensor: small values that every dtype holds exactly, reduced without overflow."""
    return ((torch.arange(n) % 5) + rank + 1).to(dtype)


def expect(got, want, what):
    if got.dtype in (torch.float16, torch.bfloat16):
        ok = torch.allclose(got.double(), want.double(), rtol=1e-2, atol=1e-2)
    else:
        ok = torch.equal(got, want.to(got.dtype))
    if not ok:
        raise AssertionError(f"rank {dist.get_rank()}: {what}: got {got.tolist()[:12]}, "
                             f"want {want.tolist()[:12]}")


def reduced(op, world, n, dtype):
    vals = [value(r, n, torch.int64) for r in range(world)]
    if op == dist.ReduceOp.SUM:
        out = sum(vals)
    elif op == dist.ReduceOp.PRODUCT:
        out = vals[0].clone()
        for v in vals[1:]:
            out = out * v
    elif op == dist.ReduceOp.MIN:
        out = torch.stack(vals).min(0).values
    elif op == dist.ReduceOp.MAX:
        out = torch.stack(vals).max(0).values
    elif op == dist.ReduceOp.AVG:
        return sum(v.double() for v in vals) / world
    elif op == dist.ReduceOp.BAND:
        out = vals[0].clone()
        for v in vals[1:]:
            out = out & v
    elif op == dist.ReduceOp.BOR:
        out = vals[0].clone()
        for v in vals[1:]:
            out = out | v
    elif op == dist.ReduceOp.BXOR:
        out = vals[0].clone()
        for v in vals[1:]:
            out = out ^ v
    return out


def ops_for(dtype):
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
    if dtype.is_floating_point:
        ops.append(dist.ReduceOp.AVG)
    else:
        ops += [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
    return ops


def check_everything(rank, world, group=None, tag=""):
    """Every operation of torch.distributed on `group` (ranks as the group numbers them)."""
    if group is not None:
        rank, world = dist.get_rank(group), dist.get_world_size(group)
    g = {"group": group} if group is not None else {}

    def global_rank(r):
        return dist.distributed_c10d._get_global_rank(group, r) if group is not None else r

    for dtype in FLOATS + INTS:
        for n in (1, 7, 1000):
            what = f"{tag}{dtype} x{n}"
            for op in ops_for(dtype):
                if op == dist.ReduceOp.PRODUCT and (n == 1000 or dtype == torch.int8):
                    continue  # products overflow the small dtypes
                t = value(rank, n, dtype)
                dist.all_reduce(t, op=op, **g)
                expect(t, reduced(op, world, n, dtype), f"all_reduce {op} {what}")
                if n == 7:
                    for root in range(world):
                        t = value(rank, n, dtype)
                        dist.reduce(t, global_rank(root), op=op, **g)
                        if rank == root:
                            expect(t, reduced(op, world, n, dtype), f"reduce {op} root {root} {what}")
                        else:  # torch's users expect the other ranks' tensors untouched
                            expect(t, value(rank, n, dtype), f"reduce {op} non-root {what}")
            for root in range(world):
                t = value(rank, n, dtype)
                dist.broadcast(t, global_rank(root), **g)
                expect(t, value(root, n, dtype), f"broadcast root {root} {what}")
            outs = [torch.zeros(n, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, value(rank, n, dtype), **g)
            for r in range(world):
                expect(outs[r], value(r, n, dtype), f"all_gather block {r} {what}")
            flat = torch.zeros(n * world, dtype=dtype)
            dist.all_gather_into_tensor(flat, value(rank, n, dtype), **g)
            expect(flat, torch.cat([value(r, n, dtype) for r in range(world)]),
                   f"all_gather_into_tensor {what}")
            for root in range(world):
                gl = [torch.zeros(n, dtype=dtype) for _ in range(world)] if rank == root else None
                dist.gather(value(rank, n, dtype), gl, dst=global_rank(root), **g)
                if rank == root:
                    for r in range(world):
                        expect(gl[r], value(r, n, dtype), f"gather root {root} block {r} {what}")
                sl = [value(r, n, dtype) * 1 for r in range(world)] if rank == root else None
                out = torch.zeros(n, dtype=dtype)
                dist.scatter(out, sl, src=global_rank(root), **g)
                expect(out, value(rank, n, dtype), f"scatter root {root} {what}")
            ins = [value(rank, n, dtype) for _ in range(world)]
            out = torch.zeros(n, dtype=dtype)
            dist.reduce_scatter(out, ins, **g)
            expect(out, reduced(dist.ReduceOp.SUM, world, n, dtype), f"reduce_scatter {what}")
            out = torch.zeros(n, dtype=dtype)
            dist.reduce_scatter_tensor(out, torch.cat(ins), **g)
            expect(out, reduced(dist.ReduceOp.SUM, world, n, dtype), f"reduce_scatter_tensor {what}")
            # all_to_all_single: block j of rank r holds r * 100 + j (every dtype holds < 128? no:
            # keep it small) -> block i of the output came from rank i.
            src = torch.cat([torch.full((n,), rank * 4 + j) for j in range(world)]).to(dtype)
            out = torch.zeros(n * world, dtype=dtype)
            dist.all_to_all_single(out, src, **g)
            want = torch.cat([torch.full((n,), i * 4 + rank) for i in range(world)]).to(dtype)
            expect(out, want, f"all_to_all_single {what}")
            outs = [torch.zeros(n, dtype=dtype) for _ in range(world)]
            dist.all_to_all(outs, list(src.chunk(world)), **g)
            expect(torch.cat(outs), want, f"all_to_all {what}")
    # all_to_all_single with split sizes: rank r sends j + 1 rows of width 3 to rank j.
    rows_in = [j + 1 for j in range(world)]
    rows_out = [rank + 1] * world
    src = torch.cat([torch.full((j + 1, 3), float(rank * 10 + j)) for j in range(world)])
    out = torch.zeros(sum(rows_out), 3)
    dist.all_to_all_single(out, src, output_split_sizes=rows_out, input_split_sizes=rows_in, **g)
    want = torch.cat([torch.full((rank + 1, 3), float(i * 10 + rank)) for i in range(world)])
    expect(out, want, f"{tag}all_to_all_single with split sizes")
    # Coalesced forms.
    ts = [value(rank, 3, torch.float32), value(rank, 5, torch.float32)]
    dist.all_reduce_coalesced(ts, **g)
    expect(ts[0], reduced(dist.ReduceOp.SUM, world, 3, torch.float32), f"{tag}all_reduce_coalesced 0")
    expect(ts[1], reduced(dist.ReduceOp.SUM, world, 5, torch.float32), f"{tag}all_reduce_coalesced 1")
    # all_gather_coalesced: one output list per rank, each with a tensor per input (five inputs,
    # so that no world size makes the two layouts alike).
    sizes = (3, 5, 1, 2, 4)
    outs = [[torch.zeros(k) for k in sizes] for _ in range(world)]
    dist.all_gather_coalesced(outs, [value(rank, k, torch.float32) for k in sizes], **g)
    for r in range(world):
        for i, k in enumerate(sizes):
            expect(outs[r][i], value(r, k, torch.float32),
                   f"{tag}all_gather_coalesced rank {r} input {i}")
    check_torch2_paths(rank, world, group, tag)
    check_bytes_only_dtypes(rank, world, group, tag)
    # Non-contiguous tensors: results land in the caller's tensor.
    t = value(rank, 12, torch.float32).view(3, 4).t()
    dist.all_reduce(t, **g)
    expect(t.contiguous(), reduced(dist.ReduceOp.SUM, world, 12, torch.float32).view(3, 4).t().contiguous(),
           f"{tag}all_reduce of a transposed tensor")
    # Booleans: SUM is a logical or, PRODUCT a logical and.
    b = torch.tensor([rank == 0, False, True])
    dist.all_reduce(b, **g)
    expect(b, torch.tensor([True, False, True]), f"{tag}all_reduce of bools")
    # Point to point around the ring, blocking and not.
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if world > 1:
        out = torch.zeros(5)
        reqs = [dist.isend(value(rank, 5, torch.float32), global_rank(nxt), **g),
                dist.irecv(out, global_rank(prv), **g)]
        for q in reqs:
            q.wait()
        expect(out, value(prv, 5, torch.float32), f"{tag}isend/irecv ring")
        if rank % 2 == 0:
            dist.send(value(rank, 4, torch.int64), global_rank(nxt), tag=7, **g)
            out = torch.zeros(4, dtype=torch.int64)
            dist.recv(out, global_rank(prv), tag=7, **g)
        else:
            out = torch.zeros(4, dtype=torch.int64)
            dist.recv(out, global_rank(prv), tag=7, **g)
            dist.send(value(rank, 4, torch.int64), global_rank(nxt), tag=7, **g)
        expect(out, value(prv, 4, torch.int64), f"{tag}send/recv with a tag")
    # Receive from any source: every other rank sends rank 0 its (global) rank; rank 0 takes
    # them in whatever order they come, and each recv returns who sent it (a global rank).
    if rank == 0:
        seen = set()
        for _ in range(world - 1):
            t = torch.zeros(3, dtype=torch.int64)
            src = dist.recv(t, tag=11, **g)  # no src: any source
            expect(t, torch.full((3,), src), f"{tag}recv from any source")
            seen.add(src)
        assert seen == {global_rank(r) for r in range(1, world)}, f"{tag}any-source senders {seen}"
    else:
        dist.send(torch.full((3,), global_rank(rank)), global_rank(0), tag=11, **g)
    # Objects (pickled through broadcast and all_gather).
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank}, **g)
    assert objs == [{"rank": r} for r in range(world)], f"{tag}all_gather_object: {objs}"
    lst = [f"from {rank}"] if rank == 0 else [None]
    dist.broadcast_object_list(lst, src=global_rank(0), **g)
    assert lst == ["from 0"], f"{tag}broadcast_object_list: {lst}"
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(("from", rank), gathered, dst=global_rank(0), **g)
    if rank == 0:
        assert gathered == [("from", r) for r in range(world)], f"{tag}gather_object: {gathered}"
    if group is None:  # torch 1.13's scatter_object_list mixes group and global ranks
        got = [None]
        dist.scatter_object_list(got, [{"to": r} for r in range(world)] if rank == 0 else None,
                                 src=0)
        assert got == [{"to": rank}], f"scatter_object_list: {got}"
    # Asynchronous: several in flight, futures, then-callbacks.
    ts = [value(rank, 100, torch.float32) for _ in range(4)]
    works = [dist.all_reduce(t, async_op=True, **g) for t in ts]
    futs = [w.get_future().then(lambda f: f.value()[0] * 2) for w in works]
    for f in futs:
        expect(f.wait(), reduced(dist.ReduceOp.SUM, world, 100, torch.float32) * 2,
               f"{tag}future of an async all_reduce")
    for w in works:
        assert w.is_completed() and w.is_success(), f"{tag}a finished work says it is not"
    dist.barrier(**g)


def check_bytes_only_dtypes(rank, world, group, tag):
    """Dtypes dtrain has no arithmetic for move as bytes: broadcast, gathers, all to all, point to
    point; reducing one fails in the call, naming the dtype."""
    g = {"group": group} if group is not None else {}
    gr = (lambda r: dist.distributed_c10d._get_global_rank(group, r)) if group is not None else (lambda r: r)
    for dtype in (torch.uint16, torch.float8_e4m3fn, torch.complex64, torch.int16):
        def val(r, n=6):
            return (torch.arange(n, dtype=torch.float32) + r + 1).to(dtype)
        what = f"{tag}{dtype}"
        t = val(rank)
        dist.broadcast(t, gr(0), **g)
        assert torch.equal(t.view(torch.uint8), val(0).view(torch.uint8)), f"broadcast {what}"
        flat = torch.zeros(6 * world, dtype=dtype)
        dist.all_gather_into_tensor(flat, val(rank), **g)
        want = torch.cat([val(r) for r in range(world)])
        assert torch.equal(flat.view(torch.uint8), want.view(torch.uint8)), f"all_gather {what}"
        src = torch.cat([val(rank * 4 + j, 2) for j in range(world)])
        out = torch.zeros(2 * world, dtype=dtype)
        dist.all_to_all_single(out, src, **g)
        want = torch.cat([val(i * 4 + rank, 2) for i in range(world)])
        assert torch.equal(out.view(torch.uint8), want.view(torch.uint8)), f"all_to_all {what}"
        if world > 1 and rank < 2:
            if rank == 0:
                dist.send(val(7), gr(1), **g)
            else:
                got = torch.zeros(6, dtype=dtype)
                dist.recv(got, gr(0), **g)
                assert torch.equal(got.view(torch.uint8), val(7).view(torch.uint8)), f"recv {what}"
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.uint16), **g)
    except RuntimeError as e:
        assert "cannot reduce UInt16 tensors" in str(e), str(e)
    else:
        raise AssertionError(f"{tag}all_reduce of uint16 did not fail")
    dist.barrier(**g)


def check_torch2_paths(rank, world, group, tag):
    """What torch 2.x's own tools send: functional collectives (DTensor's path, which reaches the
    backend as allgather_into_tensor_coalesced and reduce_scatter_tensor_coalesced even for one
    tensor), the coalescing manager, and batched point to point."""
    import warnings

    import torch.distributed._functional_collectives as funcol
    pg = group if group is not None else dist.group.WORLD
    SUM = dist.ReduceOp.SUM
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # 2.15 renames some of these
        got = funcol.all_reduce(value(rank, 6, torch.float32), "sum", pg).wait()
        expect(got, reduced(SUM, world, 6, torch.float32), f"{tag}functional all_reduce")
        got = funcol.all_reduce(value(rank, 6, torch.float32), "avg", pg).wait()
        expect(got, reduced(dist.ReduceOp.AVG, world, 6, torch.float32), f"{tag}functional avg")
        got = funcol.all_gather_tensor(value(rank, 4, torch.bfloat16).view(2, 2), 0, pg).wait()
        expect(got, torch.cat([value(r, 4, torch.bfloat16).view(2, 2) for r in range(world)]),
               f"{tag}functional all_gather_tensor")
        got = funcol.reduce_scatter_tensor(torch.cat([value(rank, 4, torch.float32)] * world),
                                           "sum", 0, pg).wait()
        expect(got, reduced(SUM, world, 4, torch.float32) * 1, f"{tag}functional reduce_scatter")
        got = funcol.all_gather_into_tensor_coalesced(
            [value(rank, 3, torch.float32), value(rank, 5, torch.float32)], pg)
        for i, k in enumerate((3, 5)):
            expect(got[i].wait() if hasattr(got[i], "wait") else got[i],
                   torch.cat([value(r, k, torch.float32) for r in range(world)]),
                   f"{tag}functional all_gather_into_tensor_coalesced {i}")
        ins = [torch.cat([value(rank, k, torch.float32) + j for j in range(world)]) for k in (2, 3)]
        got = funcol.reduce_scatter_tensor_coalesced(ins, "sum", [0, 0], pg)
        for i, k in enumerate((2, 3)):
            want = sum(value(r, k, torch.float32) + rank for r in range(world))
            expect(got[i].wait() if hasattr(got[i], "wait") else got[i], want,
                   f"{tag}functional reduce_scatter_tensor_coalesced {i}")
    # The coalescing manager: several all-reduces as one Work.
    ts = [value(rank, k, torch.float32) for k in (2, 7)]
    with dist._coalescing_manager(group=pg, device=torch.device("cpu"), async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t, group=pg)
    cm.wait()
    for t, k in zip(ts, (2, 7)):
        expect(t, reduced(SUM, world, k, torch.float32), f"{tag}coalescing manager all_reduce")
    if world > 1:  # batched point to point around the ring (coalesced by the backend)
        gr = lambda r: dist.distributed_c10d._get_global_rank(group, r) if group is not None else r  # noqa: E731
        out = torch.zeros(4)
        reqs = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, value(rank, 4, torch.float32), gr((rank + 1) % world), pg),
            dist.P2POp(dist.irecv, out, gr((rank - 1) % world), pg)])
        for q in reqs:
            q.wait()
        expect(out, value((rank - 1) % world, 4, torch.float32), f"{tag}batch_isend_irecv")


def ops(backend):
    rank, world = init(backend)
    check_everything(rank, world)
    print(f"rank {rank}: every operation checked", flush=True)


def spawned(backend, port, world):
    """The mp.spawn pattern of torch's tutorials: WORLD_SIZE may be set in the environment, RANK
    is not, and each process passes rank and world size to init_process_group itself."""
    import torch.multiprocessing as mp
    mp.spawn(_spawned_rank, args=(backend, int(port), int(world)), nprocs=int(world), join=True)
    print("every spawned rank checked", flush=True)


def _spawned_rank(rank, backend, port, world):
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    t = value(rank, 5, torch.float32)
    dist.all_reduce(t)
    expect(t, reduced(dist.ReduceOp.SUM, world, 5, torch.float32), "all_reduce after mp.spawn")
    dist.destroy_process_group()


def subgroups(backend):
    rank, world = init(backend)
    # Every rank calls new_group with the same list; the members use it.
    odd = dist.new_group([r for r in range(world) if r % 2 == 1])
    rev = dist.new_group(list(reversed(range(world))))
    pair = dist.new_group([0, world - 1])
    if rank % 2 == 1:
        check_everything(rank, world, odd, "odd group: ")
    check_everything(rank, world, rev, "reversed group: ")
    if rank in (0, world - 1):
        check_everything(rank, world, pair, "pair group: ")
    # The world still works after the sub-groups were used.
    t = value(rank, 9, torch.float32)
    dist.all_reduce(t)
    expect(t, reduced(dist.ReduceOp.SUM, world, 9, torch.float32), "world after sub-groups")
    print(f"rank {rank}: sub-groups checked", flush=True)


def init_methods(backend, method, shared_dir):
    """init_process_group through tcp://, file:// or a store passed in, then an all_reduce."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    timeout = timedelta(seconds=60)
    if method == "tcp":
        dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank,
                                world_size=world, timeout=timeout)
    elif method == "file":
        dist.init_process_group(backend, init_method=f"file://{shared_dir}/rendezvous",
                                rank=rank, world_size=world, timeout=timeout)
    elif method == "store":
        store = dist.TCPStore(addr, port, world, rank == 0, timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    else:
        raise SystemExit(f"unknown init method {method}")
    t = value(rank, 33, torch.float32)
    dist.all_reduce(t)
    expect(t, reduced(dist.ReduceOp.SUM, world, 33, torch.float32), f"all_reduce after {method}://")
    g = dist.new_group([0, world - 1])
    if rank in (0, world - 1):
        t = torch.ones(4)
        dist.all_reduce(t, group=g)
        expect(t, torch.full((4,), 2.0), f"sub-group after {method}://")
    dist.barrier()  # rank 0 hosts the store: it stays until everyone is past new_group
    dist.destroy_process_group()


def killed(backend, victim):
    """Rank `victim` dies in the middle; the others must fail naming it, quickly."""
    victim = int(victim)
    rank, world = init(backend, timeout_s=60)
    t = torch.ones(1 << 16)
    dist.all_reduce(t)
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        for _ in range(3):
            dist.all_reduce(t)
    except RuntimeError as e:
        took = time.monotonic() - start
        print(f"rank {rank}: failed after {took:.2f} s: {type(e).__name__}: {e}", flush=True)
        assert took < 20, f"took {took:.1f} s against a 60 s timeout"
        # torch's own kind for a failed collective, so that scripts catching it see ours too.
        assert isinstance(e, dist.DistBackendError), f"{type(e)} is not DistBackendError"
        sys.exit(3)
    sys.exit(0)


def live_ddp(backend, die_rank, die_after, die_in_reform="-1"):
    """torch.distributed and DistributedDataParallel under `dtrain run --live`: each step
    all-reduces [step, rank at start] and checks it against the members it knows, then trains a
    DDP step. Rank `die_rank` (at start) SIGKILLs itself at step `die_after`; the survivors
    re-form (dtrain.torch.live), take the newest step's weights from the lowest rank holding it,
    make DDP again and finish. Rank `die_in_reform` (at start), when a peer dies, takes part in
    the agreement on the next generation and SIGKILLs itself once the list is closed, before the
    new world connects."""
    import dtrain.torch.live as live
    die_rank, die_after, die_in_reform = int(die_rank), int(die_after), int(die_in_reform)
    _, world = init(backend, timeout_s=60)
    me = live.original_rank()
    members = list(range(world))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    step = reformed = 0
    while step < 12:
        try:
            if me == die_rank and step == die_after:
                os.kill(os.getpid(), signal.SIGKILL)
            v = torch.tensor([step, me], dtype=torch.int64)
            dist.all_reduce(v)
            expect(v, torch.tensor([step * len(members), sum(members)]), f"step {step}")
            opt.zero_grad()
            ddp(torch.full((2, 4), float(me + 1))).square().sum().backward()
            opt.step()
            step += 1
        except Exception as error:
            if not live.peer_lost(error):
                raise
            if me == die_in_reform:  # the agreement reform() starts with, then no world
                live._live_membership().next()
                print(f"rank {me} at start: listed for generation {reformed + 1}, dying before "
                      "its world connects", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            r = live.reform()
            members = [m for m in members if m not in r.lost]
            assert (dist.get_rank(), dist.get_world_size()) == (members.index(me), len(members))
            steps = [0] * r.size
            dist.all_gather_object(steps, step)
            step = max(steps)
            for p in model.parameters():
                dist.broadcast(p.data, src=steps.index(step))
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            reformed += 1
    weights = ",".join(f"{x:.9g}" for p in model.parameters() for x in p.detach().flatten())
    print(f"rank {me} at start: live ddp finished at step {step} as rank {dist.get_rank()} of "
          f"{dist.get_world_size()} after {reformed} re-forming(s); weights {weights}",
          flush=True)
    dist.destroy_process_group()


def mismatch(backend):
    """Rank 1 calls all_reduce with MAX while the others call SUM: everyone fails, naming both."""
    rank, world = init(backend, timeout_s=60)
    dist.barrier()
    start = time.monotonic()
    try:
        t = torch.ones(64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if rank == 1 else dist.ReduceOp.SUM)
    except RuntimeError as e:
        took = time.monotonic() - start
        print(f"rank {rank}: failed after {took:.2f} s: {type(e).__name__}: {e}", flush=True)
        assert took < 20, f"took {took:.1f} s against a 60 s timeout"
        # torch's own kind for a failed collective, so that scripts catching it see ours too.
        assert isinstance(e, dist.DistBackendError), f"{type(e)} is not DistBackendError"
        sys.exit(3)
    sys.exit(0)


def nccl_without_gpu(backend):
    """DTRAIN_BACKEND=nccl where no GPU is visible: init fails at once on every rank, with the
    text saying what it saw; the module's NCCL is the one torch was built with."""
    from dtrain import _build_info, _torch
    version = _torch.backend_version("nccl")
    # A build that has the nccl backend has it in the Python module too.
    assert (version or 0) == _build_info.NCCL_VERSION, (version, _build_info.NCCL_VERSION)
    if version:
        major, minor, patch = torch.cuda.nccl.version()
        assert version == major * 10000 + minor * 100 + patch, (version, torch.cuda.nccl.version())
    start = time.monotonic()
    try:
        init(backend, timeout_s=60)
        dist.all_reduce(torch.ones(4))
    except Exception as e:  # noqa: BLE001  the kind is checked below
        took = time.monotonic() - start
        text = f"{type(e).__name__}: {e}"
        print(f"rank {os.environ['RANK']}: failed after {took:.2f} s: {text}", flush=True)
        assert isinstance(e, dtrain.InvalidArgumentError), text
        assert took < 10, f"took {took:.1f} s against a 60 s timeout"
        if version:
            assert "backend nccl needs a CUDA device" in text, text
            assert "CUDA_VISIBLE_DEVICES" in text and "DTRAIN_BACKEND=native" in text, text
        else:
            assert "backend nccl is not built into this dtrain" in text, text
        sys.exit(3)
    sys.exit(0)


def ddp(backend, out_path, variant):
    """The same DDP training on `backend`; writes the losses and final weights to out_path."""
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = init(backend)
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.fc = nn.Linear(4 * 8 * 8, 10)
            if variant in ("unused", "all"):
                self.unused = nn.Linear(3, 3)  # never used in forward

        def forward(self, x):
            return self.fc(F.relu(self.bn(self.conv(x))).flatten(1))

    model = Net()
    # Each rank starts from different weights: DDP's construction broadcasts rank 0's.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(rank)
    kwargs = {"find_unused_parameters": True} if variant in ("unused", "all") else {}
    net = DDP(model, **kwargs)
    if variant in ("hook", "all"):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        net.register_comm_hook(None, default_hooks.fp16_compress_hook)
    if variant in ("int8", "int4", "bf16_wire", "fp16_wire"):
        from dtrain.torch import comm_hooks
        if variant == "int8":  # the first release's name of the state
            net.register_comm_hook(comm_hooks.Int8CompressState(), comm_hooks.int8_compress_hook)
        elif variant == "int4":
            net.register_comm_hook(comm_hooks.CompressState(), comm_hooks.int4_compress_hook)
        elif variant == "bf16_wire":
            net.register_comm_hook(comm_hooks.CompressState(), comm_hooks.bf16_compress_hook)
        else:  # torch's kind of state: the group, here None (the world), no error feedback
            net.register_comm_hook(None, comm_hooks.fp16_compress_hook)
    if variant == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                       start_powerSGD_iter=3, random_seed=0)
        net.register_comm_hook(state, powersgd.powerSGD_hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1234 + rank)
    losses = []
    opt.zero_grad()
    for step in range(12):
        x = torch.randn(16, 1, 8, 8, generator=g)
        y = torch.randint(0, 10, (16,), generator=g)
        if variant in ("no_sync", "all") and step % 2 == 0:
            with net.no_sync():  # accumulate locally; the next backward reduces both
                F.cross_entropy(net(x), y).backward()
            continue
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    state = {k: v.tolist() for k, v in net.module.state_dict().items()}
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"losses": losses, "state": state}, f)
    # Every rank holds the same weights (BatchNorm's running statistics differ: each forward
    # updates them from local data after DDP broadcast rank 0's).
    flat = torch.cat([p.detach().double().flatten() for p in net.module.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    for r in range(world):
        assert torch.equal(gathered[r], flat), f"rank {rank}: weights differ from rank {r}'s"
    dist.destroy_process_group()


def destroy_during_callback(backend):
    """Destroys the group while a Python callback chained on a collective's future still runs
    on the backend's thread (DDP's comm hooks end that way: the last bucket's callback is still
    being torn down when training returns). Destroying joins that thread, which needs the GIL
    to finish: the group must let go of it meanwhile, or the rank hangs."""
    import threading
    rank, world = init(backend)
    started = threading.Event()

    def callback(fut):
        started.set()
        time.sleep(0.5)  # lets go of the GIL: the main thread destroys the group meanwhile
        return fut.value()[0] * 2

    t = torch.full((4,), float(rank + 1))
    chained = dist.all_reduce(t, async_op=True).get_future().then(callback)
    assert started.wait(30), f"rank {rank}: the callback did not start within 30 s"
    began = time.monotonic()
    dist.destroy_process_group()  # joins the thread running `callback`
    took = time.monotonic() - began
    want = float(sum(range(1, world + 1))) * 2
    got = chained.wait()
    assert torch.equal(got, torch.full((4,), want)), f"rank {rank}: got {got.tolist()}, want {want}"
    print(f"rank {rank}: destroyed in {took:.2f} s while the callback ran")


def dropped_work(backend):
    """Rank 0 lets go of an asynchronous all_reduce's work and of its tensor before rank 1 has
    called it, then fills new tensors of that size: the backend must still reduce rank 0's
    values (the work keeps its tensors until it ends, as torch's NCCL keeps a work's until its
    watchdog sees the work end)."""
    rank, world = init(backend)
    n = 1 << 16
    if rank == 0:
        t = torch.full((n,), 1.0)
        dist.all_reduce(t, async_op=True)  # the work, dropped at once
        del t
        junk = [torch.full((n,), -1000.0) for _ in range(64)]  # where the freed memory goes
        time.sleep(2.0)
        del junk
    else:
        time.sleep(1.0)
        t = torch.full((n,), 2.0)
        dist.all_reduce(t)
        expect(t, torch.full((n,), 3.0), "the all_reduce whose work rank 0 let go of")
    dist.barrier()
    print(f"rank {rank}: dropped work checked")


def group_dropped_in_callback(backend):
    """A future's callback drops the last reference to its group, so that the group is destroyed
    on the backend's own thread (a hook's state holding the group does that). The thread cannot
    join itself: the group must let its threads finish on their own."""
    import threading
    rank, world = init(backend)
    group = dist.new_group(list(range(world)))
    if rank == 1:
        time.sleep(0.5)  # rank 0's future completes later, on the backend's thread
    t = torch.full((4,), float(rank + 1))
    work = dist.all_reduce(t, group=group, async_op=True)
    dist.destroy_process_group(group)  # torch forgets the group; `box` holds the last reference
    box = [group]
    del group
    where = []

    def callback(fut):
        where.append(threading.current_thread() is threading.main_thread())
        box.clear()  # destroys the group, here
        return fut.value()[0] + 1

    got = work.get_future().then(callback).wait()
    want = float(sum(range(1, world + 1))) + 1
    assert torch.equal(got, torch.full((4,), want)), f"rank {rank}: got {got.tolist()}, want {want}"
    if rank == 0:
        assert where == [False], f"rank 0: the callback ran on the main thread, not the backend's"
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: the group was destroyed in its callback")


def elastic_resume(backend, ckpt_dir):
    """Counts to 8 with an all_reduce per step, saving after each; rank 1 dies at step 3 of the
    first attempt. Under `dtrain run --max-restarts 1` the second attempt resumes from the
    checkpoint (torch's variables say which attempt this is) and ends with the right total."""
    rank, world = init(backend)
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    path = os.path.join(ckpt_dir, f"rank{rank}.pt")
    state = torch.load(path) if os.path.exists(path) else {"step": 0, "total": torch.zeros(1)}
    if attempt > 0:
        assert state["step"] > 0, f"rank {rank}: attempt {attempt} found no checkpoint"
    for step in range(state["step"], 8):
        t = torch.ones(1) * (step + 1)
        dist.all_reduce(t)
        state["total"] += t
        state["step"] = step + 1
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)
        if attempt == 0 and rank == 1 and step == 3:
            os._exit(17)
    want = world * sum(range(1, 9))
    assert float(state["total"]) == want, f"rank {rank}: total {float(state['total'])}, want {want}"
    print(f"rank {rank}: attempt {attempt} finished with total {float(state['total'])}", flush=True)
    dist.destroy_process_group()


def progress(backend, steps):
    """Reports steps to `dtrain run --metrics-port` through dtrain.torch.ProgressReporter: rank 1
    computes 30 ms longer per step, so rank 0 waits about that long in each all_reduce."""
    rank, world = init(backend)
    reporter = dtrain.torch.ProgressReporter(rank, interval=timedelta(milliseconds=100))
    assert reporter.active, "DTRAIN_PROGRESS_DIR is not set: not under dtrain run --metrics-port"
    reporter.step(0, 0)
    for step in range(1, int(steps) + 1):
        time.sleep(0.02 + (0.03 if rank == 1 else 0))
        dist.all_reduce(torch.ones(1))
        reporter.step(step, 16)
    dist.barrier()
    dist.destroy_process_group()


def both_apis(backend):
    """torch.distributed on backend `backend` and dtrain's own API (dtrain.init) in one process,
    each logging: both extension modules share one logger."""
    import numpy as np
    rank, world = init(backend)
    native = dtrain.init()
    t = torch.ones(3) * (rank + 1)
    dist.all_reduce(t)
    expect(t, torch.full((3,), float(sum(range(1, world + 1)))), "torch all_reduce")
    a = native.allreduce(np.full(3, rank + 1.0))
    assert a.tolist() == [float(sum(range(1, world + 1)))] * 3, a
    print(f"rank {rank}: both APIs checked", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
    if sys.argv[2:3] == ["gloo"]:
        # torch's gloo, the reference the tests compare with, can abort the process at exit:
        # while a group lives on after destroy_process_group (DDP holds it), a gloo worker
        # thread that drops the last reference to a Python tensor during interpreter
        # finalization asks for the GIL and is ended inside a destructor (seen on torch 2.15;
        # pytorch PR 179291). Its results are written by now: leave without finalizing.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
