"""A job that hangs, disagrees or is slow, from Python (tests/python/fault_workers.py): through
torch.distributed on backend "dtrain" and through the Horovod API, under `dtrain run` with
DTRAIN_HANG_SECONDS=10. The launcher names the right rank and call within 15 s of the hang (the
workers print when they reach it), with where the rank's Python threads are, and stops the job;
`dtrain doctor --json` reads the same records again. The C++ side of the same faults is
tests/launch/doctor_test.cc."""
import json
import os
import subprocess
import time

import pytest

import harness

ROOT = os.path.normpath(os.path.join(harness.HERE, "..", ".."))
DTRAIN = os.environ.get("DTRAIN_BIN", os.path.join(ROOT, "build/bin/dtrain"))
HANG_SECONDS = 10
# Ten seconds of silence, half a second of polling, the records, and one second of grace.
NAMED_WITHIN = 15


def run_faulty(tmp_path, frontend, fault, world, steps=10):
    flight = tmp_path / "flight"
    env = harness.env_for(0, world, 0, {"DTRAIN_HANG_SECONDS": str(HANG_SECONDS),
                                        "DTRAIN_FLIGHT_DIR": str(flight)})
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT"):
        env.pop(name)
    p = subprocess.run([DTRAIN, "run", "-n", str(world), "--grace-period", "1", "--",
                        harness.PYTHON, os.path.join(harness.HERE, "fault_workers.py"), frontend,
                        fault, str(steps)],
                       env=env, capture_output=True, text=True, timeout=180)
    ended = time.time()
    out = p.stdout + p.stderr
    hangs = [float(line.split()[-1]) for line in out.splitlines() if "] HANG " in line]
    return p.returncode, out, flight, (ended - min(hangs)) if hangs else None


def line_of(text):
    """The line of fault_workers.py that holds `text`."""
    with open(os.path.join(harness.HERE, "fault_workers.py")) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


def doctor(flight):
    p = subprocess.run([DTRAIN, "doctor", str(flight), "--json"], capture_output=True, text=True)
    assert p.returncode == 1, p.stdout + p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("frontend", ["torch", "hvd"])
def test_a_rank_stuck_in_compute_is_named_with_its_python_line(tmp_path, frontend):
    code, out, flight, after = run_faulty(tmp_path, frontend, "compute", 3)
    assert code == 124, out
    assert after < NAMED_WITHIN, (after, out)
    verb = "entered collective #" if frontend == "torch" else "submitted all_reduce(f32, 256"
    assert f"rank 1 never {verb}" in out, out
    assert "ranks 0, 2 have waited" in out, out
    assert "rank 1: it has made no call for" in out, out
    assert f"Python at fault_workers.py:{line_of('time.sleep(600)')} in main" in out, out
    findings = doctor(flight)["findings"]
    assert findings[0]["ranks"] == [1], findings


@pytest.mark.parametrize("frontend", ["torch", "hvd"])
def test_a_rank_that_skips_an_all_reduce_is_named_with_what_it_does_instead(tmp_path, frontend):
    code, out, flight, after = run_faulty(tmp_path, frontend, "skip", 2)
    assert code == 124, out
    assert after < NAMED_WITHIN, (after, out)
    if frontend == "torch":
        assert "rank 1 never entered collective #" in out, out
        assert "rank 1: it waits in recv(1024 bytes from rank 0, tag 7)" in out, out
    else:
        # The call rank 0 has waited in longest comes first: the one rank 1 skipped.
        first = out.index("- rank")
        assert out.startswith("- rank 1 never submitted all_reduce(f32, 4, avg) of tensor 'loss'",
                              first), out
        assert (f"submitted by the others at fault_workers.py:{line_of('hvd.synchronize')} in "
                "reduce <- ") in out, out
        assert "rank 1: it waits in all_reduce(f32, 256, avg) of tensor 'grad'" in out, out


@pytest.mark.parametrize("frontend", ["torch", "hvd"])
def test_ranks_calling_all_reduces_in_another_order_are_named(tmp_path, frontend):
    code, out, flight, after = run_faulty(tmp_path, frontend, "order", 3)
    assert after < NAMED_WITHIN, (after, out)
    if frontend == "torch":
        # The calls' fingerprints differ: every rank fails at once, and the records say where.
        assert code == 1, out
        # Each side named with the program's own lines that made the call.
        reduce_at = f"fault_workers.py:{line_of('dist.all_reduce(t)')} in reduce"
        assert (f"ranks 0, 2 called all_reduce(f32, 256, sum) at {reduce_at} <- "
                f"fault_workers.py:{line_of('# in order')} in main; rank 1 called "
                f"all_reduce(f32, 4, sum) at {reduce_at} <- "
                f"fault_workers.py:{line_of('# out of order')} in main") in out, out
    else:
        # The loss goes through the coordinator, matched by name: each side waits for the tensor
        # the other has not sent.
        assert code == 124, out
        assert "rank 1 never submitted all_reduce(f32, 256, avg) of tensor 'grad'" in out, out
        assert "ranks 0, 2 never submitted all_reduce(f32, 4, avg) of tensor 'loss'" in out, out
        # Where each waits, in the program's own code (not inside dtrain's package).
        assert f"Python at fault_workers.py:{line_of('hvd.synchronize')} in reduce" in out, out


def test_a_send_recv_deadlock_is_named_as_a_cycle(tmp_path):
    code, out, flight, after = run_faulty(tmp_path, "torch", "p2p", 2)
    assert code == 124, out
    assert after < NAMED_WITHIN, (after, out)
    assert ("Point-to-point deadlock: rank 0 waits in recv(1024 bytes from rank 1, tag 0) at "
            f"fault_workers.py:{line_of('dist.recv(')} in receive <- "
            f"fault_workers.py:{line_of('receive(grad, 1 - rank)')} in main") in out, out
    assert doctor(flight)["findings"][0]["kind"] == "deadlock"


@pytest.mark.parametrize("frontend", ["torch", "hvd"])
def test_a_rank_three_times_slower_is_named_while_the_job_runs(tmp_path, frontend):
    # About 13 s of steps: one 10 s window of the launcher's slow-rank check.
    code, out, _, _ = run_faulty(tmp_path, frontend, "slow", 2, steps=420)
    assert code == 0, out
    assert "dtrain run: rank 1 is slow: " in out, out
    assert "no rank has completed" not in out, out


def test_a_peer_that_raised_is_said_to_have_failed_not_to_have_left(tmp_path):
    code, out, flight, _ = run_faulty(tmp_path, "torch", "raise", 2)
    assert code == 1, out
    # Rank 0's error, from the launcher's word on rank 1's exit.
    assert ("collective #" in out and "failed: rank 1's process failed with exit code 1 "
            "(dtrain run)") in out, out
    assert "rank 1: gone: its process failed with exit code 1 (dtrain run)" in out, out
    findings = doctor(flight)["findings"]
    assert findings[-1]["kind"] == "missing", findings
    assert "rank 1's process failed with exit code 1 (dtrain run)" in findings[-1]["text"]
