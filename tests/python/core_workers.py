"""The per-rank bodies of the tests of dtrain without torch (NumPy arrays) and of the parameter
server from Python: `python3 core_workers.py NAME [ARGS]`. Each checks its results against values
computed locally and exits 0; a mismatch raises, which exits non-zero with the traceback.

`no_torch` runs with torch made unimportable, as on a machine without it."""
import os
import sys
import time


class _NoTorch:
    """A meta-path finder under which `import torch` fails, as if torch were not installed."""
    attempts = []

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            self.attempts.append(name)
            raise ImportError(f"No module named {name!r} (hidden by the test)")
        return None


if len(sys.argv) > 1 and sys.argv[1] == "no_torch":
    sys.meta_path.insert(0, _NoTorch())

import numpy as np  # noqa: E402

import dtrain  # noqa: E402

DTYPES = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64]


def value(r, n, dtype):
    """Rank r's array: small integers every dtype holds exactly, reduced without overflow."""
    return ((np.arange(n) % 5) + r + 1).astype(dtype)


def expect(got, want, what):
    want = np.asarray(want).astype(got.dtype)
    if got.shape != want.shape or not np.array_equal(got, want):
        raise AssertionError(f"{what}: got {got.tolist()[:12]}, want {want.tolist()[:12]}")


def collectives():
    pg = dtrain.init(timeout=60)
    r, n = pg.rank, pg.size
    assert n == int(os.environ.get("WORLD_SIZE", "1"))
    for dtype in DTYPES:
        vals = [value(q, 10, dtype).astype(np.int64) for q in range(n)]
        for op, want in [("sum", sum(vals)), ("max", np.max(vals, axis=0)),
                         ("min", np.min(vals, axis=0))]:
            x = value(r, 10, dtype)
            assert pg.allreduce(x, op=op) is x
            expect(x, want, f"allreduce {op} {np.dtype(dtype).name}")
        x = value(r, 10, dtype)
        pg.broadcast(x, root=n - 1)
        expect(x, vals[n - 1], f"broadcast {np.dtype(dtype).name}")
        expect(pg.allgather(value(r, 3, dtype)), np.concatenate([value(q, 3, dtype)
                                                                 for q in range(n)]), "allgather")
    x = value(r, 8, np.float64).reshape(2, 4)  # any shape; C-contiguous
    pg.allreduce(x, op="avg")
    expect(x, (sum(value(q, 8, np.float64) for q in range(n)) / n).reshape(2, 4), "avg 2-D")
    x = value(r, 6, np.int32)
    pg.reduce(x, root=0)
    if r == 0:
        expect(x, sum(value(q, 6, np.int32) for q in range(n)), "reduce")
    full = np.concatenate([value(q, 2 * n, np.float32) for q in range(n)]).reshape(n, 2 * n)
    got = pg.reduce_scatter(value(r, 2 * n, np.float32))
    expect(got, full.sum(0)[2 * r:2 * r + 2], "reduce_scatter")
    send = np.arange(n * 3, dtype=np.int64) + 100 * r
    expect(pg.alltoall(send), np.concatenate([np.arange(3 * r, 3 * r + 3) + 100 * q
                                              for q in range(n)]), "alltoall")
    gathered = pg.gather(value(r, 4, np.int32), root=0)
    if r == 0:
        expect(gathered, np.concatenate([value(q, 4, np.int32) for q in range(n)]), "gather")
    else:
        assert gathered is None
    out = np.zeros(3, np.float32)
    pg.scatter(out, np.arange(3 * n, dtype=np.float32) if r == 0 else None, root=0)
    expect(out, np.arange(3 * r, 3 * r + 3), "scatter")
    pg.barrier()

    if n > 1:  # point to point: a ring, blocking and not
        right, left = (r + 1) % n, (r - 1) % n
        got = np.zeros(5, np.float32)
        w = pg.irecv(got, src=left, tag=7)
        pg.send(np.full(5, r, np.float32), dst=right, tag=7)
        w.wait(timeout=30)
        expect(got, np.full(5, left), "ring")
        if r == 0:
            senders = set()
            for _ in range(n - 1):
                buf = np.zeros(1, np.int64)
                src = pg.recv(buf, tag=9)
                expect(buf, [src], "recv from any: the sender sent its rank")
                senders.add(src)
            assert senders == set(range(1, n)), senders
        else:
            pg.isend(np.array([r], np.int64), dst=0, tag=9).wait()
        sub = pg.new_group(list(range(n - 1, -1, -2)))
        if r % 2 == (n - 1) % 2:
            x = np.array([r], np.int32)
            sub.allreduce(x)
            expect(x, [sum(range(n - 1, -1, -2))], "sub-group allreduce")
        else:
            assert sub is None

    for call, kind, text in [
        (lambda: pg.allreduce(np.zeros((4, 4), np.float32)[:, 1]), dtrain.InvalidArgumentError,
         "not C-contiguous"),
        (lambda: pg.allreduce(np.zeros(3, np.complex64)), ValueError, "cannot be communicated"),
        (lambda: pg.allreduce(np.zeros(3, np.float32), op="median"), ValueError, "median"),
        (lambda: pg.allreduce(b"read-only bytes"), dtrain.InvalidArgumentError, "allreduce"),
    ]:
        try:
            call()
        except kind as e:
            assert text in str(e), f"expected {text!r} in {e}"
        else:
            raise AssertionError(f"no {kind.__name__} for {text!r}")
    print(f"rank {r}: every collective checked")


def no_torch():
    collectives()
    assert not any(k == "torch" or k.startswith("torch.") for k in sys.modules), \
        [k for k in sys.modules if k.startswith("torch")]
    assert not _NoTorch.attempts, f"dtrain tried to import {_NoTorch.attempts}"
    print("dtrain worked without torch")


def interrupted():
    """Rank 0 waits for a message that never comes; the test sends it SIGINT."""
    pg = dtrain.init(timeout=120)
    if pg.rank == 0:
        print("waiting", flush=True)
        start = time.monotonic()
        try:
            pg.recv(np.zeros(4, np.float32), src=1, tag=3)
        except KeyboardInterrupt as e:
            text = str(e)
            assert "interrupted by Ctrl-C while waiting for recv of 4 f32" in text, text
            assert "from rank 1" in text, text
            print(f"interrupted after {time.monotonic() - start:.1f} s: {text}", flush=True)
            os._exit(0)
        raise AssertionError("recv returned")
    time.sleep(20)
    os._exit(0)


def _torch_or_numpy(kind, shape, dtype="float32"):
    if kind == "torch":
        import torch
        return torch.zeros(shape, dtype=getattr(torch, dtype))
    return np.zeros(shape, dtype)


def ps(kind="numpy"):
    """Under `dtrain run --servers 1 -n 2`: sync and async dense tables and a sparse table,
    against values computed locally."""
    import dtrain.ps
    pg = dtrain.init(timeout=60)  # the workers' own group, to line them up
    client = dtrain.ps.Client()
    me, n = client.worker, pg.size
    assert me == pg.rank and client.num_servers == 1

    w = _torch_or_numpy(kind, 6)
    client.create_dense("sync", w, optimizer="sgd", lr=0.5)
    mean = sum(q + 1 for q in range(n)) / n
    for step in range(1, 4):
        grad = _torch_or_numpy(kind, 6)
        grad += me + 1
        client.push_pull("sync", grad, w).wait(timeout=30)
        expect(np.asarray(w), np.full(6, -0.5 * mean * step), f"sync step {step}")

    a = _torch_or_numpy(kind, 3)
    client.create_dense("async", a, optimizer="sum", consistency="async")
    for _ in range(5):
        one = _torch_or_numpy(kind, 3)
        one += 1
        client.push("async", one).wait()
    pg.barrier()  # every worker's pushes were applied
    client.pull("async", a).wait()
    expect(np.asarray(a), np.full(3, 5.0 * n), "async sum")

    client.create_sparse("emb", width=2, optimizer="sgd", lr=1.0)
    ids = np.array([7, 2**40 + 1], np.uint64)
    rows = np.zeros((2, 2), np.float32)
    grads = np.full((2, 2), me + 1.0, np.float32)
    client.push_rows("emb", ids, grads).wait()
    h = client.pull_rows("emb", ids, rows)
    while not h.done():
        time.sleep(0.001)
    h.wait()
    expect(rows, np.full((2, 2), -mean), "sparse rows")

    try:
        client.pull("no-such-table", np.zeros(2, np.float32)).wait(timeout=10)
    except dtrain.InvalidArgumentError as e:
        assert "no-such-table" in str(e), e
    else:
        raise AssertionError("pull of an unknown table did not raise")
    pg.barrier()
    client.close()
    print(f"worker {me}: parameter server checked ({kind})")


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
