"""Loads dtrain._tensorflow: first as TensorFlow's op library (its ops register while TensorFlow
watches), then as the Python module that opens the session. Refuses a TensorFlow other than the
one the ops were compiled against, naming both."""
from __future__ import annotations

import importlib.util

import tensorflow as tf

from dtrain import _build_info

__all__ = ["ops", "session"]

if not _build_info.TENSORFLOW_VERSION:
    raise ImportError(
        "dtrain.tensorflow: this dtrain was built without TensorFlow (none was found in "
        f"{_build_info.PYTHON} when it was built). Install tensorflow-cpu 2.21 into that "
        "environment and rebuild: pip install '.[tensorflow]', or scripts/install-deps.sh "
        "--tensorflow")


def _release(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


if _release(tf.__version__) != _release(_build_info.TENSORFLOW_VERSION):
    raise ImportError(
        f"dtrain.tensorflow was built for TensorFlow {_build_info.TENSORFLOW_VERSION} and this "
        f"process has TensorFlow {tf.__version__} ({tf.__file__}): its ops are compiled against "
        f"one release's headers. Install tensorflow-cpu=={_build_info.TENSORFLOW_VERSION}, or "
        f"rebuild dtrain in this environment (pip install '.[tensorflow]')")

_spec = importlib.util.find_spec("dtrain._tensorflow")
if _spec is None:
    raise ImportError("dtrain.tensorflow: the extension dtrain._tensorflow is missing from "
                      "this installation; rebuild it (pip install '.[tensorflow]')")
ops = tf.load_op_library(_spec.origin)

from dtrain import _tensorflow as session  # noqa: E402  (after the ops registered)
