"""Runs a function of tests/python/workers.py in N real processes, as torchrun would start them.

Each process gets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (a free port; rank 0 hosts
torch's TCPStore, as under plain env://) and runs ``workers.<name>(backend, *args)``. The harness
returns each rank's exit code and output, and fails the test on a timeout, so that a hang is a
failure with the ranks' output, never a stuck CI.
"""
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
# The interpreter pytest runs under: the environment dtrain was built for (tests/CMakeLists.txt).
PYTHON = sys.executable


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Rank:
    rank: int
    code: int
    out: str


def env_for(rank, world, port, extra=None):
    env = dict(os.environ)
    env.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                # A rank stopped with SIGABRT at the deadline prints where every thread was.
                "PYTHONFAULTHANDLER": "1"})
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    env.pop("DTRAIN_AGENT_STORE", None)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [os.environ.get("DTRAIN_PYTHONPATH", ""), HERE, os.environ.get("PYTHONPATH", "")] if p)
    env.update(extra or {})
    return env


def command(script, name, backend, args):
    """`python3 SCRIPT NAME [BACKEND] ARGS...` (hvd_workers.py takes no backend: backend=None)."""
    return [PYTHON, os.path.join(HERE, script), name, *([backend] if backend else []),
            *map(str, args)]


def run(world, name, *args, backend="dtrain", timeout=120, env=None, kill_rank=None,
        script="workers.py"):
    """Runs <script>'s <name> on `world` ranks; returns [Rank] in rank order."""
    port = free_port()
    procs = []
    for r in range(world):
        cmd = command(script, name, backend, args)
        procs.append(subprocess.Popen(cmd, env=env_for(r, world, port, env), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout
    results = []
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:  # faulthandler prints each thread's stack, then the rank ends
                q.send_signal(signal.SIGABRT)
            time.sleep(2)
            for q in procs:
                q.kill()
            outs = []
            for i, q in enumerate(procs):
                o, _ = q.communicate()
                outs.append(f"--- rank {i} ---\n{o}")
            raise AssertionError(f"{name} on {world} ranks (backend {backend}) did not finish "
                                 f"within {timeout} s:\n"
                                 + "\n".join(outs))
        results.append(Rank(r, p.returncode, out))
    return results


HOSTS_SCRIPT = os.path.join(HERE, "..", "..", "scripts", "netns-hosts.sh")


class EmulatedHosts:
    """`n` hosts made of network namespaces (scripts/netns-hosts.sh) for the life of a `with`;
    `skip` says why none could be made here (not root, no iproute2), else None."""

    def __init__(self, n=2):
        self.n, self.name = n, f"py{os.getpid() % 100000}"
        self.subnet = f"10.78.{os.getpid() % 200}"
        check = subprocess.run([HOSTS_SCRIPT, "check"], capture_output=True, text=True)
        self.skip = None
        if check.returncode != 0:
            self.skip = check.stdout.strip() or "cannot make network namespaces here"

    def __enter__(self):
        if self.skip is None:
            subprocess.run([HOSTS_SCRIPT, "up", self.name, str(self.n), self.subnet], check=True,
                           capture_output=True)
        return self

    def __exit__(self, *exc):
        if self.skip is None:
            subprocess.run([HOSTS_SCRIPT, "down", self.name], capture_output=True)

    def run(self, per_host, name, *args, backend="dtrain", timeout=240):
        """Like run(), `per_host` consecutive ranks on each host; rank 0 (and torch's store) on
        host 0, reached by its address on the hosts' network."""
        world, port, procs = self.n * per_host, free_port(), []
        for r in range(world):
            env = env_for(r, world, port, {"MASTER_ADDR": f"{self.subnet}.1",
                                           "LOCAL_RANK": str(r % per_host),
                                           "LOCAL_WORLD_SIZE": str(per_host)})
            cmd = [HOSTS_SCRIPT, "run", self.name, str(r // per_host),
                   *command("workers.py", name, backend, args)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        return collect(procs, timeout, f"{name} on {world} ranks over {self.n} hosts")


def collect(procs, timeout, what):
    """Each process's [Rank], in order; all are killed, and the test fails, when one is not done
    within `timeout` seconds."""
    results = []
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"{what} did not finish within {timeout} s")
        results.append(Rank(r, p.returncode, out))
    return results


def run_with_envs(envs, name, *args, backend="dtrain", timeout=180, drop=(), script="workers.py"):
    """Like run(), with each rank's own extra variables and some of the usual ones left out (a
    launcher other than torchrun's convention)."""
    procs = []
    for r, extra in enumerate(envs):
        env = env_for(r, len(envs), 0, extra)
        for k in drop:
            env.pop(k, None)
        cmd = command(script, name, backend, args)
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return collect(procs, timeout, name)


def check_ok(results):
    bad = [r for r in results if r.code != 0]
    assert not bad, "\n".join(f"--- rank {r.rank} exited {r.code} ---\n{r.out}" for r in bad)


def interrupt_rank0(script, name, *args, world=2):
    """Starts <script>'s <name> on `world` ranks, sends rank 0 SIGINT (Ctrl-C) once it printed
    "waiting" and half a second more passed, and returns (rank 0's exit code, its output, the
    seconds from the signal to its exit). The other ranks are killed."""
    port = free_port()
    procs = [subprocess.Popen(command(script, name, None, args), env=env_for(r, world, port),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    try:
        line = procs[0].stdout.readline()
        while line and "waiting" not in line:
            line = procs[0].stdout.readline()
        assert "waiting" in line, f"rank 0 never waited: {line!r}"
        time.sleep(0.5)  # inside the wait
        sent = time.monotonic()
        procs[0].send_signal(signal.SIGINT)
        out = procs[0].communicate(timeout=30)[0]
        return procs[0].returncode, out, time.monotonic() - sent
    finally:
        for p in procs:
            p.kill()
            p.communicate()


def resumed_at(p):
    """The step both survivors of a live job of 3 went on from after rank 1 died after step 4
    (hvd_workers.live_elastic, tf_workers.live_elastic): their reset callbacks' "reset at step S,
    now rank R of 2" lines say it, the step rank 1 died after or the one before (a survivor's
    commit of it may not have been made)."""
    text = p.stdout + p.stderr
    resumed = re.findall(r"at start: reset at step ([0-9]+), now rank [0-9] of 2", p.stdout)
    assert len(resumed) == 2 and len(set(resumed)) == 1, text
    assert int(resumed[0]) in (3, 4), text
    return int(resumed[0])


def survivors_went_on(p):
    """Checks that the two survivors of such a job re-formed, scaled their rate (scale-lr, from
    0.3) and ended well; returns resumed_at(p)."""
    text = p.stdout + p.stderr
    assert p.returncode == 0, text
    assert "2 worker(s) ended well; 1 lost along the way (--live)" in p.stderr, text
    assert re.search(r"rank 2 at start: the job re-formed without rank\(s\) \[1\] at start in "
                     r"[0-9.]+ s; now rank 1 of 2", p.stdout), text
    assert re.search(r"reset at step [0-9]+, now rank 1 of 2 \(scale-lr: batch [0-9]+, lr 0.2\)",
                     p.stdout), text
    return resumed_at(p)
