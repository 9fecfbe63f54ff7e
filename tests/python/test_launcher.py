"""`dtrain run` starts a script written for torchrun unchanged, with either backend: the script's
init_process_group meets the launcher's store (TORCHELASTIC_USE_AGENT_STORE, as under torchrun)."""
import json
import os
import re
import subprocess

import pytest

import harness

DTRAIN = os.environ.get("DTRAIN_BIN", os.path.join(os.path.dirname(__file__), "../../build/bin/dtrain"))


def dtrain_run(args, timeout=240, env_extra=None):
    env = harness.env_for(0, 1, 0, env_extra)
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


def test_torch_distributed_and_dtrains_own_api_in_one_process():
    p = dtrain_run(["-n", "2", "--", harness.PYTHON, os.path.join(harness.HERE, "workers.py"),
                    "both_apis", "dtrain"], env_extra={"DTRAIN_LOG_LEVEL": "debug"})
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("both APIs checked") == 2, p.stdout


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


def test_a_torch_distributed_script_recovers_live_when_a_rank_dies():
    # Rank 1 of 3 dies at step 5: the others catch torch's DistBackendError, re-form the world
    # (dtrain.torch.live), make DDP again and finish with the same weights.
    p = dtrain_run(["-n", "3", "--live", "--", harness.PYTHON,
                    os.path.join(harness.HERE, "workers.py"), "live_ddp", "dtrain", "1", "5"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 worker(s) ended well; 1 lost along the way (--live)" in p.stderr, p.stderr
    done = re.findall(r"rank ([0-9]) at start: live ddp finished at step 12 as rank ([0-9]) of 2 "
                      r"after 1 re-forming\(s\); weights (\S+)", p.stdout)
    assert sorted((a, b) for a, b, _ in done) == [("0", "0"), ("2", "1")], p.stdout + p.stderr
    assert done[0][2] == done[1][2], p.stdout


def test_preload_is_refused_where_it_cannot_fork_the_workers():
    # Nothing to fork without spares or replacements; a command that is not PYTHON SCRIPT or
    # PYTHON -m MODULE cannot be run by the fork server.
    p = dtrain_run(["-n", "1", "--preload", "torch", "--", harness.PYTHON, "-c", "pass"])
    assert p.returncode != 0 and "--preload forks spares and replacements from a process that " \
        "imported the modules: it needs --spares or --replace" in p.stderr, p.stderr
    p = dtrain_run(["-n", "1", "--live", "--spares", "1", "--preload", "torch", "--",
                    harness.PYTHON, "-c", "pass"])
    assert p.returncode != 0 and "the workers' command must be PYTHON [-u] SCRIPT ... or " \
        "PYTHON [-u] -m MODULE ..." in p.stderr, p.stderr


ORPHAN_SCRIPT = """
import os, time
if os.environ["RANK"] == "1" and os.environ.get("DTRAIN_LIVE_REPLACEMENT") != "1":
    if os.fork() == 0:  # outlives this process: the launcher, a subreaper, inherits it
        time.sleep(1)
        os._exit(0)
    os._exit(3)
if os.environ["RANK"] == "0":
    time.sleep(5)
    launcher, zombies = os.getppid(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
        except OSError:
            continue  # gone meanwhile
        if int(ppid) == launcher and state == "Z":
            zombies.append(pid)
    print(f"zombies under the launcher: {len(zombies)}", flush=True)
"""


def test_a_launcher_that_forks_workers_reaps_the_orphans_it_inherits(tmp_path):
    # With --preload the launcher is a subreaper (launch/fork_server.h): a process that a dead
    # worker left behind becomes its child, and is reaped when it exits rather than left a zombie.
    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN_SCRIPT)
    p = dtrain_run(["-n", "2", "--live", "--replace", "1", "--preload", "json", "--",
                    harness.PYTHON, str(script)])
    text = p.stdout + p.stderr
    assert p.returncode == 0, text
    assert "the fork server (pid" in p.stderr, text
    assert "[rank 0] zombies under the launcher: 0" in p.stdout, text


def test_a_rank_that_dies_while_the_world_re_forms_is_left_out_too():
    # Rank 3 of 4 dies at step 5; rank 2 is listed for the next world and dies before it
    # connects. Ranks 0 and 1 give up on that world within the settle time and agree again.
    p = dtrain_run(["-n", "4", "--live", "--", harness.PYTHON,
                    os.path.join(harness.HERE, "workers.py"), "live_ddp", "dtrain", "3", "5", "2"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert "rank 2 at start: listed for generation 1, dying before its world connects" in p.stdout
    assert "generation 1's group did not form" in p.stderr, p.stderr
    assert "2 worker(s) ended well; 2 lost along the way (--live)" in p.stderr, p.stderr
    done = re.findall(r"rank ([0-9]) at start: live ddp finished at step 12 as rank ([0-9]) of 2 "
                      r"after 1 re-forming\(s\); weights (\S+)", p.stdout)
    assert sorted((a, b) for a, b, _ in done) == [("0", "0"), ("1", "1")], p.stdout + p.stderr
    assert done[0][2] == done[1][2], p.stdout


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


def test_metrics_of_a_torch_script_scraped_during_the_run():
    import re
    import time
    import urllib.request
    env = harness.env_for(0, 1, 0)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.Popen([DTRAIN, "run", "-n", "2", "--metrics-port", "0", "--", harness.PYTHON,
                          os.path.join(harness.HERE, "workers.py"), "progress", "dtrain", "150"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in p.stderr:
            m = re.search(r"metrics at http://0\.0\.0\.0:(\d+)/metrics", line)
            if m:
                port = int(m.group(1))
                break
        assert port, "dtrain run did not say where its metrics are"
        values, deadline = {}, time.monotonic() + 60
        while time.monotonic() < deadline:
            assert p.poll() is None, "the job ended early:\n" + p.stderr.read()
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            values = dict(l.rsplit(" ", 1) for l in body.decode().splitlines()
                          if l and not l.startswith("#"))
            if float(values.get('dtrain_step{rank="1"}', 0)) >= 20:
                break
            time.sleep(0.1)
        assert float(values['dtrain_step{rank="1"}']) >= 20, values
        step_s = float(values['dtrain_step_seconds{rank="0"}'])
        assert 0.045 < step_s < 0.2, values
        # Rank 0 waits for rank 1's extra 30 ms inside the backend's all_reduce.
        assert float(values['dtrain_step_communication_seconds{rank="0"}']) > 0.015, values
        assert float(values['dtrain_step_communication_seconds{rank="1"}']) < 0.015, values
    finally:
        rest = p.communicate(timeout=120)[1]
    assert p.returncode == 0, rest
