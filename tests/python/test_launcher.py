"""`dtrain run` starts a script written for torchrun unchanged, with either backend: the script's
init_process_group meets the launcher's store (TORCHELASTIC_USE_AGENT_STORE, as under torchrun)."""
import json
import os
import subprocess

import pytest

import harness

DTRAIN = os.environ.get("DTRAIN_BIN", os.path.join(os.path.dirname(__file__), "../../build/bin/dtrain"))


def dtrain_run(args, timeout=240):
    env = harness.env_for(0, 1, 0)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return subprocess.run([DTRAIN, "run", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("backend", ["gloo", "dtrain"])
def test_dtrain_run_starts_a_torchrun_script_unchanged(tmp_path, backend):
    out = tmp_path / "result.json"
    p = dtrain_run(["-n", "2", "--", harness.PYTHON, os.path.join(harness.HERE, "workers.py"),
                    "ddp", backend, str(out), "plain"])
    assert p.returncode == 0, p.stdout + p.stderr
    result = json.loads(out.read_text())
    assert len(result["losses"]) == 12


def test_every_operation_under_dtrain_run(tmp_path):
    p = dtrain_run(["-n", "3", "--", harness.PYTHON, os.path.join(harness.HERE, "workers.py"),
                    "ops", "dtrain"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("every operation checked") == 3, p.stdout


def test_a_failing_rank_fails_the_job_with_its_name():
    p = dtrain_run(["-n", "3", "--", harness.PYTHON, os.path.join(harness.HERE, "workers.py"),
                    "killed", "dtrain", "1"])
    assert p.returncode != 0
    text = p.stdout + p.stderr
    assert "rank 1" in text, text


def test_an_elastic_run_restarts_python_workers_which_resume_from_their_checkpoint(tmp_path):
    p = dtrain_run(["-n", "2", "--max-restarts", "1", "--", harness.PYTHON,
                    os.path.join(harness.HERE, "workers.py"), "elastic_resume", "dtrain",
                    str(tmp_path)])
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("attempt 1 finished with total 72.0") == 2, p.stdout + p.stderr


def test_torchrun_with_the_dtrain_backend(tmp_path):
    # Debian's torchrun needs --redirects and --tee set on Python 3.11 (its default crashes).
    out = tmp_path / "result.json"
    env = harness.env_for(0, 1, 0)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.run([harness.PYTHON, "-m", "torch.distributed.run", "--nnodes", "1",
                        "--nproc_per_node", "2", "--master_port", str(harness.free_port()),
                        "--redirects", "2", "--tee", "2",
                        os.path.join(harness.HERE, "workers.py"), "ddp", "dtrain", str(out), "plain"],
                       env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    assert len(json.loads(out.read_text())["losses"]) == 12


@pytest.mark.skipif(not os.path.exists("/usr/bin/mpirun"), reason="OpenMPI's mpirun is not installed")
def test_mpirun_with_the_dtrain_backend(tmp_path):
    # OpenMPI sets OMPI_COMM_WORLD_*, not RANK: import dtrain.torch fills torch's variables.
    out = tmp_path / "result.json"
    env = harness.env_for(0, 1, 0)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        env.pop(k, None)
    env["MASTER_PORT"] = str(harness.free_port())
    p = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
                        "-x", "MASTER_PORT", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS",
                        harness.PYTHON, os.path.join(harness.HERE, "workers.py"), "ddp", "dtrain",
                        str(out), "plain"],
                       env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    assert len(json.loads(out.read_text())["losses"]) == 12
