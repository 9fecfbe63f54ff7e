"""dtrain installed as Python users install it: `python -m build --wheel` from the source tree,
the wheel installed into a fresh environment that holds torch, and a 2-rank job run there with
that environment's `dtrain` command and interpreter, finding the backend through torch's entry
point (no `import dtrain.torch` in the script)."""
import os
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

import pytest

import harness

SOURCE = os.path.dirname(os.path.dirname(harness.HERE))

SCRIPT = textwrap.dedent("""
    import sys
    import torch
    import torch.distributed as dist
    import dtrain
    assert dtrain.__file__.startswith(sys.prefix), f"dtrain from {dtrain.__file__}, not the wheel"
    dist.init_process_group("dtrain")      # found through the entry point
    t = torch.full((5,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    assert t.tolist() == [3.0] * 5, t
    print(f"rank {dist.get_rank()}: the wheel's backend reduced {t.tolist()}", flush=True)
    dist.destroy_process_group()
""")


def _entry_point_hook():
    import torch.distributed as dist
    return hasattr(dist.Backend, "_ensure_backend_registered")


def test_a_wheel_installs_into_a_fresh_environment_with_torch_and_trains(tmp_path):
    dist_dir = tmp_path / "dist"
    # --no-isolation: the build uses this environment's torch (an isolated one would hold none).
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the build tree's package must not stand in for the wheel
    # The compiler scripts/test.sh's build used (Python's sysconfig names another spelling of
    # it), so that ccache serves that build's objects (pyproject.toml's build-dir).
    env.setdefault("CXX", "c++")
    env.setdefault("CC", "cc")
    p = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
                        str(dist_dir), SOURCE], env=env, capture_output=True, text=True,
                       timeout=2400)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    wheels = list(dist_dir.glob("dtrain-*.whl"))
    assert len(wheels) == 1, list(dist_dir.iterdir())
    # The types (PEP 561) travel with it: py.typed and the extensions' stubs.
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    for typed in ("dtrain/py.typed", "dtrain/_core.pyi", "dtrain/_torch.pyi"):
        assert typed in names, f"the wheel has no {typed}: {sorted(names)}"

    # A fresh environment holding torch: torch reaches it through a .pth line naming this
    # environment's site-packages (installing torch again would take gigabytes), after its own.
    fresh = tmp_path / "fresh"
    # made by the interpreter this environment was made from (the wheel is for its version).
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(fresh)], check=True, timeout=120)
    python = fresh / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "zz_torch_from_the_build_environment.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    p = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                        str(wheels[0])], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    dtrain_cmd = fresh / "bin" / "dtrain"
    assert dtrain_cmd.exists(), "the wheel installs no dtrain command"

    script = tmp_path / "train.py"
    body = SCRIPT if _entry_point_hook() else "import dtrain.torch\n" + SCRIPT
    script.write_text(body)
    # python3 on the command line: dtrain run chooses the environment's interpreter.
    p = subprocess.run([str(dtrain_cmd), "run", "-n", "2", "--", "python3", str(script)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"python3 is {python}" in p.stderr, p.stderr
    for r in range(2):
        assert f"rank {r}: the wheel's backend reduced [3.0, 3.0, 3.0, 3.0, 3.0]" in p.stdout, p.stdout


def test_a_python_without_torch_is_told_which_interpreter_and_where_dtrain_is(tmp_path):
    # dtrain's package found by an interpreter that has no torch: a bare environment made from
    # the one this environment was made from (the same version, so the extension loads).
    base = getattr(sys, "_base_executable", sys.executable)
    bare = tmp_path / "bare"
    subprocess.run([base, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    python = str(bare / "bin" / "python")
    env = harness.env_for(0, 1, 0)
    p = subprocess.run([python, "-c", "import dtrain.torch"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    if "No module named 'dtrain'" in p.stderr:
        pytest.skip("the bare environment cannot see the build tree's package")
    assert f"dtrain.torch needs torch, which this Python ({python}) cannot import" in p.stderr, p.stderr
    assert "dtrain is installed at" in p.stderr, p.stderr


@pytest.mark.parametrize("version,says", [
    ("1.13.1", "dtrain.torch supports 2.11 <= torch < 2.16; this Python"),
    ("2.16.0", "dtrain.torch supports 2.11 <= torch < 2.16; this Python"),
    ("2.11.0+cpu", "whose C++ library differs: rebuild dtrain against it"),
])
def test_another_torch_is_refused_at_import_naming_both_versions(version, says):
    # The check reads torch.__version__ before the extension loads; a torch of another version
    # is stood in for by changing that string (the extension is never loaded, so nothing else of
    # the installed torch matters).
    import torch
    built = torch.__version__.split("+")[0]
    if version.startswith(built[:4]):
        pytest.skip(f"this build is for torch {built}")
    code = f"import torch; torch.__version__ = {version!r}; import dtrain.torch"
    p = subprocess.run([sys.executable, "-c", code], env=harness.env_for(0, 1, 0),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert says in p.stderr, p.stderr
    assert version in p.stderr, p.stderr
    assert "undefined symbol" not in p.stderr, p.stderr


def test_the_extension_binds_the_cxx_runtime_to_libstdcxx_not_to_torchs_copies():
    # PyPI's torch libraries export private copies of libstdc++'s std::filesystem (libtorch_cpu.so;
    # in 2.11 libtorch.so too, where remove_all jumped to address 0 from CheckpointManager's
    # pruning thread). The loader binds a module's references in its dependency order, the order
    # dlsym on the module's handle searches: libstdc++ must come before LibTorch there.
    import ctypes
    import dtrain._torch as module

    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

    libdl = ctypes.CDLL(None)
    libdl.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    handle = ctypes.CDLL(module.__file__, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    for symbol in ("_ZNSt10filesystem10remove_allERKNS_7__cxx114pathE",
                   "_ZNSt10filesystem6statusERKNS_7__cxx114pathE"):
        address = ctypes.cast(getattr(handle, symbol), ctypes.c_void_p).value
        info = DlInfo()
        assert libdl.dladdr(address, ctypes.byref(info)) != 0, symbol
        provider = os.path.basename(info.dli_fname.decode())
        assert provider.startswith("libstdc++"), f"{symbol} binds to {provider}"
