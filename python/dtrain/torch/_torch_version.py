"""Which torch dtrain.torch runs with, checked before its extension loads.

The extension is built against one torch's C++ library: another torch (or another Python) would
fail inside the loader with an undefined symbol, which names nothing a user can act on. So the
versions are compared first, and the error says what was found, what dtrain supports, and how to
rebuild. cmake/python_env.cmake holds the same range for the build.
"""

import os
import sys

try:
    import torch
    if not hasattr(torch, "__version__"):  # a folder named torch, not the package
        raise ImportError(f"'torch' is the folder {list(torch.__path__)}, not PyTorch")
except ImportError as e:  # another interpreter than the environment's, most often
    import dtrain
    try:
        from dtrain import _build_info
        built = f"; dtrain was built for {_build_info.PYTHON}"
    except ImportError:
        built = ""
    raise ImportError(
        f"dtrain.torch needs torch, which this Python ({sys.executable}) cannot import ({e}). "
        f"dtrain is installed at {os.path.dirname(dtrain.__file__)}{built}: run the script with "
        f"that environment's python (dtrain run -- python3 ... chooses it), or pip install torch "
        f"into this one") from e

# torch releases dtrain.torch is written and tested for: MIN <= version < BELOW.
MIN = (2, 11)
BELOW = (2, 16)


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string such as '2.15.0+cu132'."""
    parts = version.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


def check() -> None:
    """Raises ImportError naming the torch (or Python) found against what dtrain needs."""
    found = torch.__version__
    release = _release(found)
    wanted = f"{MIN[0]}.{MIN[1]} <= torch < {BELOW[0]}.{BELOW[1]}"
    if not MIN <= release < BELOW:
        raise ImportError(
            f"dtrain.torch supports {wanted}; this Python ({sys.executable}) has torch {found} "
            f"({torch.__file__}). Install a supported torch (pip install 'torch=="
            f"{BELOW[0]}.{BELOW[1] - 1}.*') and rebuild dtrain against it "
            f"(pip install --no-build-isolation .)")
    try:
        from dtrain import _build_info
    except ImportError:  # a build tree older than the file: nothing to compare
        return
    built = _build_info.TORCH_VERSION
    if not built:
        raise ImportError(
            f"dtrain was built without torch (no torch in {_build_info.PYTHON} when it was "
            f"built), so dtrain.torch is missing; this Python ({sys.executable}) has torch "
            f"{found}: rebuild dtrain in this environment (pip install --no-build-isolation .)")
    if _release(built) != release:
        raise ImportError(
            f"dtrain was built for torch {built}; this Python ({sys.executable}) has torch "
            f"{found}, whose C++ library differs: rebuild dtrain against it (pip install "
            f"--no-build-isolation . in this environment)")
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if _build_info.PYTHON_VERSION != here:
        raise ImportError(
            f"dtrain was built for Python {_build_info.PYTHON_VERSION} ({_build_info.PYTHON}); "
            f"this is Python {here} ({sys.executable}): rebuild dtrain with this interpreter "
            f"(pip install --no-build-isolation .)")
