"""The per-rank bodies of the Horovod-compatible API's tests: `python3 hvd_workers.py NAME [ARGS]`.

Each imports dtrain.torch as hvd (as a Horovod script would), runs under the variables
tests/python/harness.py or a launcher sets, checks every result against values computed locally
and exits 0; a mismatch raises, which exits non-zero with the traceback.
"""
import os
import signal
import sys
import time

# Set in a worker forked from a server that had imported torch (`dtrain run --preload torch`).
TORCH_BEFORE_THE_SCRIPT = "torch" in sys.modules

import torch  # noqa: E402

import dtrain.torch as hvd  # noqa: E402


def expect(got, want, what):
    want = torch.as_tensor(want).to(got.dtype)
    if got.dtype in (torch.float16, torch.bfloat16):
        ok = got.shape == want.shape and torch.allclose(got.double(), want.double(), rtol=1e-2)
    elif got.dtype.is_floating_point:
        ok = got.shape == want.shape and torch.allclose(got, want, rtol=1e-6, atol=1e-6)
    else:
        ok = torch.equal(got, want)
    if not ok:
        raise AssertionError(f"rank {hvd.rank()}: {what}: got {got.tolist()}, want {want.tolist()}")


def value(r, shape=(3, 4), dtype=torch.float32):
    """Rank r's tensor: small integers that every dtype holds exactly."""
    n = 1
    for d in shape:
        n *= d
    return ((torch.arange(n) % 7) + r + 1).reshape(shape).to(dtype)


def collectives():
    hvd.init()
    hvd.init()  # a second call does nothing
    r, n = hvd.rank(), hvd.size()
    assert hvd.is_initialized()
    assert n == int(os.environ.get("WORLD_SIZE", "1")), (n, os.environ.get("WORLD_SIZE"))
    assert hvd.local_rank() == r and hvd.local_size() == n, (hvd.local_rank(), hvd.local_size())
    assert hvd.cross_rank() == 0 and hvd.cross_size() == 1
    everyone = [value(q) for q in range(n)]
    total = sum(everyone)

    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16):
        mine = value(r, dtype=dtype)
        sums = sum(value(q, dtype=torch.float64) for q in range(n))
        expect(hvd.allreduce(mine, op=hvd.Sum), sums, f"allreduce Sum {dtype}")
        if dtype.is_floating_point:
            expect(hvd.allreduce(mine), sums / n, f"allreduce Average {dtype}")
        expect(hvd.allreduce(mine, op=hvd.Max), value(n - 1, dtype=dtype), f"Max {dtype}")
        expect(hvd.allreduce(mine, op=hvd.Min), value(0, dtype=dtype), f"Min {dtype}")
        expect(mine, value(r, dtype=dtype), f"allreduce leaves its input alone ({dtype})")
    product = torch.ones(3, 4, dtype=torch.float64)
    for q in range(n):
        product *= value(q, dtype=torch.float64)
    expect(hvd.allreduce(value(r, dtype=torch.float64), op=hvd.Product), product, "Product")
    expect(hvd.allreduce(value(r), average=False), total, "average=False (deprecated)")
    expect(hvd.allreduce(value(r), op=hvd.Sum, process_set=hvd.global_process_set), total,
           "the whole job's process set")
    expect(hvd.allreduce(value(r), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5),
           total, "pre- and postscale")
    expect(hvd.allreduce(value(r), compression=hvd.Compression.fp16), total / n, "fp16")

    t = value(r)
    assert hvd.allreduce_(t, op=hvd.Sum) is t
    expect(t, total, "allreduce_ in place")
    strided = value(r, (4, 3)).t()  # not contiguous
    hvd.allreduce_(strided, op=hvd.Sum)
    expect(strided, sum(value(q, (4, 3)) for q in range(n)).t(), "allreduce_ of a transposed view")

    # Asynchronous: out of order across ranks, matched by name.
    names = ["a", "b", "c", "d"]
    order = names[r % 4:] + names[:r % 4]
    handles = {}
    for k in order:
        handles[k] = hvd.allreduce_async(value(r, (5,)) * (names.index(k) + 1), name=k,
                                         op=hvd.Sum)
    for k in names:
        want = sum(value(q, (5,)) for q in range(n)) * (names.index(k) + 1)
        expect(hvd.synchronize(handles[k]), want, f"allreduce_async {k}")
    t = value(r, (6,))
    h = hvd.allreduce_async_(t, op=hvd.Average)
    while not hvd.poll(h):
        time.sleep(0.001)
    assert hvd.synchronize(h) is t
    expect(t, sum(value(q, (6,)) for q in range(n)) / n, "allreduce_async_ Average")
    try:
        hvd.synchronize(h)
        raise AssertionError("synchronize of a finished handle did not raise")
    except ValueError as e:
        assert "already synchronized" in str(e), e

    grouped = hvd.grouped_allreduce([value(r, (2,)), value(r, (3, 3), torch.float64)], op=hvd.Sum)
    expect(grouped[0], sum(value(q, (2,)) for q in range(n)), "grouped 0")
    expect(grouped[1], sum(value(q, (3, 3), torch.float64) for q in range(n)), "grouped 1")
    ts = [value(r, (2,)), value(r, (4,))]
    hvd.grouped_allreduce_(ts)
    expect(ts[1], sum(value(q, (4,)) for q in range(n)) / n, "grouped_allreduce_")

    # allgather: the first dimension differs by rank.
    got = hvd.allgather(value(r, (r + 1, 2)))
    expect(got, torch.cat([value(q, (q + 1, 2)) for q in range(n)]), "allgather")
    expect(hvd.synchronize(hvd.allgather_async(torch.tensor([r]))), torch.arange(n),
           "allgather_async")

    for root in range(n):
        expect(hvd.broadcast(value(r), root), value(root), f"broadcast from {root}")
        t = value(r, (7,), torch.int64)
        hvd.broadcast_(t, root)
        expect(t, value(root, (7,), torch.int64), f"broadcast_ from {root}")

    # alltoall: equal slices, then rank r sends q + 1 rows to rank q.
    rows = torch.arange(n * 2 * 3).reshape(n * 2, 3) + 100 * r
    want = torch.cat([(torch.arange(n * 2 * 3).reshape(n * 2, 3) + 100 * q)[2 * r:2 * r + 2]
                      for q in range(n)])
    expect(hvd.alltoall(rows), want, "alltoall")
    splits = [q + 1 for q in range(n)]
    mine = torch.arange(sum(splits)) + 1000 * r
    out, received = hvd.alltoall(mine, splits=splits)
    start = sum(splits[:r])
    expect(out, torch.cat([torch.arange(sum(splits))[start:start + r + 1] + 1000 * q
                           for q in range(n)]), "alltoall with splits")
    expect(received, [r + 1] * n, "alltoall received splits")

    # Gradients flow through allreduce, allgather and broadcast as in Horovod.
    x = value(r, (4,)).requires_grad_()
    (hvd.allreduce(x, op=hvd.Sum) * (r + 1)).sum().backward()
    expect(x.grad, torch.full((4,), float(sum(q + 1 for q in range(n)))), "grad of allreduce")
    x = value(r, (r + 1,)).requires_grad_()
    (hvd.allgather(x) * (hvd.size() + r)).sum().backward()  # the average over the ranks
    expect(x.grad, torch.full((r + 1,), n + (n - 1) / 2), "grad of allgather")
    x = value(r, (3,)).requires_grad_()
    (hvd.broadcast(x, 0) * (r + 1)).sum().backward()
    expect(x.grad, torch.full((3,), (n + 1) / 2 if r == 0 else 0.0), "grad of broadcast")

    assert hvd.broadcast_object({"from": r, "list": [r] * 3}, root_rank=n - 1) == \
        {"from": n - 1, "list": [n - 1] * 3}
    assert hvd.allgather_object(("rank", r, "x" * r)) == [("rank", q, "x" * q) for q in range(n)]

    torch.manual_seed(r)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    for p in model.parameters():
        torch.nn.init.normal_(p)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    for p in reference.parameters():
        torch.nn.init.normal_(p)
    for (k, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        expect(a, b, f"broadcast_parameters {k}")

    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1))
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == 0.01, opt.param_groups[0]["lr"]
    # Only the root has stepped: the others take its state, the weights as they were.
    momentum = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if r == 0:
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        momentum.step()
    weights = [p.detach().clone() for p in model.parameters()]
    hvd.broadcast_optimizer_state(momentum, root_rank=0)
    for p, w in zip(model.parameters(), weights):
        expect(p.detach(), w, "broadcast_optimizer_state leaves the weights")
        expect(momentum.state[p]["momentum_buffer"], torch.ones_like(p), "the root's momentum")

    hvd.barrier()
    hvd.shutdown()
    assert not hvd.is_initialized()
    hvd.init()  # again, after a shutdown
    expect(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)), "after re-init")
    hvd.shutdown()
    print(f"rank {r}: every collective checked")


def _data(q, step, batch=6):
    g = torch.Generator().manual_seed(1000 * q + step)
    return torch.randn(batch, 5, generator=g), torch.randn(batch, 2, generator=g)


def _model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _grads(model, q, steps):
    """The gradients rank q's batches give `model` (summed over `steps`)."""
    model.zero_grad()
    for step in steps:
        x, y = _data(q, step)
        torch.nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def optimizer(variant):
    """A DistributedOptimizer's steps equal plain SGD on the gradients combined locally."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    passes = 2 if variant == "accumulate" else 1
    kwargs = {}
    if variant == "sum":
        kwargs["op"] = hvd.Sum
    if variant == "fp16":
        kwargs["compression"] = hvd.Compression.fp16
    if variant == "predivide":
        kwargs["gradient_predivide_factor"] = 2.0
    model, reference = _model(), _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, **kwargs)
    assert isinstance(opt, torch.optim.SGD)
    steps = []
    if variant == "subclass":
        # A subclass of the class DistributedOptimizer made (as a library wrapping the step
        # does): the reduction and SGD's step still run once each per step.
        class Counted(type(opt)):
            def step(self, closure=None):
                steps.append(closure)
                return super().step(closure)

        opt.__class__ = Counted
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for step in range(4):
        opt.zero_grad()
        for k in range(passes):
            x, y = _data(r, step * passes + k)
            torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        # The same step, locally: every rank's gradients, combined as the op says.
        per_rank = [_grads(reference, q, range(step * passes, step * passes + passes))
                    for q in range(n)]
        combined = [sum(g) for g in zip(*per_rank)]
        if variant != "sum":
            combined = [g / n for g in combined]
        ref_opt.zero_grad()
        for p, g in zip(reference.parameters(), combined):
            p.grad = g
        ref_opt.step()
        tolerance = 2e-3 if variant == "fp16" else 1e-5
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            if not torch.allclose(p, q, rtol=tolerance, atol=tolerance):
                raise AssertionError(f"rank {r} step {step} {variant}: {name} differs by "
                                     f"{(p - q).abs().max().item()}")
    # Explicit synchronize, then step inside skip_synchronize (as for gradient clipping).
    x, y = _data(r, 99)
    torch.nn.functional.mse_loss(model(x), y).backward()
    if variant == "accumulate":
        torch.nn.functional.mse_loss(model(x), y).backward()
    try:
        opt.zero_grad()
        raise AssertionError("zero_grad() with reductions in flight did not raise")
    except AssertionError as e:
        assert "before optimizer.step() or optimizer.synchronize()" in str(e), e
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with opt.skip_synchronize():
        opt.step()
    opt.zero_grad()
    assert len(steps) == (5 if variant == "subclass" else 0), steps
    hvd.shutdown()
    print(f"rank {r}: optimizer {variant} matches the local computation")


def join():
    """Rank r has r + 1 batches; the ranks that ran out join and contribute zeros: the
    averages are over every rank, as in Horovod."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    model, reference = _model(), _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(n):
        if step <= r:
            opt.zero_grad()
            x, y = _data(r, step)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        per_rank = [_grads(reference, q, [step]) for q in range(step, n)]
        ref_opt.zero_grad()
        for p, g in zip(reference.parameters(), zip(*per_rank)):
            p.grad = sum(g) / n
        ref_opt.step()
        if step == r:  # out of data: wait for the others, contributing zeros
            last = hvd.join()
            assert last == n - 1, f"rank {r}: join() says {last} joined last, not {n - 1}"
    # Ranks that joined early stopped updating; they get the final model from the last rank.
    hvd.broadcast_parameters(model.state_dict(), root_rank=n - 1)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if not torch.allclose(p, q, rtol=1e-5, atol=1e-6):
            raise AssertionError(f"rank {r}: {name} differs by {(p - q).abs().max().item()}")
    hvd.shutdown()
    print(f"rank {r}: join checked")


def errors():
    """Wrong use fails with the cause in the text, on every rank, and nothing hangs."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for call, text in [
        (lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum), "Adasum is not implemented"),
        (lambda: hvd.allreduce(torch.ones(2), op=42), "unknown reduction op"),
        (lambda: hvd.allreduce(torch.ones(2), process_set=object()), "process sets are not"),
        (lambda: hvd.alltoall(torch.ones(n + 1)) if n > 1 else hvd.alltoall(torch.ones(2),
                                                                            splits=[1]),
         "alltoall"),
        (lambda: hvd.alltoall(torch.ones(n), splits=torch.ones(n)), "splits must hold integers"),
        (lambda: hvd.broadcast(torch.ones(2), root_rank=n), f"not a rank of this job of {n}"),
        (lambda: hvd.allreduce(torch.ones(2, device="meta")), "tensors on meta are not supported"),
        (lambda: hvd.DistributedOptimizer(torch.optim.SGD(_model().parameters(), lr=0.1),
                                          named_parameters=[("a", torch.nn.Parameter(
                                              torch.ones(1)))]),
         "are not in it"),
    ]:
        try:
            call()
        except (ValueError, NotImplementedError, RuntimeError) as e:
            assert text in str(e), f"expected {text!r} in: {e}"
        else:
            raise AssertionError(f"no error; expected {text!r}")
    if n > 1:
        # Shapes that differ under one name: every rank fails, naming the tensor and both shapes.
        try:
            hvd.synchronize(hvd.allreduce_async(torch.ones(2 + (r == 1)), name="shape"))
        except (ValueError, RuntimeError) as e:
            text = str(e)
            assert "'shape' differs between ranks" in text, text
            assert "rank 1 submitted 3 elements of f32" in text, text
            # Named after what the script called, not an optimizer it never made.
            assert "Horovod API: tensor 'shape'" in text and "DistributedOptimizer" not in text, text
        else:
            raise AssertionError("mismatched shapes did not fail")
    hvd.shutdown()  # also after the coordinator failed
    try:
        hvd.allreduce(torch.ones(2))
    except ValueError as e:
        assert "has not been initialized" in str(e), e
    else:
        raise AssertionError("allreduce after shutdown did not raise")
    print(f"rank {r}: every error checked")


def _raises(call, *texts):
    """The text of the error `call` raises; each of `texts` must be in it."""
    try:
        call()
    except (ValueError, RuntimeError) as e:
        for text in texts:
            assert text in str(e), f"rank {hvd.rank()}: expected {text!r} in: {e}"
        return str(e)
    raise AssertionError(f"rank {hvd.rank()}: no error; expected {texts}")


def negotiation():
    """As in Horovod, the ranks agree on every call before its data moves: calls that differ
    fail on every rank, naming each rank's call, and the session goes on."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    assert n >= 2

    def works():  # the session is still usable
        expect(hvd.allreduce(torch.ones(3), op=hvd.Sum), torch.full((3,), float(n)), "after")

    # Shapes, dtypes, roots, kinds that differ: the same error everywhere, then the next call.
    _raises(lambda: hvd.allreduce(torch.ones(2 + (r == 1)), op=hvd.Sum),
            "the ranks' calls differ, so none of them ran",
            "called allreduce of f32 [2] with sum", "rank 1 called allreduce of f32 [3] with sum")
    works()
    _raises(lambda: hvd.allgather(torch.ones(2, 3, dtype=torch.float64 if r == 1 else
                                             torch.float32)),
            "rank 1 called allgather of f64 [2, 3]")
    works()
    _raises(lambda: hvd.broadcast(torch.ones(2), root_rank=min(r, 1)),
            "rank 0 called broadcast of f32 [2] from rank 0",
            "called broadcast of f32 [2] from rank 1")
    works()
    _raises(lambda: hvd.allgather(torch.ones(2)) if r == 0 else hvd.barrier(),
            "rank 0 called allgather of f32 [2]", "called barrier()")
    works()
    # Arguments only rank 0 finds wrong: it says why, the others that it refused; none waits.
    if r == 0:
        _raises(lambda: hvd.alltoall(torch.ones(n), splits=[n + 1] + [0] * (n - 1)),
                "must be", "non-negative row counts")
    else:
        _raises(lambda: hvd.alltoall(torch.ones(n)), "rank 0 called alltoall",
                "refused its arguments")
    works()
    # A dtype dtrain cannot carry, on rank 0 only: the others fail too, none waits.
    if r == 0:
        _raises(lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64)), "cannot be")
    else:
        _raises(lambda: hvd.allreduce(torch.ones(2)), "refused its arguments")
    works()
    # Through the coordinator: a name submitted with other sizes fails alone.
    _raises(lambda: hvd.synchronize(hvd.allreduce_async(torch.ones(2 + (r == 1)), name="odd")),
            "tensor 'odd' differs between ranks", "the others go on")
    expect(hvd.synchronize(hvd.allreduce_async(torch.ones(4), name="odd", op=hvd.Sum)),
           torch.full((4,), float(n)), "the coordinator goes on")

    # int16, as every other integer type.
    short = value(r, (5,), torch.int16)
    expect(hvd.allreduce(short, op=hvd.Sum), sum(value(q, (5,)) for q in range(n)), "int16 sum")
    expect(hvd.allgather(short), torch.cat([value(q, (5,), torch.int16) for q in range(n)]),
           "int16 allgather")
    expect(hvd.broadcast(short, n - 1), value(n - 1, (5,), torch.int16), "int16 broadcast")

    # Horovod's scaling of integers: in double precision, truncated.
    got = hvd.allreduce(torch.full((3,), 7, dtype=torch.int32), op=hvd.Sum, prescale_factor=0.5)
    expect(got, torch.full((3,), 3 * n, dtype=torch.int32), "prescaled int32")

    # Asynchronous allgather, broadcast and alltoall run in call order on the session's thread.
    handles = [hvd.allgather_async(value(r, (2,), dtype), name=f"g{k}")
               for k, dtype in enumerate([torch.int8, torch.int16, torch.float64])]
    # A name in flight cannot be submitted again. A call stays in flight until every rank has
    # submitted it, so each rank checks on a name the last rank (or, there, the others) has not
    # submitted yet, and a synchronous call that every rank has submitted runs in between.
    last = r == n - 1
    mine, theirs = ("dup_last", "dup_rest") if last else ("dup_rest", "dup_last")
    held = hvd.allgather_async(torch.ones(1), name=mine)
    _raises(lambda: hvd.allgather_async(torch.ones(1), name=mine), f"'{mine}' submitted again")
    works()
    held = [held, hvd.allgather_async(torch.ones(1), name=theirs)]
    for h in held:
        expect(hvd.synchronize(h), torch.ones(n), "a name held in flight")
    b = value(r, (3,))
    hb = hvd.broadcast_async_(b, 0)
    ha = hvd.alltoall_async(torch.arange(2 * n) + 10 * r, splits=[2] * n)
    for k, (h, dtype) in enumerate(zip(handles, [torch.int8, torch.int16, torch.float64])):
        expect(hvd.synchronize(h), torch.cat([value(q, (2,), dtype) for q in range(n)]),
               f"allgather_async {dtype}")
    assert hvd.synchronize(hb) is b
    expect(b, value(0, (3,)), "broadcast_async_")
    out, received = hvd.synchronize(ha)
    expect(out, torch.cat([torch.arange(2 * r, 2 * r + 2) + 10 * q for q in range(n)]),
           "alltoall_async")
    expect(received, [2] * n, "alltoall_async received")
    gathered = hvd.grouped_allgather([value(r, (1,)), value(r, (r + 1, 2), torch.int64)])
    expect(gathered[1], torch.cat([value(q, (q + 1, 2), torch.int64) for q in range(n)]),
           "grouped_allgather")

    # Sparse all-reduce (gathered indices and values), against the dense sum.
    dense = torch.zeros(6, 2)
    dense[r % 6] = r + 1.0
    dense[5] = 1.0
    result = hvd.sparse_allreduce_async(dense.to_sparse(), name="emb", op=hvd.Sum)()
    want = torch.zeros(6, 2)
    for q in range(n):
        want[q % 6] += q + 1.0
    want[5] += n
    expect(result.to_dense(), want, "sparse_allreduce_async")

    # grouped_allreduce is differentiable.
    xs = [torch.ones(3, requires_grad=True), torch.ones(2, requires_grad=True)]
    for out in hvd.grouped_allreduce(xs, op=hvd.Sum):
        out.backward(torch.ones_like(out))
    for x in xs:
        expect(x.grad, torch.full(x.shape, float(n)), "grad of grouped_allreduce")

    for built in (hvd.ccl_built, hvd.ddl_built, hvd.rocm_built, hvd.mpi_built, hvd.gloo_built):
        assert built() is False, built
    # What the build found (test_backend.py checks what DTRAIN_BACKEND=nccl then does).
    from dtrain import _build_info
    assert hvd.nccl_built() == _build_info.NCCL_VERSION, hvd.nccl_built()
    assert hvd.cuda_built() is _build_info.CUDA, hvd.cuda_built()
    hvd.shutdown()
    print(f"rank {r}: negotiation checked")


def joined_calls():
    """Rank 0 joins at once: the others' blocking all-reduces take its zeros (an average over
    every rank, as Horovod's), their allgather fails naming the joined rank; then they join."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    if r == 0:
        last = hvd.join()
    else:
        expect(hvd.allreduce(torch.full((4,), float(r)), op=hvd.Sum),
               torch.full((4,), float(sum(range(1, n)))), "sum with rank 0 joined")
        expect(hvd.allreduce(torch.full((4,), float(r))),
               torch.full((4,), sum(range(1, n)) / n), "average with rank 0's zeros")
        _raises(lambda: hvd.allgather(torch.ones(2)), "cannot run while ranks [0] have joined")
        last = hvd.join()
    assert last != 0, f"rank {r}: join() says rank 0 joined last"
    assert hvd.allgather_object(last) == [last] * n
    hvd.shutdown()
    print(f"rank {r}: joined calls checked")


def sparse_optimizer():
    """An embedding's sparse gradients through the DistributedOptimizer: the step SparseAdam
    takes on the average over the ranks; broadcast_optimizer_state makes the state first."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    model = torch.nn.Embedding(10, 3, sparse=True)
    reference = torch.nn.Embedding(10, 3, sparse=True)
    reference.load_state_dict(model.state_dict())
    inputs = [torch.tensor([[1, 2, 4], [4, 3 + q, 9]]) for q in range(n)]
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(model.parameters()), lr=0.1),
                                   named_parameters=model.named_parameters())
    assert set(opt._parameter_names.values()) == {"weight"}, opt._parameter_names
    before = model.weight.detach().clone()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    expect(model.weight.detach(), before, "broadcast_optimizer_state leaves the weights")
    assert model.weight.grad is not None, "no zero gradient made"
    model(inputs[r]).sum().backward()
    opt.step()
    ref_opt = torch.optim.SparseAdam(list(reference.parameters()), lr=0.1)
    # As broadcast_optimizer_state made the state: a step on zeros, the weights kept.
    reference.weight.grad = torch.zeros_like(reference.weight).to_sparse()
    ref_opt.step()
    reference.weight.data.copy_(before)
    grads = []
    for q in range(n):
        reference.zero_grad()
        reference(inputs[q]).sum().backward()
        grads.append(reference.weight.grad.to_dense())
    reference.weight.grad = (sum(grads) / n).to_sparse()
    ref_opt.step()
    expect(model.weight.detach(), reference.weight.detach(), "SparseAdam on the average")
    hvd.shutdown()
    print(f"rank {r}: sparse optimizer checked")


def stall():
    """Each rank waits for a tensor no other rank submits: after the stall timeout
    (DTRAIN_STALL_TIMEOUT) every rank fails with an error naming a tensor and the ranks."""
    hvd.init()
    r = hvd.rank()
    try:
        hvd.synchronize(hvd.allreduce_async(torch.ones(3), name=f"only.on.rank{r}"))
    except RuntimeError as e:
        text = str(e)
    else:
        raise AssertionError("no error")
    assert ("'only.on.rank0'" in text and "missing on ranks [1]" in text) or \
        ("'only.on.rank1'" in text and "missing on ranks [0]" in text), text
    print(f"rank {r}: stall named: {text.splitlines()[0]}")
    hvd.shutdown()


def elastic(out, crash_step):
    """hvd.elastic under `dtrain run`: 12 steps of a DistributedOptimizer over the batches of an
    ElasticSampler, a commit after each; in the first round rank 1 dies after step `crash_step`
    (0: never). Rank 0 saves the final weights to `out`."""
    crash_step = int(crash_step)
    hvd.init()
    r = hvd.rank()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    x, y = live_dataset()
    sampler = hvd.elastic.ElasticSampler(LIVE_SAMPLES, shuffle=True, seed=5)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, step=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(state.step)])

    @hvd.elastic.run
    def train(state):
        # A restarted job's sampler deals the rest of the epoch: the batches go on where the
        # commit left them.
        batches = live_batches(list(state.sampler))
        for k, batch in enumerate(batches):
            if state.step == 12:
                break
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
            opt.step()
            state.sampler.record_batch(k, LIVE_BATCH)
            state.step += 1
            state.commit()
            if state.step == crash_step and r == 1 and \
                    os.environ.get("DTRAIN_RESTART_COUNT", "0") == "0":
                os._exit(3)

    train(state)
    if os.environ.get("DTRAIN_RESTART_COUNT", "0") != "0":
        assert resets and 1 <= resets[0] <= 12, f"rank {r}: reset callbacks saw {resets}"
    if r == 0:
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, out)
    print(f"rank {r}: elastic training finished at step {state.step} (resets {resets})",
          flush=True)
    hvd.shutdown()


LIVE_SAMPLES = 90  # the live worker's dataset
LIVE_BATCH = 3     # per rank and step


def _thread_policies():
    """The CPU scheduling policies of this process's threads, by name ("idle", "other")."""
    names = {os.SCHED_OTHER: "other", os.SCHED_IDLE: "idle", os.SCHED_BATCH: "batch"}
    policies = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            policies.add(names.get(os.sched_getscheduler(int(tid)), "?"))
        except ProcessLookupError:
            pass  # a thread that ended after the listing
    return sorted(policies)


def live_dataset():
    """The live worker's samples: inputs of _model's width and their targets."""
    g = torch.Generator().manual_seed(11)
    return torch.randn(LIVE_SAMPLES, 5, generator=g), torch.randn(LIVE_SAMPLES, 2, generator=g)


def live_batches(indices):
    """The batches a rank trains from its share of the epoch, in order."""
    return [indices[i:i + LIVE_BATCH] for i in range(0, len(indices), LIVE_BATCH)]


def _wait_for_the_spare(out):
    """With HVD_TEST_SPARE_FIRST=1 the test is of a spare that is ready when a rank dies: the
    rank waits for its word, which a slow machine could otherwise put after the death."""
    if os.environ.get("HVD_TEST_SPARE_FIRST") != "1":
        return
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(out, "spare.ready")) and time.monotonic() < deadline:
        time.sleep(0.05)


def live_elastic(out, die_rank, die_after, step_ms="0", late_rank="-1", late_ms="0",
                 metric="0"):
    """hvd.elastic under `dtrain run --live`: one epoch of LIVE_SAMPLES through an
    ElasticSampler and a DistributedOptimizer, a commit after every step; rank `die_rank` (at
    start) SIGKILLs itself after its commit of step `die_after` (its replacement, under
    --replace, does not). Each rank writes, with each commit, "step S generation G samples i,j,k
    padding a,b,c" to out/samples.R (R: its rank at start; a replacement's: out/samples.Rr), and
    at the end its weights to out/weights.R. Each step lasts at least `step_ms`. Rank
    `late_rank` (at start) waits `late_ms` after the first failure before it recovers, as a rank
    stopped or cut off meanwhile would. With `metric` "1" every step all-reduces its loss after
    the optimizer step, and rank `die_rank` dies just before that in step `die_after` + 1: every
    survivor then fails having changed its state since its commit."""
    die_rank, die_after, step_s = int(die_rank), int(die_after), float(step_ms) / 1000
    metric = metric == "1"
    from dtrain.torch import live
    late_rank, late_s = int(late_rank), float(late_ms) / 1000
    hvd.init()
    replacement = os.environ.get("DTRAIN_LIVE_REPLACEMENT") == "1"
    if live.spare():  # no rank yet: the launcher gives it one when a worker dies
        print(f"spare {live.spare()}: in the world after init(): "
              f"{torch.distributed.is_initialized()}", flush=True)
    elif replacement:  # it asks to be taken in once it needs the world, not in init()
        print(f"rank {os.environ['RANK']} at start, a replacement: in the world after init(): "
              f"{torch.distributed.is_initialized()}, torch imported before the script: "
              f"{TORCH_BEFORE_THE_SCRIPT}", flush=True)
    x, y = live_dataset()
    model = _model()
    if live.spare():
        print(f"spare {live.spare()}: built its model, in the world: "
              f"{torch.distributed.is_initialized()}, torch imported before the script: "
              f"{TORCH_BEFORE_THE_SCRIPT}", flush=True)
        print(f"spare {live.spare()}: its threads' CPU policies while it waits: "
              f"{_thread_policies()}", flush=True)
        open(os.path.join(out, "spare.ready"), "w").close()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    me = int(os.environ["RANK"])  # a spare's place is known once it is in the world
    if live.spare():
        print(f"spare {live.spare()}: now rank {me} at start, local rank {hvd.local_rank()}, "
              f"rank {hvd.rank()} of {hvd.size()}", flush=True)
        print(f"spare {live.spare()}: its threads' CPU policies in its place: "
              f"{_thread_policies()}", flush=True)
    late = [me == late_rank]  # still to wait
    sampler = hvd.elastic.ElasticSampler(LIVE_SAMPLES, shuffle=True, seed=3)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, step=0)
    log = open(os.path.join(out, f"samples.{me}{'r' if replacement else ''}"), "w")

    def reset():
        # What Horovod's elastic examples do to the rate here, as they would with lr 0.3.
        batch, lr = live.step_shape("scale-lr", LIVE_BATCH, 0.3)
        print(f"rank {me} at start: reset at step {state.step}, now rank {hvd.rank()} of "
              f"{hvd.size()} (scale-lr: batch {batch}, lr {lr:g})", flush=True)
    state.register_reset_callbacks([reset])

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, 1):
            mine = list(state.sampler)
            for k, batch in enumerate(live_batches(mine)):
                time.sleep(step_s)  # long enough steps for a replacement to start
                try:
                    opt.zero_grad()
                    torch.nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
                    opt.step()
                    if metric:
                        if me == die_rank and state.step == die_after and not replacement:
                            os.kill(os.getpid(), signal.SIGKILL)
                        hvd.allreduce(torch.ones(1), name="metric")
                except Exception:
                    if late[0]:
                        late[0] = False
                        time.sleep(late_s)
                    raise
                state.sampler.record_batch(k, LIVE_BATCH)
                state.step += 1
                # Logged before the commit, whose save keeps the step even when it then takes in
                # a replacement (HostsUpdatedInterrupt) or a peer dies in its look for one.
                first = k * LIVE_BATCH
                padding = [i for j, i in enumerate(batch) if state.sampler.is_padding(first + j)]
                log.write(f"step {state.step} generation {live.generation()} samples "
                          f"{','.join(map(str, batch))} padding {','.join(map(str, padding))}\n")
                log.flush()
                state.commit()
                if me == die_rank and state.step == die_after and not replacement and not metric:
                    _wait_for_the_spare(out)
                    os.kill(os.getpid(), signal.SIGKILL)
            state.sampler.set_epoch(state.epoch + 1)

    train(state)
    torch.save({k: v.clone() for k, v in model.state_dict().items()},
               os.path.join(out, f"weights.{me}"))
    print(f"rank {me} at start: live training finished at step {state.step} as rank "
          f"{hvd.rank()} of {hvd.size()}", flush=True)
    hvd.shutdown()


def interrupted(kind):
    """Rank 0 waits in a blocking allreduce (kind "blocking") or for an asynchronous one
    ("async") that rank 1 never joins; the test sends rank 0 SIGINT."""
    hvd.init()
    if hvd.rank() == 0:
        print("waiting", flush=True)
        try:
            if kind == "blocking":
                hvd.allreduce(torch.ones(4))
            else:
                hvd.synchronize(hvd.allreduce_async(torch.ones(4), name="never"))
        except KeyboardInterrupt as e:
            if kind == "blocking":
                assert "interrupted by Ctrl-C while waiting for allreduce" in str(e), str(e)
            print(f"interrupted: {e}", flush=True)
            os._exit(0)
        raise AssertionError("the wait returned")
    time.sleep(20)
    os._exit(0)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
