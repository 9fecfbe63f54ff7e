"""The fork server behind ``dtrain run --preload``: a Python worker started while the job trains
(a spare, a replacement) is forked from this process, which imported the workers' heavy modules
once, instead of starting an interpreter that imports them again. Importing torch costs seconds
of a core, taken from the ranks that train; a fork costs milliseconds.

``dtrain run`` (src/launch/fork_server.cc) runs this file by its path, not as ``dtrain``'s
module: importing the ``dtrain`` package starts a thread, and a process with threads cannot be
forked safely. It is given one end of a SOCK_SEQPACKET socket pair (``DTRAIN_FORK_SERVER_FD``) and
the modules (``DTRAIN_FORK_SERVER_PRELOAD``, comma-separated). It imports them, then says
``ready`` (or ``failed WHY``) and serves one request per message until the launcher closes its
end: the message is NUL-separated fields (the directory to run in, 1 for the idle CPU priority,
the CPUs as a comma-separated list, the argument count, the arguments, then the whole
environment), with the child's stdin, stdout and stderr attached (SCM_RIGHTS). The answer is
``pid N`` or ``failed WHY``.

The child is forked twice so that it becomes the launcher's own child (the launcher is a
subreaper, PR_SET_CHILD_SUBREAPER): the launcher reaps it, reads its exit status and signals its
process group as for any worker it started itself.
"""
import atexit
import ctypes
import gc
import importlib
import io
import os
import runpy
import socket
import sys
import threading
import time
import warnings
from typing import NoReturn

_PR_SET_PDEATHSIG = 1
_REPARENT_TIMEOUT_S = 5.0
# The files of the frames above the worker's own in its tracebacks.
_NOT_THE_WORKERS = (__file__, runpy.__file__, "<frozen runpy>")


def _threads() -> list[str]:
    """The names of this process's threads other than the calling one."""
    own = str(threading.get_native_id())
    names = []
    for tid in os.listdir("/proc/self/task"):
        if tid != own:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
    return names


def _threads_after_a_fork() -> list[str]:
    """The threads left once a fork has run the at-fork handlers: a pool that stops itself before
    a fork (OpenBLAS's, which numpy starts) is no danger to the children, any other thread is."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12's word on forking threads
        pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return _threads()


def _preload(modules: list[str]) -> str | None:
    """Imports each module; says why not as a line for the launcher, or returns None."""
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as e:  # noqa: BLE001 - any failure is the launcher's to report
            return f"importing {name} failed: {type(e).__name__}: {e}"
        if _threads() and (threads := _threads_after_a_fork()):
            return (f"importing {name} started {len(threads)} thread(s) ({', '.join(threads)}) "
                    "that go on across a fork, and a process with such threads cannot be forked "
                    "safely: leave it out of --preload")
    return None


def _parse(message: bytes) -> tuple[str, bool, set[int], list[str], dict[str, str]]:
    fields = message.split(b"\0")
    cwd, idle, cpus, count = fields[:4]
    argc = int(count)
    argv = [os.fsdecode(f) for f in fields[4:4 + argc]]  # as the interpreter decodes them
    env = dict(os.fsdecode(f).partition("=")[::2] for f in fields[4 + argc:] if b"=" in f)
    cpu_list = {int(c) for c in cpus.decode().split(",") if c}
    return os.fsdecode(cwd), idle == b"1", cpu_list, argv, env


def _become(launcher: int, fds: list[int], request: bytes) -> NoReturn:
    """Runs in the forked child: becomes the worker the request describes; never returns."""
    os.setpgid(0, 0)
    # The intermediate parent exits at once; the launcher, a subreaper, inherits this process.
    deadline = time.monotonic() + _REPARENT_TIMEOUT_S
    while os.getppid() != launcher:
        if time.monotonic() > deadline:
            os._exit(127)
        time.sleep(0.0005)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)  # SIGKILL when the launcher dies, as it asks
    if os.getppid() != launcher:
        os._exit(127)
    gc.enable()  # the server's objects stay frozen: this process's collections leave their pages
    # ... until it exits (the last of its exit handlers): the interpreter's last collections
    # then free them as in any process, where a binding library counting what is left at exit
    # (nanobind's) would otherwise report each of them as leaked.
    atexit.register(gc.unfreeze)
    cwd, idle, cpus, argv, env = _parse(request)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    if cpus:
        os.sched_setaffinity(0, cpus)
    if idle:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    if "numpy" in sys.modules:  # its global generator would be this server's in every child
        sys.modules["numpy"].random.seed()
    args = argv[1:]
    if args and args[0] == "-u":  # unbuffered: no buffer under the text layer, as -u makes them
        args = args[1:]
        sys.stdout, sys.stderr = (
            io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=stream.encoding,
                             errors=stream.errors, write_through=True)
            for fd, stream in ((1, sys.stdout), (2, sys.stderr)))
    try:
        if args[0] == "-m":
            sys.argv = ["-m"] + args[2:]
            sys.path[0] = os.getcwd()
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            script = args[0]
            if not os.path.exists(script):
                print(f"{argv[0]}: can't open file {os.path.abspath(script)!r}: "
                      "[Errno 2] No such file or directory", file=sys.stderr)
                os._exit(2)
            sys.argv = args
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            runpy.run_path(os.path.abspath(script), run_name="__main__")
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - reported as the interpreter would
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in _NOT_THE_WORKERS:
            tb = tb.tb_next  # this server's frames and runpy's are not the worker's
        sys.excepthook(type(e), e, e.with_traceback(tb).__traceback__)
        sys.exit(1)
    sys.exit(0)


def _serve(sock: socket.socket, launcher: int) -> int:
    while True:
        message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        if not message:
            return 0  # the launcher closed its end: the job is over
        try:
            middle = os.fork()
        except OSError as e:
            for fd in fds:
                os.close(fd)
            sock.send(f"failed fork: {e}".encode())
            continue
        if middle == 0:
            try:
                child = os.fork()
            except OSError as e:
                sock.send(f"failed fork: {e}".encode())
                os._exit(1)
            if child == 0:
                sock.close()
                _become(launcher, fds, message)
            try:
                os.setpgid(child, child)  # before the launcher may signal its group
            except OSError:
                pass  # it set its own already
            sock.send(f"pid {child}".encode())
            os._exit(0)
        for fd in fds:
            os.close(fd)
        os.waitpid(middle, 0)


def main() -> int:
    sock = socket.socket(fileno=int(os.environ.pop("DTRAIN_FORK_SERVER_FD")))
    modules = [m for m in os.environ.pop("DTRAIN_FORK_SERVER_PRELOAD", "").split(",") if m]
    launcher = os.getppid()
    # No collection in the server, and none in a child over the server's objects: a collection
    # writes to every object it looks at, which would copy each page of them into every child.
    gc.disable()
    if why := _preload(modules):
        sock.send(f"failed {why}".encode())
        return 1
    gc.freeze()
    sys.stdout.flush()
    sys.stderr.flush()
    sock.send(b"ready")
    code = _serve(sock, launcher)
    gc.unfreeze()
    return code


if __name__ == "__main__":
    sys.exit(main())
