"""The settings of a Horovod API session (dtrain.torch, dtrain.tensorflow), from the environment:
dtrain's names first, then Horovod's, so that a Horovod job's settings keep working. The defaults
are those of dtrain's table of environment variables (src/common/env.h, `dtrain env`)."""
import os
from collections.abc import Sequence
from datetime import timedelta
from typing import TypeVar

from dtrain import _core

_N = TypeVar("_N", int, float)


def _number(names: Sequence[str], kind: type[_N], minimum: _N, maximum: _N) -> _N:
    """The first of the environment variables `names` that is set, checked; else the default
    the table gives the first of them."""
    for name in names:
        text = os.environ.get(name)
        if text is None or text == "":
            continue
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(f"{name}={text!r} is not a number; unset it or give a "
                             f"{kind.__name__} from {minimum} to {maximum}") from None
        if not minimum <= value <= maximum:  # also refuses nan
            raise ValueError(f"{name}={text!r} is out of range: give a {kind.__name__} from "
                             f"{minimum} to {maximum}")
        return value
    defaults = {variable: default for variable, default, _ in _core.env_table()}
    return kind(defaults[names[0]])


def session_settings() -> tuple[timedelta, int, timedelta]:
    """(cycle time, fusion threshold in bytes, stall timeout) of the coordinator."""
    cycle_ms = _number(["DTRAIN_CYCLE_TIME_MS", "HOROVOD_CYCLE_TIME"], float, 0.01, 1000.0)
    fusion = _number(["DTRAIN_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD"], int, 0, 1 << 40)
    stall_s = _number(["DTRAIN_STALL_TIMEOUT", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"], float,
                      0.001, 86400.0)
    return timedelta(milliseconds=cycle_ms), fusion, timedelta(seconds=stall_s)
