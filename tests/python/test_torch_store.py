"""torch's own TCPStore client (torch 2.x) against dtrain's store server, `dtrain store --torch-clients`.

Each test starts the real binary (found through DTRAIN_BIN) on a free port and talks to it with
torch.distributed.TCPStore(is_master=False), as a script under `dtrain run` does; a raw-socket
client speaking torch 1.13's wire format checks that both protocols share one map. dtrain's own
Python package is not imported: only torch's client and the binary are under test.

    DTRAIN_BIN=build/bin/dtrain /opt/dtrain/venv/bin/python -m pytest -q tests/python/test_torch_store.py
"""
import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if int(torch.__version__.split(".")[0]) < 2:
    pytest.skip("these tests speak torch 2.x's store protocol", allow_module_level=True)

DTRAIN_BIN = os.environ.get("DTRAIN_BIN", "")
if not DTRAIN_BIN or not os.access(DTRAIN_BIN, os.X_OK):
    pytest.skip("DTRAIN_BIN does not name the dtrain binary", allow_module_level=True)


class StoreServer:
    """`dtrain store --port 0 --torch-clients` in a child; its stderr (the log) read at stop()."""

    def __init__(self):
        env = dict(os.environ)
        env.pop("DTRAIN_AUTH_TOKEN", None)  # torch clients are refused in a job with a token
        self.proc = subprocess.Popen(
            [DTRAIN_BIN, "store", "--host", "127.0.0.1", "--port", "0", "--job-id", "torch-store-test",
             "--torch-clients"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()  # "dtrain store: serving on HOST:PORT"
        if "serving on" not in line:
            self.proc.kill()
            raise AssertionError(f"dtrain store did not start: {line!r} {self.proc.stderr.read()}")
        self.port = int(line.rsplit(":", 1)[1])
        self._log = None

    def log(self):
        """Stops the server and returns everything it logged."""
        if self._log is None:
            self.proc.terminate()
            try:
                _, self._log = self.proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                _, self._log = self.proc.communicate()
        return self._log


@pytest.fixture
def server():
    s = StoreServer()
    yield s
    s.log()


def client(port, timeout=timedelta(seconds=10)):
    return dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                         timeout=timeout)


class Torch113Client:
    """torch 1.13's wire format by hand: u8 query, u64-length strings, little-endian integers."""
    SET, GET, ADD, WAIT = 0, 2, 3, 5

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)

    @staticmethod
    def _str(b):
        return struct.pack("<Q", len(b)) + b

    def _read(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the store closed the connection")
            out += chunk
        return out

    def set(self, key, value):
        self.sock.sendall(bytes([self.SET]) + self._str(key) + self._str(value))

    def get(self, key):
        self.sock.sendall(bytes([self.WAIT]) + struct.pack("<Q", 1) + self._str(key))
        assert self._read(1) == b"\x00"  # STOP_WAITING
        self.sock.sendall(bytes([self.GET]) + self._str(key))
        (n,) = struct.unpack("<Q", self._read(8))
        return self._read(n)


def later(seconds, fn):
    t = threading.Timer(seconds, fn)
    t.start()
    return t


def test_set_get_add_compare_set_check(server):
    s = client(server.port)
    s.set("k", "v")
    assert s.get("k") == b"v"
    assert s.add("n", 5) == 5
    assert s.add("n", -7) == -2
    assert s.get("n") == b"-2"  # decimal text, as torch's own server keeps counters
    assert s.compare_set("k", "v", "w") == b"w"
    assert s.compare_set("k", "wrong", "x") == b"w"
    assert s.compare_set("absent", "expected", "x") == b"expected"  # torch's rule
    assert s.compare_set("created", "", "fresh") == b"fresh"
    assert s.check(["k", "n"])
    assert not s.check(["k", "missing"])


def test_wait_is_satisfied_when_another_client_sets_the_keys_later(server):
    s, other = client(server.port), client(server.port)
    t = later(0.5, lambda: other.multi_set(["a", "b"], ["1", "2"]))
    start = time.monotonic()
    s.wait(["a", "b"], timedelta(seconds=10))
    took = time.monotonic() - start
    t.join()
    assert 0.4 < took < 5, took
    assert s.get("b") == b"2"


def test_get_waits_for_a_key_set_later(server):
    s, other = client(server.port), client(server.port)
    t = later(0.3, lambda: other.set("late", "here"))
    assert s.get("late") == b"here"
    t.join()


def test_a_wait_times_out_and_the_client_goes_on(server):
    s = client(server.port)
    start = time.monotonic()
    with pytest.raises(Exception, match="timeout"):
        s.wait(["never"], timedelta(milliseconds=500))
    took = time.monotonic() - start
    assert 0.4 < took < 3, took  # the server answers the client's CANCEL_WAIT at once
    s.set("after", "1")  # the connection is still in step
    assert s.get("after") == b"1"
    with pytest.raises(Exception, match="timeout"):
        client(server.port, timeout=timedelta(milliseconds=300)).get("never")


def test_multi_set_multi_get_append(server):
    s = client(server.port)
    s.multi_set(["m1", "m2", "m3"], ["1", "", "333"])
    assert s.multi_get(["m3", "m1", "m2"]) == [b"333", b"1", b""]
    s.append("log", "ab")  # creates the key
    s.append("log", "cd")
    assert s.get("log") == b"abcd"


def test_delete_key_and_num_keys(server):
    s = client(server.port)
    assert s.num_keys() == 0
    s.multi_set(["x", "y"], ["1", "2"])
    assert s.num_keys() == 2
    assert s.delete_key("x")
    assert not s.delete_key("x")
    assert s.num_keys() == 1


@pytest.mark.skipif(not hasattr(dist.TCPStore, "barrier"), reason="Store.barrier came after 2.11")
def test_barrier(server):
    a, b = client(server.port), client(server.port)
    t = later(0.3, lambda: b.barrier("bar", 2))
    start = time.monotonic()
    a.barrier("bar", 2)
    assert time.monotonic() - start > 0.2
    t.join()
    assert a.get("bar") == b"2"


def test_protocols_share_one_map(server):
    s = client(server.port)
    old = Torch113Client(server.port)
    s.set("from-2", "two")
    assert old.get(b"/from-2") == b"two"  # torch's client puts "/" before every key
    old.set(b"/from-1.13", b"one")
    assert s.get("from-1.13") == b"one"


def test_queues_are_refused_with_a_log_line(server):
    s = client(server.port)
    s.queue_push("q", "item")  # no reply: the next call meets the closed connection
    with pytest.raises(Exception):
        s.num_keys()
    assert "QUEUE_PUSH ('/q') is not served" in server.log()


def test_a_bad_magic_number_is_refused_with_a_log_line(server):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(b"\x00" + struct.pack("<I", 0x12345678) + b"\x0d" + struct.pack("<I", 1))
    try:
        assert sock.recv(1) == b""  # closed
    except ConnectionResetError:
        pass  # closed with our PING unread
    log = server.log()
    assert "0x12345678" in log and "VALIDATE magic 0x3c85f7ce" in log, log


WORKER = textwrap.dedent("""
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    assert t.tolist() == [3.0] * 4, t
    dist.barrier()
    dist.destroy_process_group()
    print("ok")
""")


def test_init_process_group_meets_the_store_as_under_dtrain_run(server):
    """What `dtrain run` sets up: torch connects to the launcher's store instead of hosting one."""
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(server.port),
                   TORCHELASTIC_USE_AGENT_STORE="True", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    assert all(p.returncode == 0 for p in procs), outs
