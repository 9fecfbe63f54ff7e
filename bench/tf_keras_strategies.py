"""Horovod's TensorFlow API on dtrain against TensorFlow's own MultiWorkerMirroredStrategy
(collective all-reduce over gRPC), on the same Keras model, in one run of alternating rounds
(docs/performance.md).

    /opt/dtrain/venv/bin/python bench/tf_keras_strategies.py --rounds 3

Each round runs both, in turn (the order reversed from round to round), as 2-rank jobs of
`dtrain run` (MultiWorkerMirroredStrategy with `--tf-config`): the Fashion-MNIST ConvNet of
examples/python/horovod_keras_fashion_mnist.py (or, with --model mlp, a 24.4M-parameter
perceptron whose step is mostly communication), --batch images per rank and step, plain SGD, the
same custom training loop (a tf.function step; Keras 3.15's model.fit fails under
MultiWorkerMirroredStrategy), --steps timed steps after --warmup, then the test accuracy (after
the whole first epoch with --epoch). Prints each one's median images/s [lowest, highest round], the
median of the rounds' ratios and the accuracies.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE_DIR = os.path.join(HERE, "..", "examples", "python")


def worker(args):
    """One rank of one run: prints RESULT {...} on rank 0."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np
    import tensorflow as tf
    sys.path.insert(0, EXAMPLE_DIR)
    from horovod_keras_fashion_mnist import conv_net, dataset

    mwms = args.worker == "mwms"
    if mwms:
        config = json.loads(os.environ["TF_CONFIG"])
        rank, size = config["task"]["index"], len(config["cluster"]["worker"])
    else:
        import dtrain.tensorflow as hvd
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    # Before the strategy starts TensorFlow's runtime: the cores shared out among the ranks.
    tf.config.threading.set_intra_op_parallelism_threads(max(1, (os.cpu_count() or 1) // size))
    if mwms:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x, y = dataset("train")
    test_x, test_y = dataset("test")
    keras.utils.set_random_seed(1)

    def make_model():
        if args.model == "convnet":
            return conv_net()
        # Where communication dominates: 24.4M parameters (98 MB of gradients) and little
        # arithmetic per image.
        return keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                                 keras.layers.Dense(4096, activation="relu"),
                                 keras.layers.Dense(4096, activation="relu"),
                                 keras.layers.Dense(1024, activation="relu"),
                                 keras.layers.Dense(10)])
    global_batch = args.batch * size
    loss_fn = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="none")

    if mwms:
        with strategy.scope():
            model = make_model()
            opt = keras.optimizers.SGD(args.lr)
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch, drop_remainder=True)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = \
            tf.data.experimental.AutoShardPolicy.DATA
        batches = strategy.experimental_distribute_dataset(data.with_options(options))

        @tf.function
        def step(xs, ys):
            def replica(xs, ys):
                with tf.GradientTape() as tape:
                    loss = tf.nn.compute_average_loss(loss_fn(ys, model(xs, training=True)),
                                                      global_batch_size=global_batch)
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables))
            strategy.run(replica, args=(xs, ys))
    else:
        model = make_model()
        opt = keras.optimizers.SGD(args.lr)
        hvd.broadcast_variables(model.variables, root_rank=0)
        mine = np.arange(len(x)).reshape(-1, size)[:, rank]  # rank r: every size-th image
        batches = tf.data.Dataset.from_tensor_slices((x[mine], y[mine])).batch(
            args.batch, drop_remainder=True)

        @tf.function
        def step(xs, ys):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(loss_fn(ys, model(xs, training=True)))
            tape = hvd.DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

    iterator = iter(batches)
    for _ in range(args.warmup):
        step(*next(iterator))
    start = time.perf_counter()
    for _ in range(args.steps):
        step(*next(iterator))
    elapsed = time.perf_counter() - start
    result = {"worker": args.worker, "images_per_sec": args.steps * global_batch / elapsed}
    if args.epoch:
        for xs, ys in iterator:  # the rest of the epoch
            step(xs, ys)
    # After the timed steps (or the epoch): the same arithmetic gives the same accuracy.
    logits = model.predict(test_x, batch_size=1000, verbose=0)
    result["test_accuracy"] = float((np.argmax(logits, axis=1) == test_y).mean())
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)


def run(args, which):
    dtrain = os.environ.get("DTRAIN_BIN") or "dtrain"
    command = [dtrain, "run", "-n", "2"] + (["--tf-config"] if which == "mwms" else []) + [
        "--", sys.executable, os.path.abspath(__file__), "--worker", which,
        "--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--lr", str(args.lr), "--model", args.model] + (["--epoch"] if args.epoch else [])
    p = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    lines = [line for line in p.stdout.splitlines() if "RESULT " in line]
    if p.returncode != 0 or not lines:
        sys.exit(f"tf_keras_strategies: {which} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return json.loads(lines[-1].split("RESULT ", 1)[1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", choices=["hvd", "mwms"], help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", choices=["convnet", "mlp"], default="convnet",
                        help="convnet: the example's (compute bound); mlp: 24.4M parameters "
                             "(communication bound)")
    parser.add_argument("--batch", type=int, default=100, help="images per rank and step")
    parser.add_argument("--steps", type=int, default=100, help="timed steps")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--epoch", action="store_true",
                        help="finish the first epoch before testing")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    runs = {"hvd": [], "mwms": []}
    for r in range(args.rounds):
        order = ["hvd", "mwms"] if r % 2 == 0 else ["mwms", "hvd"]
        for which in order:
            runs[which].append(run(args, which))
            print(f"round {r + 1}: {which} {runs[which][-1]}", flush=True)
    rate = {k: [x["images_per_sec"] for x in v] for k, v in runs.items()}
    ratios = [a / b for a, b in zip(rate["hvd"], rate["mwms"])]
    print("\n| run | images/s, median [range] | test accuracy |\n|---|---|---|")
    names = {"hvd": "Horovod API on dtrain", "mwms": "MultiWorkerMirroredStrategy"}
    for k in ("hvd", "mwms"):
        accuracy = [x.get("test_accuracy") for x in runs[k] if "test_accuracy" in x]
        acc = f"{statistics.median(accuracy):.4f}" if accuracy else "-"
        print(f"| {names[k]} | {statistics.median(rate[k]):.0f} [{min(rate[k]):.0f}-"
              f"{max(rate[k]):.0f}] | {acc} |")
    print(f"\ndtrain / MultiWorkerMirroredStrategy: {statistics.median(ratios):.2f}x "
          f"[{min(ratios):.2f}-{max(ratios):.2f}] over {args.rounds} rounds")


if __name__ == "__main__":
    main()
