"""dtrain from Python without torch (NumPy arrays) and the parameter server from Python, in real
processes over real sockets: every operation against values computed locally at world sizes 1-4,
torch made unimportable, Ctrl-C during a blocked receive, and sync, async and sparse tables under
`dtrain run --servers 1`."""
import json
import os
import subprocess

import pytest

import harness

DTRAIN = os.environ.get("DTRAIN_BIN", os.path.join(harness.HERE, "../../build/bin/dtrain"))


def core(world, name, *args, timeout=120):
    return harness.run(world, name, *args, backend=None, script="core_workers.py",
                       timeout=timeout)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_operation_on_numpy_arrays(world):
    results = core(world, "collectives")
    harness.check_ok(results)
    assert all("every collective checked" in r.out for r in results)


def test_the_step_shapes_of_a_world_that_changed_size():
    from dtrain import _core
    assert _core.step_shape("keep-rank-batch", 100, 0.1, 4, 3) == (100, 0.1)
    assert _core.step_shape("scale-lr", 100, 0.3, 3, 2) == (100, pytest.approx(0.2))
    assert _core.step_shape("keep-global-batch", 100, 0.1, 4, 3) == (134, 0.1)
    assert _core.step_shape("keep-global-batch", 100, 0.1, 2, 4) == (50, 0.1)
    with pytest.raises(_core.InvalidArgumentError, match="'halve' is no way to resize a step: "
                       "keep-rank-batch, scale-lr or keep-global-batch"):
        _core.step_shape("halve", 100, 0.1, 4, 3)
    with pytest.raises(_core.InvalidArgumentError, match="0 rank\\(s\\) now and 4 at start"):
        _core.step_shape("scale-lr", 100, 0.1, 4, 0)


def test_import_dtrain_works_without_torch():
    results = core(2, "no_torch")
    harness.check_ok(results)
    assert all("dtrain worked without torch" in r.out for r in results)


def test_ctrl_c_interrupts_a_blocked_receive_with_a_clear_error():
    code, out, seconds = harness.interrupt_rank0("core_workers.py", "interrupted")
    assert code == 0 and "interrupted after" in out, out
    assert seconds < 5, out


def _has_torch():
    return subprocess.run([harness.PYTHON, "-c", "import torch"], capture_output=True).returncode == 0


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_the_parameter_server_from_python(kind):
    if kind == "torch" and not _has_torch():
        pytest.skip("torch is not installed")
    env = harness.env_for(0, 1, 0)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.run([DTRAIN, "run", "--servers", "1", "-n", "2", "--",
                        *harness.command("core_workers.py", "ps", None, [kind])],
                       env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count(f"parameter server checked ({kind})") == 2, p.stdout + p.stderr


def test_the_python_ctr_example_learns_through_the_parameter_server():
    env = harness.env_for(0, 1, 0)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    example = os.path.join(harness.HERE, "../../examples/python/ctr_sparse.py")
    p = subprocess.run([DTRAIN, "run", "--servers", "2", "-n", "2", "--", harness.PYTHON, example,
                        "--steps", "300", "--ps-mode", "sync"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    result = json.loads(p.stdout.split("RESULT ", 1)[1].splitlines()[0])
    # Better than guessing the mean click rate, and not better than the truth.
    assert result["test_logloss"] < result["constant_logloss"] - 0.05, result
    assert result["test_logloss"] > result["generating_logloss"] - 0.01, result
