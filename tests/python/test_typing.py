"""dtrain's types as a type checker sees the package users install: the package (build/python)
passes mypy with pyproject.toml's settings (strict), through py.typed and the stubs of its
extensions (python/dtrain/*.pyi); a typed script using the public API passes --strict with the
types it should get; misuse is reported; and each stub names what its extension defines."""
import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("mypy", reason="mypy is not installed (scripts/install-deps.sh installs it)")

import dtrain  # noqa: E402

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.dirname(os.path.abspath(dtrain.__file__))  # the package under test
CONFIG = os.path.join(SOURCE, "pyproject.toml")
EXTENSIONS = ("_core", "_torch", "_tensorflow")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("mypy-cache"))


def _mypy(args, cache, cwd):
    """mypy over the package that `import dtrain` finds here, as an installed package (PEP 561:
    read only when it has py.typed); returns (exit code, output)."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(PACKAGE))
    env.pop("MYPYPATH", None)
    p = subprocess.run([sys.executable, "-m", "mypy", "--config-file", CONFIG, "--cache-dir",
                        cache, "--show-error-codes", "--no-color-output", *args],
                       env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    return p.returncode, p.stdout + p.stderr


def _modules():
    """The package's modules as the source tree has them (a build folder may keep files that the
    source no longer has)."""
    root = os.path.join(SOURCE, "python")
    names = []
    for folder, _, files in os.walk(os.path.join(root, "dtrain")):
        for f in files:
            if f.endswith((".py", ".pyi")) and not f.startswith("."):
                path = os.path.relpath(os.path.join(folder, f[:f.rindex(".")]), root)
                names.append(path.replace(os.sep, ".").removesuffix(".__init__"))
    return sorted(set(names))


def test_the_package_ships_py_typed_and_a_stub_for_every_extension():
    assert os.path.isfile(os.path.join(PACKAGE, "py.typed")), \
        f"{PACKAGE} has no py.typed: type checkers ignore the package (rebuild to copy it)"
    for name in EXTENSIONS:
        compiled = [f for f in os.listdir(PACKAGE) if f.startswith(name + ".") and f.endswith(".so")]
        if compiled:
            assert os.path.isfile(os.path.join(PACKAGE, name + ".pyi")), \
                f"dtrain.{name} has no stub {name}.pyi beside {compiled[0]} in {PACKAGE}"


def test_the_package_passes_mypy_with_its_stubs(tmp_path, cache):
    args = [a for m in _modules() for a in ("-m", m)]
    code, out = _mypy(args, cache, tmp_path)
    assert code == 0 and "Success: no issues found" in out, out


USAGE = textwrap.dedent('''
    from datetime import timedelta
    from typing import Any

    import numpy as np
    import torch
    from numpy.typing import NDArray
    from typing_extensions import assert_type

    import dtrain
    import dtrain.data
    import dtrain.pipeline
    import dtrain.ps
    import dtrain.torch as hvd


    def numpy_group() -> None:
        pg = dtrain.init(timeout=timedelta(seconds=30))
        x: NDArray[np.float32] = np.zeros(4, np.float32)
        assert_type(pg.allreduce(x, op="max"), NDArray[np.float32])
        assert_type(pg.allgather(x), NDArray[Any])
        assert_type(pg.gather(x, root=0), NDArray[Any] | None)
        assert_type(pg.recv(x), int)
        pg.isend(x, dst=1).wait(timeout=5.0)
        sub = pg.new_group([0, 1])
        if sub is not None:
            assert_type(sub.rank, int)
        layout = dtrain.ParallelLayout(pg, pipeline_stages=2)
        assert_type(layout.data_group, dtrain.ProcessGroup)
        try:
            pg.barrier()
        except dtrain.TimeoutError as e:
            assert_type(e, dtrain.TimeoutError)
            assert isinstance(e, TimeoutError)
        assert_type(dtrain.dump_flight_record(), str)


    def data_ps_pipeline() -> None:
        records = dtrain.data.ShardedDataset("/data/train-*.tfrecord", seed=1)
        for sample in records:
            assert_type(sample, bytes | dict[str, bytes | str])
        sizes = dtrain.data.ShardedDataset(["a.tar", "b.tar"], decode=len, on_bad_record="skip")
        for n in sizes:
            assert_type(n, int)
        assert_type(sizes.consumed(10), int)
        client = dtrain.ps.Client()
        w = np.zeros(10, np.float32)
        client.create_dense("w", w, optimizer="adam", lr=0.1)
        client.push_pull("w", w, w).wait(timeout=10)
        report = dtrain.pipeline.verify(dtrain.pipeline.schedule("1f1b", 4, 8), forward=2.0)
        assert_type(report["bubble"], float)
        assert_type(dtrain.pipeline.balance([1.0, 2.0, 3.0], 2), list[int])


    def horovod() -> None:
        hvd.init()
        model = torch.nn.Linear(4, 2)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters(),
                                             compression=hvd.Compression.fp16)
        assert_type(optimizer, torch.optim.SGD)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        assert_type(hvd.allreduce(torch.ones(3), op=hvd.Sum), torch.Tensor)
        handle = hvd.allreduce_async_(torch.ones(3), name="x")
        assert_type(hvd.poll(handle), bool)
        assert_type(hvd.alltoall(torch.ones(4)), torch.Tensor)
        assert_type(hvd.alltoall(torch.ones(4), splits=[2, 2]), tuple[torch.Tensor, torch.Tensor])
        assert_type(hvd.broadcast_object({"lr": 0.1}), dict[str, float])
        assert_type(hvd.allgather_object(3), list[int])
        ckpt = hvd.CheckpointManager("ckpt", keep=2)
        ckpt.save(model, optimizer, step=1)
        loaded = ckpt.load_latest(model, optimizer)
        if loaded is not None:
            assert_type(loaded.epoch, int)
        assert_type(list(hvd.DistributedSampler(100, seed=1)), list[int])
        progress = hvd.ProgressReporter(hvd.rank())
        progress.step(1, 32)
        assert_type(progress.active, bool)
        state = hvd.elastic.TorchState(model, optimizer, epoch=0)

        @hvd.elastic.run
        def train(state: hvd.elastic.TorchState, epochs: int) -> float:
            for state.epoch in range(state.epoch, epochs):
                state.commit()
            return 0.0

        assert_type(train(state, 3), float)
''')


def test_a_typed_script_using_the_public_api_passes_mypy_strict(tmp_path, cache):
    (tmp_path / "usage.py").write_text(USAGE)
    code, out = _mypy(["--strict", "usage.py"], cache, tmp_path)
    assert code == 0 and "Success: no issues found" in out, out


MISUSE = textwrap.dedent('''
    import numpy as np
    import torch

    import dtrain
    import dtrain.pipeline
    import dtrain.torch as hvd

    pg = dtrain.init(timeout="30 s")  # E: arg-type
    pg.allreduce([1.0, 2.0])  # E: type-var
    pg.broadcast(np.zeros(3), root="0")  # E: arg-type
    dtrain.pipeline.schedule("1f1b", 4, "8")  # E: arg-type
    hvd.allreduce(torch.ones(3), op="sum")  # E: arg-type
    adam: torch.optim.Adam = hvd.DistributedOptimizer(torch.optim.SGD([]))  # E: assignment
    hvd.CheckpointManager("ckpt").save(torch.nn.Linear(1, 1), epoch=1)  # E: call-arg
    hvd.synchronise(1)  # E: attr-defined
''')


def test_misuse_of_the_api_is_reported(tmp_path, cache):
    (tmp_path / "misuse.py").write_text(MISUSE)
    code, out = _mypy(["--strict", "misuse.py"], cache, tmp_path)
    expected = {(n, m.group(1)) for n, line in enumerate(MISUSE.splitlines(), 1)
                if (m := re.search(r"# E: ([\w-]+)", line))}
    found = {(int(m.group(1)), m.group(2))
             for m in re.finditer(r"^misuse\.py:(\d+): error: .*\[([\w-]+)\]$", out, re.M)}
    assert code == 1 and found == expected, out


RUNTIME_NAMES = textwrap.dedent('''
    import importlib, json, sys
    if sys.argv[1] == "_tensorflow":
        import dtrain.tensorflow  # loads the op library first, as the package does
    m = importlib.import_module("dtrain." + sys.argv[1])
    def public(names):
        return sorted(n for n in names if not n.startswith("__") and "pybind11" not in n)
    print(json.dumps({n: public(vars(v)) if isinstance(v, type) else None
                      for n, v in vars(m).items() if n in public([n])}))
''')


def _stub_names(path):
    """{name: [member, ...] for a class, None otherwise} of what the stub says exists at run
    time: not its TypedDicts and aliases, which only type checkers see."""
    tree = ast.parse(open(path).read())
    typed_dicts = {"TypedDict"}
    names = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
            if bases & typed_dicts:
                typed_dicts.add(node.name)
                continue
            names[node.name] = sorted(
                f.name for f in node.body if isinstance(f, ast.FunctionDef)
                and not (f.name.startswith("__") and f.name.endswith("__")))
        elif isinstance(node, ast.FunctionDef):
            names[node.name] = None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = None  # a constant of the module
    return names


@pytest.mark.parametrize("name", EXTENSIONS)
def test_each_stub_names_what_its_extension_defines(name):
    if importlib.util.find_spec(f"dtrain.{name}") is None:
        pytest.skip(f"dtrain.{name} is not built")
    if name == "_tensorflow" and importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed")
    p = subprocess.run([sys.executable, "-c", RUNTIME_NAMES, name], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    runtime = json.loads(p.stdout.splitlines()[-1])
    stub = _stub_names(os.path.join(PACKAGE, f"{name}.pyi"))
    assert sorted(stub) == sorted(runtime), (
        f"only in the stub: {sorted(set(stub) - set(runtime))}; "
        f"only in dtrain.{name}: {sorted(set(runtime) - set(stub))}")
    for cls, members in stub.items():
        if members is not None:
            have = [m for m in runtime[cls] if not m.startswith("_")]
            assert members == have, (f"{cls}: only in the stub: {sorted(set(members) - set(have))};"
                                     f" only in dtrain.{name}: {sorted(set(have) - set(members))}")
