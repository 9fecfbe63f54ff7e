"""The per-rank bodies of dtrain.tensorflow's tests: `python3 tf_workers.py NAME [ARGS]`.

Each imports dtrain.tensorflow as hvd (as a Horovod script would), runs under the variables
tests/python/harness.py sets, checks every result against values computed locally and exits 0;
a mismatch raises, which exits non-zero with the traceback.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# True in a process forked from `dtrain run --preload tensorflow`'s server.
TENSORFLOW_BEFORE_THE_SCRIPT = "tensorflow" in sys.modules

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import dtrain.tensorflow as hvd  # noqa: E402


def expect(got, want, what, tol=1e-6):
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or not np.allclose(got.astype(np.float64),
                                                  want.astype(np.float64), rtol=tol, atol=tol):
        raise AssertionError(f"rank {hvd.rank()}: {what}: got {got.tolist()}, want "
                             f"{want.tolist()}")


def value(r, shape=(3, 4), dtype=np.float32):
    """Rank r's tensor: small integers that every dtype holds exactly."""
    return ((np.arange(int(np.prod(shape))) % 7) + r + 1).reshape(shape).astype(dtype)


DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.int16, np.int8, np.uint8]


def collectives():
    hvd.init()
    hvd.init()  # a second call does nothing
    r, n = hvd.rank(), hvd.size()
    assert hvd.is_initialized() and hvd.local_rank() == r and hvd.local_size() == n
    every = [value(q) for q in range(n)]
    for dtype in DTYPES:
        mine = tf.constant(value(r, dtype=dtype))
        total = sum(v.astype(np.float64) for v in every)
        expect(hvd.allreduce(mine, op=hvd.Sum), total, f"sum of {dtype.__name__}")
        expect(hvd.allreduce(mine, op=hvd.Min), value(0), f"min of {dtype.__name__}")
        expect(hvd.allreduce(mine, op=hvd.Max), value(n - 1), f"max of {dtype.__name__}")
        if np.issubdtype(dtype, np.floating):
            expect(hvd.allreduce(mine), total / n, f"average of {dtype.__name__}", 1e-3)
    expect(hvd.allreduce(tf.constant(value(r)), op=hvd.Product),
           np.prod([v.astype(np.float64) for v in every], axis=0), "product")
    expect(hvd.allreduce(tf.constant(value(r)), op=hvd.Sum, prescale_factor=0.5,
                         postscale_factor=3.0), 1.5 * sum(every), "scaled sum")
    expect(hvd.allreduce(tf.constant(value(r, dtype=np.int32)), op=hvd.Sum,
                         postscale_factor=0.5),
           np.trunc(0.5 * sum(v.astype(np.float64) for v in every)), "integers scaled")
    expect(hvd.allreduce(tf.constant(value(r)), op=hvd.Sum, compression=hvd.Compression.fp16),
           sum(every), "fp16 compression")
    grouped = hvd.grouped_allreduce([tf.constant(value(r)), tf.constant(value(r, (5,)))],
                                    op=hvd.Sum)
    expect(grouped[1], sum(value(q, (5,)) for q in range(n)), "grouped")
    # Rows of different counts per rank.
    gathered = hvd.allgather(tf.constant(value(r, (r + 1, 2))))
    expect(gathered, np.concatenate([value(q, (q + 1, 2)) for q in range(n)]), "allgather")
    flags = hvd.allgather(tf.constant([r % 2 == 0]))
    expect(flags, [q % 2 == 0 for q in range(n)], "allgather of bool")
    expect(hvd.broadcast(tf.constant(value(r)), n - 1), value(n - 1), "broadcast")
    # Rank r sends q + 1 rows to rank q, each row [r, q].
    rows = np.array([[r, q] for q in range(n) for _ in range(q + 1)], dtype=np.int64)
    out, received = hvd.alltoall(tf.constant(rows), splits=[q + 1 for q in range(n)])
    expect(out, [[q, r] for q in range(n) for _ in range(r + 1)], "alltoall")
    expect(received, [r + 1] * n, "alltoall's received splits")
    out = hvd.alltoall(tf.constant(np.full((2 * n, 1), r)))  # without splits: no received
    expect(out, [[q] for q in range(n) for _ in range(2)], "alltoall in equal parts")
    assert hvd.broadcast_object({"from": r}, root_rank=0) == {"from": 0}
    assert hvd.allgather_object(("rank", r)) == [("rank", q) for q in range(n)]
    v = tf.Variable(value(r))
    hvd.broadcast_variables([v], root_rank=0)
    expect(v, value(0), "broadcast_variables")
    hvd.barrier()
    print("every collective checked", flush=True)


def graph():
    """Inside tf.function TensorFlow runs the ops concurrently, in any order per rank: the
    coordinator matches them by node name and runs them; gradients as Horovod defines them."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()

    @tf.function
    def step(x):
        # Order of creation differs by rank; a graph's node names do not.
        parts = [hvd.allreduce(x * (i + 1), op=hvd.Sum) for i in range(8)]
        if r % 2:
            parts.reverse()
        return tf.add_n(parts), hvd.allgather(x[:r + 1])

    for _ in range(3):
        total, gathered = step(tf.constant([float(r + 1)] * 4))
    want = sum(q + 1 for q in range(n)) * sum(range(1, 9))
    expect(total, [want] * 4, "eight all-reduces in one graph")
    expect(gathered, [float(q + 1) for q in range(n) for _ in range(q + 1)], "graph allgather")

    w = tf.Variable([1.0, 2.0, 3.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(hvd.allreduce(w * (r + 1), op=hvd.Sum))
    # Horovod's gradient of an all-reduce is the all-reduce of the gradients: n ones, summed.
    expect(tape.gradient(loss, w), [n * (r + 1)] * 3, "gradient of a sum")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(hvd.allgather(w * (r + 1)))
    expect(tape.gradient(loss, w), [r + 1.0] * 3, "gradient of an allgather")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(hvd.broadcast(w * 2.0, 0))
    expect(tape.gradient(loss, w), [2.0 if r == 0 else 0.0] * 3, "gradient of a broadcast")
    print("graph checked", flush=True)


def tape():
    """DistributedGradientTape: each rank's gradient of its shard is the average of them all,
    as one process's on the whole batch."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    rng = np.random.default_rng(7)
    x = rng.normal(size=(8 * n, 3)).astype(np.float32)
    y = rng.normal(size=(8 * n, 1)).astype(np.float32)
    w = tf.Variable(rng.normal(size=(3, 1)).astype(np.float32))
    emb = tf.Variable(rng.normal(size=(10, 3)).astype(np.float32))
    ids = np.arange(8 * n) % 10

    def loss_of(xs, ys, idx):
        return tf.reduce_mean((tf.matmul(xs + tf.gather(emb, idx), w) - ys) ** 2)

    shard = slice(8 * r, 8 * (r + 1))
    for sparse_as_dense in (False, True):
        with tf.GradientTape() as t:
            loss = loss_of(x[shard], y[shard], ids[shard])
        t = hvd.DistributedGradientTape(t, sparse_as_dense=sparse_as_dense)
        gw, gemb = t.gradient(loss, [w, emb])
        with tf.GradientTape() as whole:
            loss = loss_of(x, y, ids)
        want_w, want_emb = whole.gradient(loss, [w, emb])
        expect(gw, want_w, "dense gradient", 1e-5)
        expect(tf.convert_to_tensor(gemb), tf.convert_to_tensor(want_emb), "embedding gradient",
               1e-5)
        assert isinstance(gemb, tf.IndexedSlices) != sparse_as_dense, type(gemb)
    print("tape checked", flush=True)


def _model(seed):
    import keras
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(1)])


def keras_fit():
    """model.fit with DistributedOptimizer and the callbacks: every rank ends with the weights of
    one process trained on the whole batches (SGD, averaged gradients), though each rank began
    from its own random weights."""
    import keras
    import dtrain.tensorflow.keras as khvd
    khvd.init()
    r, n = khvd.rank(), khvd.size()
    rng = np.random.default_rng(3)
    per, steps = 8, 6
    x = rng.normal(size=(per * n * steps, 4)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)).astype(np.float32)
    # Step s uses rows [s*per*n, (s+1)*per*n); rank r's share of it is its r-th slice.
    mine = np.concatenate([np.arange(s * per * n + r * per, s * per * n + (r + 1) * per)
                           for s in range(steps)])

    reference = _model(0)  # rank 0's initial weights, trained by one process on whole batches
    reference.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    reference.fit(x, y, batch_size=per * n, epochs=2, shuffle=False, verbose=0)

    model = _model(r)  # each rank's own initial weights: the callback makes them rank 0's
    opt = khvd.DistributedOptimizer(keras.optimizers.SGD(0.05))
    assert isinstance(opt, keras.optimizers.SGD)
    model.compile(optimizer=opt, loss="mse")
    history = model.fit(x[mine], y[mine], batch_size=per, epochs=2, shuffle=False, verbose=0,
                        callbacks=[khvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   khvd.callbacks.MetricAverageCallback()])
    for got, want in zip(model.get_weights(), reference.get_weights()):
        expect(got, want, "weights after model.fit", 1e-4)
    losses = khvd.allgather_object(history.history["loss"])
    assert all(np.allclose(losses[0], other) for other in losses), losses

    # The warmup ramps the learning rate from lr / size to lr over the warmup epochs.
    model.compile(optimizer=khvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    warm = khvd.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=2, steps_per_epoch=steps)
    history = model.fit(x[mine], y[mine], batch_size=per, epochs=3, shuffle=False, verbose=0,
                        callbacks=[warm])
    lr = history.history["lr"]
    expect(lr[:2], [0.1 / n * ((e + (steps - 1) / steps) * (n - 1) / 2 + 1) for e in range(2)],
           "warmup learning rates", 1e-5)
    print("keras checked", flush=True)


def reducescatter():
    """Each rank gets its part of dimension 0 of the reduction: equal parts, one more row for
    each of the first rows % size ranks; its gradient gathers the parts back."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for rows in (2 * n, 2 * n + 1, n + n // 2):
        every = [value(q, (rows, 3)) for q in range(n)]
        parts = [rows // n + (1 if q < rows % n else 0) for q in range(n)]
        low = sum(parts[:r])
        total = sum(v.astype(np.float64) for v in every)
        expect(hvd.reducescatter(tf.constant(every[r]), op=hvd.Sum), total[low:low + parts[r]],
               f"reducescatter of {rows} rows")
        expect(hvd.reducescatter(tf.constant(every[r])), total[low:low + parts[r]] / n,
               f"averaged reducescatter of {rows} rows")
    w = tf.Variable(np.ones((2 * n, 2), np.float32))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(hvd.reducescatter(w * (r + 1), op=hvd.Average))
    expect(tape.gradient(loss, w), np.full((2 * n, 2), r + 1.0), "reducescatter's gradient")
    try:
        hvd.reducescatter(tf.constant(1.0))
        raise AssertionError("a scalar was scattered")
    except (tf.errors.InvalidArgumentError, ValueError):
        pass
    print("reducescatter checked", flush=True)


def layers():
    """SyncBatchNormalization normalizes with the whole job's batch; a
    PartialDistributedGradientTape leaves local layers' gradients alone."""
    import keras
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    x = np.arange(n * 4 * 2, dtype=np.float32).reshape(n * 4, 2) ** 1.5
    plain = keras.layers.BatchNormalization(axis=1)
    synced = hvd.SyncBatchNormalization(axis=1)
    want = plain(x, training=True).numpy()[4 * r:4 * (r + 1)]
    expect(synced(x[4 * r:4 * (r + 1)], training=True), want, "SyncBatchNormalization", 1e-4)
    expect(synced.moving_mean, plain.moving_mean, "moving mean", 1e-5)
    expect(synced.moving_variance, plain.moving_variance, "moving variance", 1e-4)

    keras.utils.set_random_seed(r)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    xs = np.full((2, 3), r + 1.0, np.float32)
    with tf.GradientTape(persistent=True) as t:
        loss = tf.reduce_sum(model(xs))
    local_grads = t.gradient(loss, model.trainable_weights)
    tape = hvd.PartialDistributedGradientTape(t, local_layers=model.layers[:1])
    grads = tape.gradient(loss, model.trainable_weights)
    for g, mine in zip(grads[:2], local_grads[:2]):
        expect(g, mine.numpy() / n, "a local layer's gradient (divided by the ranks)")
    for g, mine in zip(grads[2:], local_grads[2:]):
        every = hvd.allgather(tf.expand_dims(mine, 0))
        expect(g, tf.reduce_mean(every, axis=0), "a shared layer's gradient")
    print("layers checked", flush=True)


def accumulate():
    """backward_passes_per_step: Keras sums N steps' gradients locally and all-reduces once."""
    import keras
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    v = keras.Variable(np.zeros(2, np.float32))
    for average in (False, True):
        v.assign(np.zeros(2, np.float32))
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=3,
                                       average_aggregated_gradients=average)
        for step in range(6):
            opt.apply([tf.constant([r + 1.0, step + 1.0])], [v])
            if step == 1:
                expect(v, [0.0, 0.0], "no update before the third step")
        # Each update: minus the average over ranks of the sum (or mean) of three steps.
        ranks = sum(q + 1.0 for q in range(n)) / n
        scale = 1.0 / 3 if average else 1.0
        want = -scale * np.array([6 * ranks, sum(range(1, 7))])
        expect(v, want, f"two updates of three accumulated steps (average={average})", 1e-5)
    print("accumulate checked", flush=True)


def graph_v1():
    """The reference material's TF1 sample: a tf.compat.v1 graph and session, an optimizer of
    tf.compat.v1.train wrapped by DistributedOptimizer, the broadcast hook, global_step."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=tf.constant([float(r), 1.0]))
        loss = tf.reduce_sum(w * float(r + 1))
        step = tf.compat.v1.train.get_or_create_global_step()
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5))
        train = opt.minimize(loss, global_step=step)
        with tf.compat.v1.train.MonitoredTrainingSession(
                hooks=[hvd.BroadcastGlobalVariablesHook(0)]) as sess:
            for _ in range(3):
                sess.run(train)
            final, steps = sess.run([w, step])
    assert steps == 3, steps
    mean_grad = sum(q + 1.0 for q in range(n)) / n
    expect(final, [0.0 - 3 * 0.5 * mean_grad, 1.0 - 3 * 0.5 * mean_grad], "three TF1 steps")
    print("graph_v1 checked", flush=True)


def elastic_state(folder):
    """A TensorFlowKerasState commits under DTRAIN_COMMIT_DIR; @run resumes every rank from
    the newest commit any rank holds."""
    import keras
    os.environ["DTRAIN_COMMIT_DIR"] = folder
    hvd.init()
    r = hvd.rank()
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    model.set_weights([np.full((2, 2), r + 1.0, np.float32), np.zeros(2, np.float32)])
    state = hvd.elastic.TensorFlowKerasState(model, batch=r, epoch=0)
    state.sync()
    expect(model.get_weights()[0], np.ones((2, 2)), "weights after sync")
    assert state.batch == 0, state.batch
    model.set_weights([np.full((2, 2), 5.0, np.float32), np.zeros(2, np.float32)])
    state.epoch = 3
    state.commit()
    model.set_weights([np.full((2, 2), 9.0, np.float32), np.zeros(2, np.float32)])
    state.restore()
    expect(model.get_weights()[0], np.full((2, 2), 5.0), "weights after restore")
    # A "restarted" job: new state objects, resumed by @run from the commit.
    fresh = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    resumed = hvd.elastic.TensorFlowKerasState(fresh, batch=0, epoch=0)

    @hvd.elastic.run
    def train(state):
        return state.epoch, fresh.get_weights()[0]

    epoch, weights = train(resumed)
    assert epoch == 3, epoch
    expect(weights, np.full((2, 2), 5.0), "weights resumed from the commit")
    print("elastic checked", flush=True)


def strategy():
    """TensorFlow's own MultiWorkerMirroredStrategy, started by `dtrain run --tf-config`, in a
    custom training loop (Keras 3.15's model.fit fails under it with "unsupported type
    PerReplica"): its ranks end with the weights of one process on the whole batches."""
    import json
    import keras
    config = json.loads(os.environ["TF_CONFIG"])
    n = len(config["cluster"]["worker"])
    r = config["task"]["index"]
    mwms = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(5)
    x = rng.normal(size=(16 * n, 4)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    batch = 8 * n
    with mwms.scope():
        model = _model(0)
        opt = keras.optimizers.SGD(0.05)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = \
        tf.data.experimental.AutoShardPolicy.DATA
    dist = mwms.experimental_distribute_dataset(data.with_options(options))

    @tf.function
    def step(xs, ys):
        def replica(xs, ys):
            with tf.GradientTape() as tape:
                per_example = tf.reduce_mean((model(xs, training=True) - ys) ** 2, axis=1)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        mwms.run(replica, args=(xs, ys))

    for _ in range(2):
        for xs, ys in dist:
            step(xs, ys)
    reference = _model(0)
    reference.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    reference.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
            raise AssertionError(f"worker {r}: MultiWorkerMirroredStrategy's weights differ from "
                                 f"one process's: {got.tolist()} against {want.tolist()}")
    print(f"worker {r} of {n}: strategy checked", flush=True)


def ps_keras(consistency):
    """model.fit against dtrain's parameter servers (dtrain run --servers 1): an embedding whose
    rows live on the servers and a dense part the servers update. Synchronous: the servers end
    with the weights of one process trained on the whole batches; asynchronous and with bounded
    staleness (1): the loss falls."""
    import keras
    import dtrain.tensorflow.ps as ps
    r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rng = np.random.default_rng(11)
    per, steps = 8, 5
    ids = rng.integers(0, 10, size=(per * n * steps, 4))
    y = (ids.sum(axis=1, keepdims=True) / 10.0).astype(np.float32)
    mine = np.concatenate([np.arange(s * per * n + r * per, s * per * n + (r + 1) * per)
                           for s in range(steps)])

    def model_with(embedding):
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((4,), dtype="int64"), embedding,
                                 keras.layers.Flatten(), keras.layers.Dense(1)])

    staleness = 1 if consistency == "bounded" else 0
    model = model_with(ps.Embedding("emb", 3, init="zeros", lr=0.1, consistency=consistency,
                                    staleness=staleness))
    model.compile(optimizer=ps.ServerOptimizer("sgd", lr=0.1, consistency=consistency,
                                               staleness=staleness), loss="mse")
    history = model.fit(ids[mine], y[mine], batch_size=per, epochs=2, shuffle=False, verbose=0)
    if consistency != "sync":
        losses = history.history["loss"]
        assert losses[-1] < losses[0], losses
        print("ps_keras checked", flush=True)
        return
    reference = model_with(keras.layers.Embedding(10, 3, embeddings_initializer="zeros"))
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    reference.fit(ids, y, batch_size=per * n, epochs=2, shuffle=False, verbose=0)
    rows = np.empty((10, 3), np.float32)
    ps.client().pull_rows("emb", np.arange(10, dtype=np.int64), rows).wait()
    expect(rows, reference.layers[0].get_weights()[0], "embedding rows on the servers", 1e-4)
    want = reference.layers[2].get_weights()
    got = [w for w in model.get_weights() if w.shape != ()]  # the anchor is a scalar
    for g, w in zip(got, want):
        expect(g, w, "dense weights from the servers", 1e-4)
    print("ps_keras checked", flush=True)


def elastic_fit(out, crash_step):
    """hvd.elastic under `dtrain run`: 12 steps of a DistributedOptimizer (SGD with momentum), a
    commit after each; in the first round rank 1 dies after step `crash_step` (0: never). Rank 0
    saves the final weights to `out`."""
    import keras
    import dtrain.tensorflow.keras as khvd
    crash_step = int(crash_step)
    khvd.init()
    r = khvd.rank()
    model = _model(0)
    model.compile(optimizer=khvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
                  loss="mse")
    state = khvd.elastic.KerasState(model, step=0)
    rng = np.random.default_rng(9)
    x = rng.normal(size=(12, 2, 8, 4)).astype(np.float32)  # step, rank, batch
    y = x.sum(axis=3, keepdims=True)

    @khvd.elastic.run
    def train(state):
        while state.step < 12:
            model.train_on_batch(x[state.step, r], y[state.step, r])
            state.step += 1
            state.commit()
            if state.step == crash_step and r == 1 and \
                    os.environ.get("DTRAIN_RESTART_COUNT", "0") == "0":
                os._exit(3)

    train(state)
    if r == 0:
        np.savez(out, *model.get_weights())
    print(f"rank {r}: elastic training finished at step {state.step}", flush=True)


LIVE_SAMPLES = 90
LIVE_BATCH = 3  # per rank and step


def _live_setup():
    """The live worker's model (the same weights in every process) and samples."""
    import keras
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
    rng = np.random.default_rng(11)
    x = rng.normal(size=(LIVE_SAMPLES, 5)).astype(np.float32)
    return model, x, rng.normal(size=(LIVE_SAMPLES, 2)).astype(np.float32)


def live_elastic(out, die_rank, die_after, step_ms="0"):
    """hvd.elastic under `dtrain run --live`: one pass over LIVE_SAMPLES, each step taking the
    next LIVE_BATCH rows per rank in rank order (state.position: the rows trained), a Keras
    DistributedOptimizer (SGD with momentum) and a commit after every step; rank `die_rank` (at
    start) SIGKILLs itself after its commit of step `die_after` (its replacement, under
    --replace, does not). Each rank writes, before each commit, "step S generation G samples
    i,j,k" to out/samples.R (R: its rank at start; a replacement's: out/samples.Rr), and at the
    end its weights to out/weights.R.npz. Each step lasts at least `step_ms`."""
    import signal
    import time
    import keras
    import dtrain.tensorflow.keras as khvd
    die_rank, die_after, step_s = int(die_rank), int(die_after), float(step_ms) / 1000
    khvd.init()
    me = int(os.environ["RANK"])
    replacement = os.environ.get("DTRAIN_LIVE_REPLACEMENT") == "1"
    print(f"rank {me} at start: tensorflow imported before the script: "
          f"{TENSORFLOW_BEFORE_THE_SCRIPT}", flush=True)
    model, x, y = _live_setup()
    model.compile(optimizer=khvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
                  loss="mse")
    state = khvd.elastic.KerasState(model, position=0, step=0)
    log = open(os.path.join(out, f"samples.{me}{'r' if replacement else ''}"), "w")
    # Traced now, in the first world: Horovod's size and rank ops are read when they run.
    world = tf.function(lambda: tf.stack([hvd.size_op(), hvd.rank_op()]))
    world()

    def reset():
        # What Horovod's elastic examples do to the rate here, as they would with lr 0.3.
        batch, lr = khvd.elastic.step_shape("scale-lr", LIVE_BATCH, 0.3)
        print(f"rank {me} at start: reset at step {state.step}, now rank {khvd.rank()} of "
              f"{khvd.size()} (scale-lr: batch {batch}, lr {lr:g})", flush=True)
    state.register_reset_callbacks([reset])

    @khvd.elastic.run
    def train(state):
        while state.position + khvd.size() * LIVE_BATCH <= LIVE_SAMPLES:
            time.sleep(step_s)  # long enough steps for a replacement to start
            first = state.position + khvd.rank() * LIVE_BATCH
            model.train_on_batch(x[first:first + LIVE_BATCH], y[first:first + LIVE_BATCH])
            state.position += khvd.size() * LIVE_BATCH
            state.step += 1
            rows = ",".join(map(str, range(first, first + LIVE_BATCH)))
            log.write(f"step {state.step} generation {khvd.elastic.generation()} samples "
                      f"{rows}\n")
            log.flush()
            state.commit()
            if me == die_rank and state.step == die_after and not replacement:
                os.kill(os.getpid(), signal.SIGKILL)

    train(state)
    expect(world(), [khvd.size(), khvd.rank()], "size_op() and rank_op() traced in the first world")
    np.savez(os.path.join(out, f"weights.{me}.npz"), *model.get_weights())
    print(f"rank {me} at start: live training finished at step {state.step} as rank "
          f"{khvd.rank()} of {khvd.size()}", flush=True)
    khvd.shutdown()


def live_reference(out, *worlds):
    """What live_elastic's survivors must hold, in one process: for each "SIZE:STEPS" of
    `worlds` (STEPS "end": to the end of the pass), that many steps of SIZE ranks' rows at once
    (the average of equal batches' mean gradients is the mean gradient of their union). Writes
    the weights to `out` and prints the steps and the samples trained."""
    import keras
    model, x, y = _live_setup()
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    position = steps = 0
    for world in worlds:
        size, count = world.split(":")
        rows = int(size) * LIVE_BATCH
        k = 0
        while (count == "end" or k < int(count)) and position + rows <= LIVE_SAMPLES:
            model.train_on_batch(x[position:position + rows], y[position:position + rows])
            position += rows
            k += 1
        steps += k
    np.savez(out, *model.get_weights())
    print(f"reference steps {steps} samples {position}", flush=True)


def peer_dies():
    """Rank 1 leaves mid-job: rank 0's next all-reduce fails fast with a TensorFlow error that
    carries dtrain's text (which rank, what to do)."""
    import time
    hvd.init()
    r = hvd.rank()
    hvd.allreduce(tf.ones([4]), op=hvd.Sum, name="before")
    if r == 1:
        os._exit(3)
    start = time.monotonic()
    try:
        hvd.allreduce(tf.ones([4]), op=hvd.Sum, name="after")
        raise AssertionError("an all-reduce with a dead peer succeeded")
    except tf.errors.OpError as e:
        elapsed = time.monotonic() - start
        assert "rank 1" in str(e), str(e)
        assert elapsed < 30, f"the failure took {elapsed:.1f} s"
        print(f"peer death named in {elapsed:.1f} s: {type(e).__name__}: "
              f"{str(e).splitlines()[0][:300]}", flush=True)
    os._exit(0)  # the session's close would wait for the dead peer


def ps_server_dies(flag):
    """Keras against a parameter server that is killed between two fits (the test kills it):
    the second fit fails with a TensorFlow error carrying dtrain's text naming the server."""
    import time
    import keras
    import dtrain.tensorflow.ps as ps
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=ps.ServerOptimizer("sgd", lr=0.1, consistency="async"), loss="mse")
    x = np.ones((16, 4), np.float32)
    model.fit(x, x[:, :1], batch_size=8, verbose=0)
    print("trained", flush=True)
    while not os.path.exists(flag):
        time.sleep(0.1)
    try:
        model.fit(x, x[:, :1], batch_size=8, verbose=0)
        raise AssertionError("training went on without its server")
    except tf.errors.OpError as e:
        assert "ps server 0" in str(e), str(e)
        print(f"server death named: {type(e).__name__}: {str(e)[:300]}", flush=True)
    os._exit(0)


def keras2_fit(kind):
    """Keras 2 (tf_keras, tf.keras under TF_USE_LEGACY_KERAS=1, as Horovod's own scripts run on
    TensorFlow 2.16 and later): model.fit with a DistributedOptimizer around a `kind` ("new" or
    "legacy") optimizer and the callbacks ends with the weights of one process on the whole
    batches; with backward_passes_per_step 2 (averaged), those of one process on batches twice
    as large."""
    import dtrain.tensorflow.keras as khvd
    tfk = tf.keras
    assert tfk.__name__.startswith("tf_keras"), tfk.__name__
    khvd.init()
    r, n = khvd.rank(), khvd.size()
    optimizers = tfk.optimizers.legacy if kind == "legacy" else tfk.optimizers
    rng = np.random.default_rng(3)
    per, steps = 8, 6
    x = rng.normal(size=(per * n * steps, 4)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)).astype(np.float32)
    mine = np.concatenate([np.arange(s * per * n + r * per, s * per * n + (r + 1) * per)
                           for s in range(steps)])

    def model(seed):
        tfk.utils.set_random_seed(seed)
        return tfk.Sequential([tfk.layers.Dense(8, activation="tanh", input_shape=(4,)),
                               tfk.layers.Dense(1)])

    for passes in (1, 2):
        reference = model(0)
        reference.compile(optimizer=optimizers.SGD(0.05), loss="mse")
        reference.fit(x, y, batch_size=per * n * passes, epochs=2, shuffle=False, verbose=0)
        trained = model(r)  # the callback makes every rank start from rank 0's weights
        opt = khvd.DistributedOptimizer(optimizers.SGD(0.05), backward_passes_per_step=passes,
                                        average_aggregated_gradients=True)
        trained.compile(optimizer=opt, loss="mse")
        trained.fit(x[mine], y[mine], batch_size=per, epochs=2, shuffle=False, verbose=0,
                    callbacks=[khvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               khvd.callbacks.MetricAverageCallback()])
        for got, want in zip(trained.get_weights(), reference.get_weights()):
            expect(got, want, f"Keras 2 ({kind}) weights, {passes} pass(es) per step", 1e-4)
    plain = tfk.layers.BatchNormalization(axis=1, fused=False)
    synced = khvd.SyncBatchNormalization(axis=1)
    xs = np.arange(n * 4 * 2, dtype=np.float32).reshape(n * 4, 2) ** 1.5
    expect(synced(xs[4 * r:4 * (r + 1)], training=True),
           plain(xs, training=True).numpy()[4 * r:4 * (r + 1)], "Keras 2 SyncBatchNormalization",
           1e-4)
    print("keras2 checked", flush=True)


def join():
    """Rank r runs r + 1 steps; the ranks that ran out of data join and add zeros."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for step in range(r + 1):
        got = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name="step")
        expect(got, [n - step], f"step {step} with {step} ranks joined")
    assert int(hvd.join()) == n - 1
    print("join checked", flush=True)


def errors():
    """Calls that differ between ranks fail on every rank and the next calls go on; a rank's own
    wrong argument fails on that rank; messages name the ranks' calls."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for shape in ([3 + r], [2, 6] if r == 0 else [2, 3, 2]):
        try:
            hvd.allreduce(tf.ones(shape))
            raise AssertionError("an all-reduce of different shapes succeeded")
        except tf.errors.FailedPreconditionError as e:
            assert "differs between ranks" in str(e) and "rank 0 submitted" in str(e), str(e)
    try:
        hvd.allgather(tf.ones([2, 3 + r]))
        raise AssertionError("an allgather of different row shapes succeeded")
    except tf.errors.FailedPreconditionError as e:
        assert "allgather of" in str(e), str(e)
    try:
        hvd.broadcast(tf.ones([2]), r)
        raise AssertionError("broadcasts from different roots succeeded")
    except tf.errors.FailedPreconditionError as e:
        assert "from rank" in str(e), str(e)
    expect(hvd.allreduce(tf.ones([2]), op=hvd.Sum), [n, n], "the call after the errors")
    for bad in (lambda: hvd.broadcast(tf.ones([1]), n),
                lambda: hvd.alltoall(tf.ones([n + 1])),
                lambda: hvd.alltoall(tf.ones([n]), splits=[n + 1] + [0] * (n - 1))):
        try:
            bad()
            raise AssertionError("a wrong argument was taken")
        except tf.errors.InvalidArgumentError as e:
            assert f"rank {r}:" in str(e), str(e)
    try:
        hvd.allreduce(tf.ones([1]), op=hvd.Adasum)
        raise AssertionError("Adasum was taken")
    except NotImplementedError:
        pass
    hvd.shutdown()
    try:
        hvd.allreduce(tf.ones([1]))
        raise AssertionError("a call after shutdown() was taken")
    except tf.errors.FailedPreconditionError as e:
        assert "init()" in str(e), str(e)
    print("errors checked", flush=True)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
