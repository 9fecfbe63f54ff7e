"""The Python layer's defaults are the C++ engine's: every keyword default of dtrain's Python API
that a C++ options struct (or the table of environment variables) also has is read from it
through the bindings, never written again in Python. Each test compares the Python defaults with
what the extension reports, then makes the extension report other values and imports the Python
module again: a default written as a literal would not follow."""
import importlib
import importlib.util
import inspect
import os
import subprocess
import sys
from datetime import timedelta
from types import SimpleNamespace

import numpy as np
import pytest

from dtrain import _core, _horovod_settings

HERE = os.path.dirname(os.path.abspath(__file__))


def _fields(options):
    """The public attributes of an options object, sorted."""
    return sorted(n for n in dir(options) if not n.startswith("_"))


def _other(value):
    """A value of the same kind that differs from `value`; for an options object, one whose every
    field differs."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value * 2 + 3
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, timedelta):
        return value * 2 + timedelta(seconds=3)
    if isinstance(value, dict):
        return {k: _other(v) for k, v in value.items()}
    return SimpleNamespace(**{n: _other(getattr(value, n)) for n in _fields(value)})


def _defaults(function, names):
    parameters = inspect.signature(function).parameters
    return {n: parameters[n].default for n in names}


def _values(options, names):
    return {n: getattr(options, n) for n in names}


@pytest.fixture
def reimport(monkeypatch):
    """reimport(module, extension, {class name: options}): `module` imported again while the
    extension's options classes construct the objects given; imported again as it was after the
    test."""
    modules = []

    def run(module, extension, replacements):
        for name, options in replacements.items():
            monkeypatch.setattr(extension, name, lambda options=options: options)
        modules.append(module)
        return importlib.reload(module)

    yield run
    monkeypatch.undo()
    for module in modules:
        importlib.reload(module)


def test_the_sharded_dataset_takes_its_defaults_from_cpp(reimport):
    # Imported here rather than at the top: it imports torch, which the process of check_keras_ps
    # (which imports this file) should not.
    import dtrain.data
    cpp = _core.ShardedDatasetOptions()
    names = _fields(cpp)
    assert "shuffle_window" in names and "prefetch_bytes" in names, names
    assert _defaults(dtrain.data.ShardedDataset.__init__, names) == _values(cpp, names)

    other = _other(cpp)
    data = reimport(dtrain.data, _core, {"ShardedDatasetOptions": other})
    assert _defaults(data.ShardedDataset.__init__, names) == _values(other, names)


class _Recorder:
    """Stands in for _core.PsClient: remembers each call's arguments."""

    def __init__(self):
        self.calls = {}

    def __getattr__(self, name):
        def record(*args, **kwargs):
            self.calls[name] = (args, kwargs)
        return record


def _check_ps(ps, dense, sparse):
    """dtrain.ps (module `ps`) gives the C++ client the values of `dense` (TableOptions) and
    `sparse` (SparseTableOptions) for every option the caller leaves out."""
    table = ["optimizer", "consistency", "staleness"]
    assert _defaults(ps.Client.create_dense, table) == _values(dense, table)
    rows = ["init", "a", "b", "seed", "evict_after_s"]
    assert _defaults(ps.Client.create_sparse, rows + table) == {
        **_values(sparse, rows), **_values(sparse.table, table)}

    client = ps.Client.__new__(ps.Client)  # no servers: the calls go to the recorder
    client._client = recorder = _Recorder()
    client.create_dense("w", np.zeros(2, np.float32))
    args, kwargs = recorder.calls["create_dense"]
    assert args[2] == dense.optimizer
    assert kwargs == {"consistency": dense.consistency, "staleness": dense.staleness,
                      **dense.optimizer_options}
    client.create_sparse("e", 4)
    args, kwargs = recorder.calls["create_sparse"]
    assert args[2:] == (sparse.init, sparse.a, sparse.b, sparse.seed, sparse.table.optimizer)
    assert kwargs == {"consistency": sparse.table.consistency,
                      "staleness": sparse.table.staleness, "evict_after_s": sparse.evict_after_s,
                      **sparse.table.optimizer_options}


def test_the_parameter_server_client_takes_its_defaults_from_cpp(reimport):
    import dtrain.ps
    dense, sparse = _core.PsTableOptions(), _core.PsSparseTableOptions()
    assert set(dense.optimizer_options) >= {"lr", "momentum", "beta1", "beta2", "eps"}
    _check_ps(dtrain.ps, dense, sparse)

    dense, sparse = _other(dense), _other(sparse)
    ps = reimport(dtrain.ps, _core, {"PsTableOptions": dense, "PsSparseTableOptions": sparse})
    _check_ps(ps, dense, sparse)


def check_keras_ps(which):
    """Run in a fresh interpreter by the test below (TensorFlow and torch in one process are best
    avoided): dtrain.tensorflow.ps takes its defaults from C++ (`which`: "cpp"), and follows the
    extension when it reports others ("other"). Prints "ok", or "skip: why"."""
    dense, sparse = _core.PsTableOptions(), _core.PsSparseTableOptions()
    if which == "other":
        dense, sparse = _other(dense), _other(sparse)
        _core.PsTableOptions = lambda: dense
        _core.PsSparseTableOptions = lambda: sparse
    try:
        import dtrain.tensorflow.ps as keras_ps
    except ImportError as e:
        print(f"skip: {e}")
        return
    table = ["optimizer", "consistency", "staleness"]
    assert _defaults(keras_ps.ServerOptimizer.__init__, table) == _values(dense, table)
    assert _defaults(keras_ps.Embedding.__init__, ["seed", "lr"] + table) == {
        "seed": sparse.seed, "lr": sparse.table.optimizer_options["lr"],
        **_values(sparse.table, table)}
    print("ok")


@pytest.mark.parametrize("which", ["cpp", "other"])
def test_the_keras_parameter_server_layers_take_their_defaults_from_cpp(which):
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed")
    p = subprocess.run([sys.executable, "-c",
                        f"import test_defaults as t; t.check_keras_ps({which!r})"],
                       cwd=HERE, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    if last.startswith("skip: "):
        pytest.skip(last[len("skip: "):])
    assert last == "ok", p.stdout + p.stderr


def test_pipeline_functions_leave_the_defaults_to_cpp(monkeypatch):
    # The C++ defaults (ScheduleOptions, Costs) are the binding's keyword defaults: Python passes
    # nothing the caller did not give.
    import dtrain.pipeline
    calls = {}

    def recorder(name):
        return lambda *args, **kwargs: calls.setdefault(name, (args, kwargs))

    for name in ("pipeline_schedule", "pipeline_verify"):
        monkeypatch.setattr(_core, name, recorder(name))
    dtrain.pipeline.schedule("1f1b", 2, 4)
    dtrain.pipeline.verify("{}")
    assert calls == {"pipeline_schedule": (("1f1b", 2, 4), {}),
                     "pipeline_verify": (("{}",), {})}


_HOROVOD = {"DTRAIN_CYCLE_TIME_MS": "HOROVOD_CYCLE_TIME",
            "DTRAIN_FUSION_THRESHOLD": "HOROVOD_FUSION_THRESHOLD",
            "DTRAIN_STALL_TIMEOUT": "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"}


def _settings_from(table):
    """What the Horovod session settings are, unset, when the table has these defaults."""
    return (timedelta(milliseconds=float(table["DTRAIN_CYCLE_TIME_MS"])),
            int(table["DTRAIN_FUSION_THRESHOLD"]),
            timedelta(seconds=float(table["DTRAIN_STALL_TIMEOUT"])))


def test_the_horovod_settings_default_to_the_cpp_table_of_variables(monkeypatch):
    for name in (*_HOROVOD, *_HOROVOD.values()):
        monkeypatch.delenv(name, raising=False)
    table = {name: default for name, default, _ in _core.env_table()}
    assert all(table.get(name) for name in _HOROVOD), table
    assert _horovod_settings.session_settings() == _settings_from(table)

    other = dict(table)
    other["DTRAIN_CYCLE_TIME_MS"] = str(float(table["DTRAIN_CYCLE_TIME_MS"]) * 2 + 3)
    other["DTRAIN_FUSION_THRESHOLD"] = str(int(table["DTRAIN_FUSION_THRESHOLD"]) * 2 + 3)
    other["DTRAIN_STALL_TIMEOUT"] = str(float(table["DTRAIN_STALL_TIMEOUT"]) * 2 + 3)
    monkeypatch.setattr(_core, "env_table", lambda: [(n, d, "") for n, d in other.items()])
    assert _horovod_settings.session_settings() == _settings_from(other)


def test_the_checkpoint_manager_and_sampler_take_their_defaults_from_cpp(reimport):
    if importlib.util.find_spec("torch") is None or \
            importlib.util.find_spec("dtrain._torch") is None:
        pytest.skip("needs torch and dtrain._torch")
    import dtrain.torch.checkpoint as checkpoint
    from dtrain import _torch

    def check(module, manager, sampler):
        names = ["keep", "writer_rank", "async_write", "copy_in_background"]
        assert _defaults(module.CheckpointManager.__init__, names + ["write_timeout"]) == {
            **_values(manager, names), "write_timeout": manager.write_timeout.total_seconds()}
        names = _fields(sampler)
        assert names == ["drop_last", "seed", "shuffle"], names
        assert _defaults(module.DistributedSampler.__init__, names) == _values(sampler, names)

    manager, sampler = _torch.CheckpointOptions(), _torch.DistributedSamplerOptions()
    check(checkpoint, manager, sampler)

    manager, sampler = _other(manager), _other(sampler)
    module = reimport(checkpoint, _torch,
                      {"CheckpointOptions": manager, "DistributedSamplerOptions": sampler})
    check(module, manager, sampler)
