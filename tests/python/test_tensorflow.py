"""Horovod's TensorFlow API (`import dtrain.tensorflow as hvd`) in real processes over real
sockets (tests/python/harness.py): every collective against values computed locally, the ops
inside tf.function with their gradients, DistributedGradientTape and Keras' model.fit against one
process on the whole batches, join, and errors; Keras against dtrain's parameter servers;
TensorFlow's own strategy under `dtrain run --tf-config`; `import dtrain` without TensorFlow."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import harness

ROOT = os.path.normpath(os.path.join(harness.HERE, "..", ".."))
DTRAIN = os.environ.get("DTRAIN_BIN", os.path.join(ROOT, "build/bin/dtrain"))
EXAMPLE = os.path.join(ROOT, "examples/python/horovod_keras_fashion_mnist.py")


def tf_run(world, name, *args, timeout=240):
    return harness.run(world, name, *args, backend=None, script="tf_workers.py",
                       timeout=timeout)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_collective_matches_local_values(world):
    results = tf_run(world, "collectives")
    harness.check_ok(results)
    assert all("every collective checked" in r.out for r in results)


@pytest.mark.parametrize("name", ["graph", "tape", "join", "errors", "reducescatter", "layers",
                                  "accumulate", "graph_v1"])
def test_at_two_ranks(name):
    harness.check_ok(tf_run(2, name))


def test_reducescatter_at_three_ranks():
    harness.check_ok(tf_run(3, "reducescatter"))


def test_elastic_state_commits_and_resumes(tmp_path):
    harness.check_ok(tf_run(2, "elastic_state", str(tmp_path)))


def test_keras_fit_trains_as_one_process_on_the_whole_batches():
    harness.check_ok(tf_run(2, "keras_fit"))


def _has_tf_keras():
    import importlib.util
    return importlib.util.find_spec("tf_keras") is not None


@pytest.mark.skipif(not _has_tf_keras(), reason="tf_keras (Keras 2) is not installed: "
                    "scripts/install-deps.sh --tensorflow installs it")
@pytest.mark.parametrize("kind", ["new", "legacy"])
def test_keras2_fit_trains_as_one_process(kind):
    harness.check_ok(harness.run(2, "keras2_fit", kind, backend=None, script="tf_workers.py",
                                 timeout=300, env={"TF_USE_LEGACY_KERAS": "1"}))


def test_keras_fit_at_three_ranks():
    harness.check_ok(tf_run(3, "keras_fit"))


def test_the_keras_example_trains_under_dtrain_run(tmp_path):
    checkpoint = tmp_path / "model.keras"
    p = subprocess.run([DTRAIN, "run", "-n", "2", "--", harness.PYTHON, EXAMPLE, "--epochs", "1",
                        "--limit", "6000", "--checkpoint", str(checkpoint)],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=harness.env_for(0, 1, 0)["PYTHONPATH"]))
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [line for line in p.stdout.splitlines() if "RESULT " in line]
    assert len(lines) == 1, p.stdout  # rank 0 only
    result = json.loads(lines[0].split("RESULT ", 1)[1])
    assert result["world_size"] == 2 and result["test_accuracy"] > 0.70, result
    assert checkpoint.exists()  # written by rank 0


def test_tensorflows_own_strategy_runs_under_dtrain_run_with_tf_config():
    p = subprocess.run([DTRAIN, "run", "-n", "2", "--tf-config", "--", harness.PYTHON,
                        os.path.join(harness.HERE, "tf_workers.py"), "strategy"],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=harness.env_for(0, 1, 0)["PYTHONPATH"]))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("strategy checked") == 2, p.stdout


@pytest.mark.parametrize("consistency", ["sync", "async", "bounded"])
def test_keras_fit_against_dtrains_parameter_servers(consistency):
    p = subprocess.run([DTRAIN, "run", "--servers", "1", "-n", "2", "--", harness.PYTHON,
                        os.path.join(harness.HERE, "tf_workers.py"), "ps_keras", consistency],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=harness.env_for(0, 1, 0)["PYTHONPATH"]))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("ps_keras checked") == 2, p.stdout


def test_the_keras_parameter_server_example_learns():
    example = os.path.join(ROOT, "examples/python/keras_ps_ctr.py")
    p = subprocess.run([DTRAIN, "run", "--servers", "2", "-n", "2", "--", harness.PYTHON,
                        example, "--steps", "100"], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=harness.env_for(0, 1, 0)["PYTHONPATH"]))
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [line for line in p.stdout.splitlines() if "RESULT " in line]
    assert len(lines) == 1, p.stdout  # worker 0 only
    result = json.loads(lines[0].split("RESULT ", 1)[1])
    assert result["test_logloss"] < 0.9 * result["constant_logloss"], result


def _launch_env():
    return dict(os.environ, PYTHONPATH=harness.env_for(0, 1, 0)["PYTHONPATH"])


def test_elastic_state_resumes_a_restarted_job_from_its_commit(tmp_path):
    worker = os.path.join(harness.HERE, "tf_workers.py")
    p = subprocess.run([DTRAIN, "run", "-n", "2", "--", harness.PYTHON, worker, "elastic_fit",
                        str(tmp_path / "straight.npz"), "0"],
                       capture_output=True, text=True, timeout=600, env=_launch_env())
    assert p.returncode == 0, p.stdout + p.stderr
    # Rank 1 dies after step 7; dtrain run restarts both, which resume from the newest commit.
    p = subprocess.run([DTRAIN, "run", "-n", "2", "--max-restarts", "1", "--", harness.PYTHON,
                        worker, "elastic_fit", str(tmp_path / "restarted.npz"), "7"],
                       capture_output=True, text=True, timeout=600, env=_launch_env())
    assert p.returncode == 0, p.stdout + p.stderr
    assert "resumed from commit 7" in p.stdout, p.stdout + p.stderr
    with np.load(tmp_path / "straight.npz") as a, np.load(tmp_path / "restarted.npz") as b:
        for k in a.files:
            assert np.array_equal(a[k], b[k]), k


def _live_run(tmp_path, *args, step_ms=0):
    return subprocess.run([DTRAIN, "run", "-n", "3", "--live", *args, "--", harness.PYTHON,
                           os.path.join(harness.HERE, "tf_workers.py"), "live_elastic",
                           str(tmp_path), "1", "4", str(step_ms)],
                          env=_launch_env(), capture_output=True, text=True, timeout=300)


def _live_reference(tmp_path, *worlds):
    """tf_workers.live_reference's weights, steps and samples trained for `worlds`
    ("SIZE:STEPS")."""
    out = tmp_path / "reference.npz"
    p = subprocess.run([harness.PYTHON, os.path.join(harness.HERE, "tf_workers.py"),
                        "live_reference", str(out), *worlds], env=_launch_env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    steps, samples = map(int, re.search(r"reference steps ([0-9]+) samples ([0-9]+)",
                                        p.stdout).groups())
    with np.load(out) as f:
        return [f[k] for k in f.files], steps, samples


def _trained_once(tmp_path, logs, dead, resumed_at, samples):
    """The first `samples` samples once each in the steps the job kept: the lines of `logs`, of
    the dead rank's only up to `resumed_at`. The ranks of a step name the same live
    generation."""
    trained, generations = [], {}
    for name in logs:
        for line in (tmp_path / f"samples.{name}").read_text().splitlines():
            step, generation, rows = re.fullmatch(
                r"step ([0-9]+) generation ([0-9]+) samples ([0-9,]+)", line).groups()
            if name == str(dead) and int(step) > resumed_at:
                continue
            assert generations.setdefault(step, generation) == generation, (name, line)
            trained += [int(i) for i in rows.split(",")]
    assert sorted(trained) == list(range(samples)), sorted(trained)


def _same_weights(tmp_path, ranks, expected):
    for r in ranks:
        with np.load(tmp_path / f"weights.{r}.npz") as f:
            got = [f[k] for k in f.files]
        assert len(got) == len(expected), r
        for g, e in zip(got, expected):
            assert np.allclose(g, e, rtol=1e-5, atol=1e-6), (r, g, e)


def test_hvd_elastic_recovers_live_when_a_rank_dies(tmp_path):
    # Rank 1 of 3 SIGKILLs itself after its commit of step 4: ranks 0 and 2 re-form without
    # restarting, go back to the newest commit and train the rest of the pass two at a time,
    # ending with the weights of one process trained on the same rows, each sample once.
    p = _live_run(tmp_path)
    resumed_at = harness.survivors_went_on(p)
    text = p.stdout + p.stderr
    expected, steps, samples = _live_reference(tmp_path, f"3:{resumed_at}", "2:end")
    assert p.stdout.count(f"live training finished at step {steps} as rank") == 2, text
    _same_weights(tmp_path, (0, 2), expected)
    _trained_once(tmp_path, ["0", "1", "2"], 1, resumed_at, samples)


@pytest.mark.parametrize("how,preload", [("replace", False), ("spares", False),
                                         ("spares", True)])
def test_hvd_elastic_takes_in_a_replacement_for_a_dead_rank(tmp_path, how, preload):
    # The same with `--replace 1`: a new process takes rank 1's place at a commit of the
    # survivors, syncs the state from them and trains the rest of the pass with them. With
    # `--spares 1` it is a process started with the others, whose init() waited for the place;
    # with `--preload tensorflow` it is forked from a process that imported TensorFlow.
    args = [f"--{how}", "1"] + (["--preload", "tensorflow"] if preload else [])
    p = _live_run(tmp_path, *args, step_ms=2000)  # time for TensorFlow to load
    text = p.stdout + p.stderr
    assert p.returncode == 0, text
    assert ("the fork server (pid" in p.stderr) == preload, text
    assert "--preload: importing" not in p.stderr, text
    assert ("rank 1 at start: tensorflow imported before the script: True" in p.stdout) == \
        preload, text
    if how == "spares":
        assert re.search(r"spare 1 \(pid [0-9]+\) takes the place of rank 1", p.stderr), text
    assert "3 worker(s) ended well; 1 lost along the way (--live)" in p.stderr, text
    resumed_at = harness.resumed_at(p)
    taken = re.findall(r"took in rank\(s\) \[1\] at start at commit ([0-9]+); now rank 0 of 3",
                       p.stdout)
    assert len(taken) == 1, text
    taken_at = int(taken[0])
    expected, steps, samples = _live_reference(tmp_path, f"3:{resumed_at}",
                                               f"2:{taken_at - resumed_at}", "3:end")
    assert p.stdout.count(f"live training finished at step {steps} as rank") == 3, text
    _same_weights(tmp_path, (0, 1, 2), expected)
    _trained_once(tmp_path, ["0", "1", "1r", "2"], 1, resumed_at, samples)


def test_a_dead_peer_fails_the_next_call_naming_it():
    results = tf_run(2, "peer_dies", timeout=120)
    assert results[0].code == 0, results[0].out
    assert "peer death named" in results[0].out, results[0].out


def test_a_killed_parameter_server_fails_keras_naming_it(tmp_path):
    port = harness.free_port()
    cluster = {"ps": [f"127.0.0.1:{port}"], "worker": ["127.0.0.1:1"]}
    env = _launch_env()
    server = subprocess.Popen(
        [DTRAIN, "ps-server"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(env, TF_CONFIG=json.dumps({"cluster": cluster,
                                            "task": {"type": "ps", "index": 0}})))
    flag = tmp_path / "killed"
    worker = subprocess.Popen(
        [harness.PYTHON, os.path.join(harness.HERE, "tf_workers.py"), "ps_server_dies",
         str(flag)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(env, TF_CONFIG=json.dumps({"cluster": cluster,
                                            "task": {"type": "worker", "index": 0}})))
    try:
        for line in worker.stdout:
            if "trained" in line:
                break
        server.kill()
        server.wait(timeout=30)
        flag.touch()
        out, _ = worker.communicate(timeout=120)
    finally:
        for p in (server, worker):
            if p.poll() is None:
                p.kill()
    assert worker.returncode == 0, out
    assert "server death named" in out, out


def test_neither_dtrain_nor_dtrain_torch_imports_tensorflow():
    code = ("import sys, dtrain, dtrain.torch; "
            "assert 'tensorflow' not in sys.modules, 'TensorFlow imported'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=harness.env_for(0, 1, 0), timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr


def test_another_tensorflow_is_refused_at_import_naming_both_versions():
    code = ("import tensorflow as tf; tf.__version__ = '2.19.0'\n"
            "try:\n    import dtrain.tensorflow\nexcept ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=harness.env_for(0, 1, 0), timeout=120)
    assert "built for TensorFlow 2.21" in out.stdout and "2.19.0" in out.stdout, \
        out.stdout + out.stderr
