"""Horovod's Keras example, unchanged but for its import line, on dtrain.

    dtrain run -n 2 -- python3 examples/python/horovod_keras_fashion_mnist.py --epochs 1

It follows Horovod's examples/tensorflow2/tensorflow2_keras_mnist.py (init, each rank its own
shard of the data, the learning rate scaled by hvd.size() and warmed up, hvd.DistributedOptimizer,
the initial variables broadcast from rank 0, metrics averaged, checkpoints on rank 0 only), on
Debian's Fashion-MNIST (dataset-fashion-mnist) with the ConvNet and hyperparameters of
examples/python/horovod_fashion_mnist.py (PyTorch), so that the two can be compared. The last
line is RESULT {...} with the test accuracy and the images per second.
"""
import argparse
import gzip
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import dtrain.tensorflow.keras as hvd  # noqa: E402  (was: import horovod.tensorflow.keras as hvd)

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path, images):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if images:
        count, rows, cols = (int.from_bytes(raw[i:i + 4], "big") for i in (4, 8, 12))
        pixels = np.frombuffer(raw[16:], dtype=np.uint8)
        return (pixels.reshape(count, rows, cols, 1) / 255.0).astype(np.float32)
    return np.frombuffer(raw[8:], dtype=np.uint8).astype(np.int64)


def dataset(split):
    stem = "train" if split == "train" else "t10k"
    return (read_idx(os.path.join(DATA, f"{stem}-images-idx3-ubyte.gz"), True),
            read_idx(os.path.join(DATA, f"{stem}-labels-idx1-ubyte.gz"), False))


def conv_net():
    """The PyTorch tutorial's ConvNet, as in examples/train_fashion_mnist.cc."""
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(16, 5, padding="same"), keras.layers.BatchNormalization(),
        keras.layers.ReLU(), keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(32, 5, padding="same"), keras.layers.BatchNormalization(),
        keras.layers.ReLU(), keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(), keras.layers.Dense(10),
    ])


class Throughput(keras.callbacks.Callback):
    """Images per second of this rank's training, from the second batch on (the first traces)."""

    def __init__(self, batch_size):
        super().__init__()
        self.batch_size, self.images, self.start = batch_size, 0, None

    def on_train_batch_end(self, batch, logs=None):
        if self.start is None:
            self.start = time.perf_counter()
        else:
            self.images += self.batch_size

    def rate(self):
        return self.images / max(1e-9, time.perf_counter() - (self.start or 0))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=100, help="per rank")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--limit", type=int, default=0, help="use the first N training images")
    parser.add_argument("--checkpoint", default="", help="rank 0 saves the model here each epoch")
    args = parser.parse_args()

    hvd.init()
    keras.utils.set_random_seed(args.seed + hvd.rank())  # the broadcast makes them agree
    threads = max(1, (os.cpu_count() or 1) // hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)

    x, y = dataset("train")
    if args.limit:
        x, y = x[:args.limit], y[:args.limit]
    order = np.random.default_rng(args.seed).permutation(len(x))  # the same on every rank
    mine = order[hvd.rank()::hvd.size()]
    test_x, test_y = dataset("test")

    model = conv_net()
    # Horovod's convention: the learning rate grows with the ranks (warmed up), the gradients
    # are averaged by the DistributedOptimizer.
    scaled_lr = args.lr * hvd.size()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(scaled_lr, momentum=args.momentum))
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    throughput = Throughput(args.batch_size)
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1,
                                                 steps_per_epoch=len(mine) // args.batch_size),
        throughput,
    ]
    if hvd.rank() == 0 and args.checkpoint:
        callbacks.append(keras.callbacks.ModelCheckpoint(args.checkpoint))
    if hvd.rank() == 0:
        print(f"horovod_keras_fashion_mnist: {hvd.size()} rank(s), batch {args.batch_size} per "
              f"rank, {threads} thread(s), {len(x)} training images", flush=True)
    history = model.fit(x[mine], y[mine], batch_size=args.batch_size, epochs=args.epochs,
                        shuffle=True, callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)

    # Each rank tests its share; the counts are summed.
    share = slice(hvd.rank(), None, hvd.size())
    logits = model.predict(test_x[share], batch_size=1000, verbose=0)
    correct = int((np.argmax(logits, axis=1) == test_y[share]).sum())
    correct = int(hvd.allreduce(tf.constant(correct), op=hvd.Sum).numpy())
    rate = float(hvd.allreduce(tf.constant(throughput.rate()), op=hvd.Sum).numpy())
    if hvd.rank() == 0:
        result = {"framework": "tensorflow", "world_size": hvd.size(), "epochs": args.epochs,
                  "final_loss": round(float(history.history["loss"][-1]), 4),
                  "images_per_sec": round(rate, 1),
                  "test_accuracy": round(correct / len(test_x), 4)}
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
