"""Horovod's @hvd.elastic.run, one for every framework's Horovod API (dtrain.torch.elastic,
dtrain.tensorflow.elastic): the function starts from the newest commit a restart left, if any,
with every rank holding the same state."""
import functools


def elastic_run(function, collectives):
    """`function(state, ...)` after `collectives.init()`, the state's resume (collective: the
    newest commit any rank holds) and sync; the reset callbacks run after a resume."""
    @functools.wraps(function)
    def wrapper(state, *args, **kwargs):
        if not collectives.is_initialized():
            collectives.init()
        resumed = state._resume()
        state.sync()
        if resumed:
            for callback in state._reset_callbacks:
                callback()
        return function(state, *args, **kwargs)
    return wrapper
