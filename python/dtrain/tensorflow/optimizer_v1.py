"""Horovod's DistributedOptimizer for TensorFlow 1 optimizers (tf.compat.v1.train.Optimizer) and
BroadcastGlobalVariablesHook: the reference material's TF1-style training, in a tf.compat.v1
graph and session."""
import tensorflow as tf

from dtrain.tensorflow.collectives import Average
from dtrain.tensorflow.compression import Compression
from dtrain.tensorflow.functions import broadcast_global_variables
from dtrain.tensorflow.gradients import GradientReducer


class DistributedOptimizerV1(tf.compat.v1.train.Optimizer):
    """Wraps a tf.compat.v1.train.Optimizer: compute_gradients() returns the gradients
    all-reduced across ranks. With backward_passes_per_step N > 1 the gradients are summed
    locally (in local variables) and all-reduced every N-th call; apply_gradients() applies them
    then, and on the other calls only advances global_step."""

    def __init__(self, optimizer, name=None, use_locking=False, compression=Compression.none,
                 sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0,
                 backward_passes_per_step=1, average_aggregated_gradients=False,
                 scale_local_gradients=True):
        name = name or f"Distributed{type(optimizer).__name__}"
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._reducer = GradientReducer(name, compression, sparse_as_dense, op,
                                        gradient_predivide_factor, scale_local_gradients)
        self._passes = backward_passes_per_step
        self._average_aggregated = average_aggregated_gradients
        self._sparse_as_dense = sparse_as_dense
        self._counter = None
        self._sums = None

    def register_local_var(self, var):
        self._reducer.register_local(var)

    def compute_gradients(self, *args, **kwargs):
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        if self._passes == 1:
            return list(zip(self._reducer(grads, variables), variables))
        return list(zip(self._aggregated(grads, variables), variables))

    def _aggregated(self, grads, variables):
        """The gradients summed over the last N calls and all-reduced, at every N-th call; the
        running sums at the others (apply_gradients does not apply those)."""
        dense = []
        for g in grads:
            if isinstance(g, tf.IndexedSlices):
                if not self._sparse_as_dense:
                    raise ValueError("backward_passes_per_step > 1 needs sparse_as_dense=True "
                                     "for sparse gradients (tf.IndexedSlices)")
                g = tf.convert_to_tensor(g)
            dense.append(g)
        if self._counter is None:
            local = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
            with tf.compat.v1.variable_scope(f"{self.get_name()}_aggregation",
                                             reuse=tf.compat.v1.AUTO_REUSE):
                self._counter = tf.compat.v1.get_variable(
                    "counter", shape=(), dtype=tf.int32, trainable=False,
                    initializer=tf.compat.v1.zeros_initializer(), collections=local)
                self._sums = [None if g is None else tf.compat.v1.get_variable(
                    f"sum_{i}", shape=g.shape, dtype=g.dtype, trainable=False,
                    initializer=tf.compat.v1.zeros_initializer(), collections=local)
                    for i, g in enumerate(dense)]
        added = [s.assign_add(g) for s, g in zip(self._sums, dense) if g is not None]
        with tf.control_dependencies(added):
            count = self._counter.assign_add(1)
        sums = [None if s is None else s.read_value() for s in self._sums]

        def reduce_and_reset():
            with tf.control_dependencies([count]):
                scale = 1.0 / self._passes if self._average_aggregated else 1.0
                values = [None if s is None else s * scale for s in sums]
                reduced = self._reducer(values, variables)
            with tf.control_dependencies([r for r in reduced if r is not None]):
                resets = [s.assign(tf.zeros_like(s)) for s in self._sums if s is not None]
                resets.append(self._counter.assign(0))
            with tf.control_dependencies(resets):
                return [None if r is None else tf.identity(r) for r in reduced]

        def keep():
            with tf.control_dependencies([count]):
                return [None if s is None else tf.identity(s) for s in sums]

        present = [i for i, s in enumerate(sums) if s is not None]

        def only_present(values):
            return [values[i] for i in present]

        chosen = tf.cond(tf.equal(count, self._passes),
                         lambda: only_present(reduce_and_reset()),
                         lambda: only_present(keep()))
        out = [None] * len(sums)
        for i, value in zip(present, chosen):
            out[i] = value
        return out

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        if self._passes == 1:
            return self._optimizer.apply_gradients(grads_and_vars, global_step, name)
        grads_and_vars = list(grads_and_vars)

        def apply():
            return tf.group(self._optimizer.apply_gradients(grads_and_vars, global_step, name))

        def skip():
            return tf.group(global_step.assign_add(1)) if global_step is not None else tf.no_op()

        # The counter was reset to 0 by the call whose gradients were all-reduced.
        return tf.cond(tf.equal(self._counter, 0), apply, skip)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """A SessionRunHook that broadcasts rank `root_rank`'s global variables to every rank once
    the session is created (Horovod's sample uses it with MonitoredTrainingSession)."""

    def __init__(self, root_rank, device=""):
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op = None

    def begin(self):
        if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)
