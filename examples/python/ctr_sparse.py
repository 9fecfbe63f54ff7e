"""A click-through-rate model trained through the parameter server, from Python (NumPy only):
the Python rendition of examples/ctr_sparse.cc.

    dtrain run --servers 2 -n 2 -- python3 examples/python/ctr_sparse.py --steps 600

Data come from a known model, so the example can say how close training gets to the truth:
each sample has --fields categorical ids (Zipf-distributed over --vocab values per field) and 4
dense features; the generating model gives every id a hidden weight ~ N(0, 0.7) and the label is
Bernoulli(sigmoid(sum of the ids' weights + v.x - 1)). The learned model keeps an embedding row
per id in a sparse table (created on first touch) and a dense part [u, v, b] in a dense table:
logit = sum over fields of e(id).u + v.x + b. The servers run Adagrad. At the end worker 0
prints, on held-out samples, the learned model's log loss beside the generating model's (the best
possible) and a constant predictor's:
    RESULT {"test_logloss": ..., "generating_logloss": ..., "constant_logloss": ...}
"""
import argparse
import json
import time

import numpy as np

import dtrain.ps

DENSE = 4


def mix(x):
    """SplitMix64's finaliser, on uint64 arrays (wrapping arithmetic)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class World:
    """The generating model and a sampler of its data."""

    def __init__(self, fields, vocab, zipf, seed):
        self.fields, self.seed = fields, np.uint64(seed)
        weights = 1.0 / np.power(np.arange(1, vocab + 1), zipf)
        self.cdf = np.cumsum(weights) / weights.sum()
        self.v = np.random.default_rng(seed).standard_normal(DENSE)

    def weight(self, ids):
        h = mix(ids ^ self.seed)
        u1 = ((h >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0 ** -53
        u2 = (mix(h) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
        return 0.7 * np.sqrt(-2.0 * np.log(u1)) * np.cos(2 * np.pi * u2)

    def draw(self, rng, n):
        values = np.searchsorted(self.cdf, rng.random((n, self.fields))).astype(np.uint64)
        ids = (np.arange(self.fields, dtype=np.uint64) << np.uint64(48)) | values
        x = rng.standard_normal((n, DENSE)).astype(np.float32)
        logit = -1.0 + self.weight(ids).sum(1) + x @ self.v
        y = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        return ids, x, y, logit


def logloss(p, y):
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(np.mean(-(y * np.log(p) + (1 - y) * np.log(1 - p))))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600, help="steps per worker")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--fields", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=200_000)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.05, help="Adagrad learning rate")
    parser.add_argument("--eval", type=int, default=20_000, help="held-out samples (worker 0)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ps-mode", choices=["sync", "async", "bounded"], default="async")
    parser.add_argument("--staleness", type=int, default=2)
    args = parser.parse_args()

    client = dtrain.ps.Client()
    worker = client.worker
    world = World(args.fields, args.vocab, args.zipf, args.seed)
    table = dict(optimizer="adagrad", lr=args.lr, initial_accumulator=0.1,
                 consistency=args.ps_mode, staleness=args.staleness)
    dim = args.dim
    client.create_sparse("embedding", width=dim, init="normal", a=0.0, b=0.1, seed=42, **table)
    dense = np.zeros(dim + DENSE + 1, np.float32)  # u, v, b
    dense[:dim] = 0.1
    client.create_dense("dense", dense, **table)

    def forward(ids, x, rows, inverse):
        e = rows[inverse].reshape(len(ids), args.fields, dim).sum(1)  # sum of the ids' rows
        u, v, b = dense[:dim], dense[dim:dim + DENSE], dense[-1]
        return e, e @ u + x @ v + b

    rng = np.random.default_rng(args.seed * 1000 + 17 + worker)
    start, recent = time.monotonic(), []
    for step in range(1, args.steps + 1):
        ids, x, y, _ = world.draw(rng, args.batch_size)
        unique, inverse = np.unique(ids.ravel(), return_inverse=True)
        rows = np.empty((len(unique), dim), np.float32)
        pulled = [client.pull_rows("embedding", unique, rows), client.pull("dense", dense)]
        for h in pulled:
            h.wait()
        e, z = forward(ids, x, rows, inverse)
        p = 1.0 / (1.0 + np.exp(-z))
        recent.append(logloss(p, y))
        dz = ((p - y) / args.batch_size).astype(np.float32)
        row_grads = np.zeros_like(rows)
        np.add.at(row_grads, inverse, np.repeat(np.outer(dz, dense[:dim]), args.fields, axis=0))
        dense_grad = np.concatenate([dz @ e, dz @ x, [dz.sum()]]).astype(np.float32)
        pushed = [client.push_rows("embedding", unique, row_grads),
                  client.push("dense", dense_grad)]
        for h in pushed:
            h.wait()
        if worker == 0 and step % 100 == 0:
            rate = step * args.batch_size / (time.monotonic() - start)
            print(f"step {step}/{args.steps} logloss {np.mean(recent[-100:]):.4f} "
                  f"samples/s {rate:.0f}", flush=True)

    if worker == 0:
        ids, x, y, true_logit = world.draw(np.random.default_rng(999_999), args.eval)
        unique, inverse = np.unique(ids.ravel(), return_inverse=True)
        rows = np.empty((len(unique), dim), np.float32)
        client.pull_rows("embedding", unique, rows).wait()
        client.pull("dense", dense).wait()
        _, z = forward(ids, x, rows, inverse)
        result = {"test_logloss": logloss(1 / (1 + np.exp(-z)), y),
                  "generating_logloss": logloss(1 / (1 + np.exp(-true_logit)), y),
                  "constant_logloss": logloss(np.full_like(y, y.mean()), y),
                  "steps": args.steps, "mode": args.ps_mode}
        print("RESULT " + json.dumps(result), flush=True)
    client.close()


if __name__ == "__main__":
    main()
