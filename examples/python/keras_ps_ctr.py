"""A Keras click-through-rate model trained against dtrain's parameter servers: the Keras
rendition of examples/python/ctr_sparse.py (the same generated data and the same model).

    dtrain run --servers 2 -n 2 -- python3 examples/python/keras_ps_ctr.py --steps 300

The embedding rows live on the servers (dtrain.tensorflow.ps.Embedding: each step pulls the rows
of its batch and pushes their gradients); the dense part is a Keras layer whose variables the
servers keep and update (ServerOptimizer). The servers run Adagrad, asynchronously by default
(--ps-mode sync, bounded). Worker 0 ends with the held-out log loss beside the generating model's
(the best possible) and a constant predictor's:
    RESULT {"test_logloss": ..., "generating_logloss": ..., "constant_logloss": ...}
"""
import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import dtrain.tensorflow.ps as ps  # noqa: E402
from ctr_sparse import DENSE, World, logloss  # noqa: E402  (beside this file)


def ctr_model(fields, dim, table):
    """logit = (sum of the ids' rows) . u + x . v + b, as ctr_sparse.py's."""
    ids = keras.Input((fields,), dtype="int64", name="ids")
    x = keras.Input((DENSE,), name="x")
    rows = ps.Embedding("embedding", dim, name="embedding", **table)(ids)
    summed = keras.layers.Lambda(lambda r: keras.ops.sum(r, axis=1))(rows)
    logit = keras.layers.Add()([keras.layers.Dense(1, name="u")(summed),
                                keras.layers.Dense(1, use_bias=False, name="v")(x)])
    return keras.Model([ids, x], logit)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="steps per worker")
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

    worker = int(os.environ.get("RANK", "0"))
    world = World(args.fields, args.vocab, args.zipf, args.seed)
    consistency = dict(consistency=args.ps_mode, staleness=args.staleness)
    keras.utils.set_random_seed(args.seed)  # the dense part: the first worker's values win
    model = ctr_model(args.fields, args.dim,
                      dict(init="normal", a=0.0, b=0.1, seed=42, optimizer="adagrad", lr=args.lr,
                           optimizer_options={"initial_accumulator": 0.1}, **consistency))
    model.compile(optimizer=ps.ServerOptimizer("adagrad", lr=args.lr, initial_accumulator=0.1,
                                               **consistency),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True))
    rng = np.random.default_rng(args.seed * 1000 + 17 + worker)
    ids, x, y, _ = world.draw(rng, args.steps * args.batch_size)
    start = time.monotonic()
    history = model.fit({"ids": ids.astype(np.int64), "x": x}, y, batch_size=args.batch_size,
                        epochs=1, shuffle=False, verbose=2 if worker == 0 else 0)
    rate = args.steps * args.batch_size / (time.monotonic() - start)

    if worker == 0:
        ids, x, y, true_logit = world.draw(np.random.default_rng(999_999), args.eval)
        z = model.predict({"ids": ids.astype(np.int64), "x": x}, batch_size=4096,
                          verbose=0).ravel()
        result = {"test_logloss": logloss(1 / (1 + np.exp(-z)), y),
                  "generating_logloss": logloss(1 / (1 + np.exp(-true_logit)), y),
                  "constant_logloss": logloss(np.full_like(y, y.mean()), y),
                  "train_logloss": float(history.history["loss"][-1]),
                  "samples_per_sec": round(rate, 1), "steps": args.steps, "mode": args.ps_mode}
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
