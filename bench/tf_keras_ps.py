"""Keras training against dtrain's parameter servers beside TensorFlow's own
ParameterServerStrategy, on the same click-through-rate model and data, in one run of alternating
rounds (docs/performance.md).

    /opt/dtrain/venv/bin/python bench/tf_keras_ps.py --rounds 3

The model and data are examples/python/keras_ps_ctr.py's (ids of --fields fields, an embedding
row per id summed, a dense part; Adagrad, asynchronous updates), with each field's ids numbered
into one table of fields x vocab rows so that TensorFlow's embedding can hold them. 2 workers, 2
servers, on one machine:
- dtrain: `dtrain run --servers 2 -n 2`, keras_ps_ctr's model (dtrain.tensorflow.ps) in
  model.fit; each worker trains --steps batches;
- TensorFlow: `dtrain run -n 3 --servers 2 --server-program --tf-config`: rank 0 is the chief
  (ParameterServerStrategy's ClusterCoordinator schedules 2 x --steps batches on the workers), the
  other ranks TensorFlow's workers and the servers its ps tasks; the same model with a Keras
  Embedding (each variable whole on one ps task) in a custom step, the way TensorFlow's tutorial trains.
Prints each one's median samples/s [lowest, highest round], the median of the rounds' ratios
and each one's held-out log loss.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "python"))


def data(args, worker, n):
    import numpy as np
    from ctr_sparse import World
    world = World(args.fields, args.vocab, args.zipf, 1)
    ids, x, y, logit = world.draw(np.random.default_rng(1017 + worker), n)
    # One table of fields x vocab rows: field f's value v is row f * vocab + v.
    values = ids & np.uint64((1 << 48) - 1)
    rows = (np.arange(args.fields, dtype=np.int64) * args.vocab + values.astype(np.int64))
    return rows, x, y, logit


def heldout_logloss(args, predict):
    import numpy as np
    from ctr_sparse import logloss
    rows, x, y, _ = data(args, 999_999, 20_000)
    z = predict(rows, x)
    return logloss(1 / (1 + np.exp(-z)), y)


def dtrain_worker(args):
    import keras
    import numpy as np
    import dtrain.tensorflow.ps as ps
    from keras_ps_ctr import ctr_model
    worker = int(os.environ["RANK"])
    keras.utils.set_random_seed(1)
    table = dict(consistency="async")
    model = ctr_model(args.fields, args.dim,
                      dict(init="normal", a=0.0, b=0.1, seed=42, optimizer="adagrad", lr=args.lr,
                           optimizer_options={"initial_accumulator": 0.1}, **table))
    model.compile(optimizer=ps.ServerOptimizer("adagrad", lr=args.lr, initial_accumulator=0.1,
                                               **table),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True))
    rows, x, y, _ = data(args, worker, (args.steps + 5) * args.batch)
    warm = 5 * args.batch
    model.fit({"ids": rows[:warm], "x": x[:warm]}, y[:warm], batch_size=args.batch, verbose=0)
    start = time.perf_counter()
    model.fit({"ids": rows[warm:], "x": x[warm:]}, y[warm:], batch_size=args.batch, verbose=0)
    rate = args.steps * args.batch / (time.perf_counter() - start)
    result = {"samples_per_sec": rate}
    if worker == 0:
        result["logloss"] = heldout_logloss(
            args, lambda r, xs: model.predict({"ids": r, "x": xs}, batch_size=4096,
                                              verbose=0).ravel())
    print("RESULT " + json.dumps(result), flush=True)


def tensorflow_task(args):
    import tensorflow as tf
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                      task_index=resolver.task_id, protocol="grpc", start=True)
        while not os.path.exists(args.done):  # serves until the chief says it is done
            time.sleep(0.2)
        return server.target
    import keras
    import numpy as np
    workers = resolver.cluster_spec().num_tasks("worker")
    # Variables whole, placed round-robin over the ps tasks: Keras 3's variables cannot be
    # differentiated when ParameterServerStrategy shards them ("ShardedVariable has no handle").
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    keras.utils.set_random_seed(1)
    with strategy.scope():
        embedding = keras.layers.Embedding(args.fields * args.vocab, args.dim,
                                           embeddings_initializer=keras.initializers.RandomNormal(
                                               stddev=0.1, seed=42))
        u = keras.layers.Dense(1)
        v = keras.layers.Dense(1, use_bias=False)
        ids_in = keras.Input((args.fields,), dtype="int64")
        x_in = keras.Input((4,))
        logit = keras.layers.Add()([u(keras.ops.sum(embedding(ids_in), axis=1)), v(x_in)])
        model = keras.Model([ids_in, x_in], logit)
        opt = keras.optimizers.Adagrad(args.lr, initial_accumulator_value=0.1)
        opt.build(model.trainable_variables)
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    def dataset_fn():
        rows, x, y, _ = data(args, 0, (2 * args.steps + 10) * args.batch)
        return tf.data.Dataset.from_tensor_slices(((rows, x), y)).batch(args.batch).repeat()

    per_worker = coordinator.create_per_worker_dataset(dataset_fn)
    iterator = iter(per_worker)

    @tf.function
    def step(iterator):
        def replica(batch):
            (rows, x), y = batch
            with tf.GradientTape() as tape:
                loss = loss_fn(y[:, None], model([rows, x], training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return strategy.run(replica, args=(next(iterator),))

    for _ in range(5 * workers):
        coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    start = time.perf_counter()
    for _ in range(args.steps * workers):
        coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    rate = args.steps * workers * args.batch / (time.perf_counter() - start)
    result = {"samples_per_sec": rate,
              # Called directly: predict() wants a per-worker dataset under the strategy.
              "logloss": heldout_logloss(
                  args, lambda r, xs: np.asarray(model([r, xs], training=False)).ravel())}
    open(args.done, "w").close()
    print("RESULT " + json.dumps(result), flush=True)


def run(args, which):
    dtrain = os.environ.get("DTRAIN_BIN") or "dtrain"
    common = ["--steps", str(args.steps), "--batch", str(args.batch), "--lr", str(args.lr),
              "--fields", str(args.fields), "--vocab", str(args.vocab), "--dim", str(args.dim)]
    with tempfile.TemporaryDirectory() as tmp:
        if which == "dtrain":
            command = [dtrain, "run", "--servers", "2", "-n", "2", "--", sys.executable,
                       os.path.abspath(__file__), "--worker", "dtrain"] + common
        else:
            command = [dtrain, "run", "-n", "3", "--servers", "2", "--server-program",
                       "--tf-config", "--", sys.executable, os.path.abspath(__file__),
                       "--worker", "tensorflow", "--done", os.path.join(tmp, "done")] + common
        p = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in p.stdout.splitlines()
               if "RESULT " in line]
    if p.returncode != 0 or not results:
        sys.exit(f"tf_keras_ps: {which} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    # dtrain's workers each report their own rate; TensorFlow's chief the whole job's.
    return {"samples_per_sec": sum(r["samples_per_sec"] for r in results),
            "logloss": next(r["logloss"] for r in results if "logloss" in r)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", choices=["dtrain", "tensorflow"], help=argparse.SUPPRESS)
    parser.add_argument("--done", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="batches per worker")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--fields", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=20_000)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--dim", type=int, default=8)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.worker == "dtrain":
        return dtrain_worker(args)
    if args.worker == "tensorflow":
        return tensorflow_task(args)
    runs = {"dtrain": [], "tensorflow": []}
    for r in range(args.rounds):
        for which in (["dtrain", "tensorflow"] if r % 2 == 0 else ["tensorflow", "dtrain"]):
            runs[which].append(run(args, which))
            print(f"round {r + 1}: {which} {runs[which][-1]}", flush=True)
    rate = {k: [x["samples_per_sec"] for x in v] for k, v in runs.items()}
    ratios = [a / b for a, b in zip(rate["dtrain"], rate["tensorflow"])]
    names = {"dtrain": "Keras on dtrain's parameter servers",
             "tensorflow": "ParameterServerStrategy"}
    print("\n| run | samples/s, median [range] | held-out log loss |\n|---|---|---|")
    for k in ("dtrain", "tensorflow"):
        print(f"| {names[k]} | {statistics.median(rate[k]):.0f} [{min(rate[k]):.0f}-"
              f"{max(rate[k]):.0f}] | {statistics.median(x['logloss'] for x in runs[k]):.4f} |")
    print(f"\ndtrain / ParameterServerStrategy: {statistics.median(ratios):.2f}x "
          f"[{min(ratios):.2f}-{max(ratios):.2f}] over {args.rounds} rounds")


if __name__ == "__main__":
    main()
