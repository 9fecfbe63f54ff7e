"""Horovod's DistributedOptimizer: any torch optimizer, with the gradients reduced over the ranks
before each step.

The gradients are handed to dtrain's C++ gradient hooks (src/torch/gradient_hooks.h), the engine
of the C++ DistributedOptimizer: a post hook on each parameter's gradient accumulator queues the
gradient on the coordinator as soon as autograd has it, so the reduction of the last layers
overlaps the backward pass of the first; step() waits for them and runs the wrapped optimizer.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

import torch

from dtrain import _torch
from dtrain.torch import collectives, live
from dtrain.torch.compression import Compression, Compressor

if TYPE_CHECKING:
    _Base = torch.optim.Optimizer
else:  # at run time the wrapped optimizer's class follows in the MRO, whatever it derives from
    _Base = object

_Optimizer = TypeVar("_Optimizer", bound=torch.optim.Optimizer)


class _DistributedOptimizer(_Base):
    """Mixed in before the wrapped optimizer's class (see DistributedOptimizer): super() is the
    wrapped optimizer's class, also in a subclass of the class DistributedOptimizer makes."""

    def __init__(self, params: Iterable[dict[str, Any]],
                 named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
                 compression: type[Compressor], backward_passes_per_step: int, op: int,
                 gradient_predivide_factor: float) -> None:
        # The wrapped class's own __init__, with its hyper-parameters in the param groups.
        super().__init__(params)  # type: ignore[call-arg]
        all_params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named_parameters = list(named_parameters)
            if any(not isinstance(p, tuple) for p in named_parameters):
                raise ValueError("named_parameters must be (name, parameter) pairs, such as "
                                 "model.named_parameters()")
            names = [n for n, _ in named_parameters]
            duplicates = sorted({n for n in names if names.count(n) > 1})
            if duplicates:
                raise ValueError(f"named_parameters has duplicate names: {duplicates}")
            named_ids = {id(p) for _, p in named_parameters}
            unnamed = [i for i, p in enumerate(all_params) if id(p) not in named_ids]
            if unnamed:
                raise ValueError(f"named_parameters was given, but {len(unnamed)} parameters of "
                                 f"the optimizer are not in it (indices {unnamed[:8]})")
            in_optimizer = {id(p) for p in all_params}
            named = [(f"allreduce.{n}", p) for n, p in named_parameters if id(p) in in_optimizer]
            self._parameter_names = {p: n for n, p in named_parameters if id(p) in in_optimizer}
        else:
            named = [(f"allreduce.noname.{i}", p) for i, p in enumerate(all_params)]
            self._parameter_names = {p: n for n, p in named}  # Horovod's attribute

        if compression not in (Compression.none, Compression.fp16):
            raise ValueError("DistributedOptimizer: compression must be Compression.none or "
                             "Compression.fp16 (the gradients are compressed in C++)")
        if collectives._op(op, None) != "avg" and gradient_predivide_factor != 1.0:
            raise ValueError("gradient_predivide_factor applies to op=Average only")
        self._hooks_of = (named, compression.name, op, int(backward_passes_per_step),
                          float(gradient_predivide_factor))
        if collectives._spare_waiting():  # the hooks need the world: a spare waits in them
            live._warm_spare(all_params)
        self._dtrain_hooks = self._new_hooks()
        collectives._live().rebindables.add(self)
        self._should_synchronize = True
        self._synchronized = False

    def _new_hooks(self) -> _torch.GradientHooks:
        named, compression, op, passes, predivide = self._hooks_of
        op_name = collectives._op(op, None)
        prescale = postscale = 1.0
        if predivide != 1.0:
            # As Horovod: divide by the factor before the sum, by size/factor after it.
            op_name = "sum"
            prescale = 1.0 / predivide
            postscale = predivide / collectives.size()
        return collectives._session().gradient_hooks(named, compression, op_name, passes, prescale,
                                                     postscale)

    def _rebind(self) -> None:
        """After the session was re-formed (live recovery): the hooks of the new one, with this
        optimizer's settings (the old hooks come off first)."""
        del self._dtrain_hooks
        self._dtrain_hooks = self._new_hooks()
        self._synchronized = False

    def set_backward_passes_per_step(self, passes: int) -> None:
        named, compression, op, _, predivide = self._hooks_of
        self._hooks_of = (named, compression, op, int(passes), predivide)
        self._dtrain_hooks.set_backward_passes_per_step(int(passes))

    def synchronize(self) -> None:
        """Waits until every gradient holds the reduction over the ranks (gradients no backward
        pass produced reduce as zeros)."""
        self._dtrain_hooks.submit_missing()
        while not self._dtrain_hooks.wait_some(collectives._SLICE):
            pass
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """For step() after an explicit synchronize() (e.g. to clip the reduced gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "after optimizer.synchronize(): the gradients are reduced again; "
                              "wrap step() in `with optimizer.skip_synchronize():`")
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def _step_unreduced(self) -> None:
        """The wrapped optimizer's own step, on the gradients as they are."""
        super().step()

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        if self._dtrain_hooks.pending():
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(): the "
                                 "gradients are still being reduced")
        return super().zero_grad(*args, **kwargs)


@collectives._whole_job
def DistributedOptimizer(optimizer: _Optimizer,
                         named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
                         compression: type[Compressor] = Compression.none,
                         backward_passes_per_step: int = 1, op: int = collectives.Average,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: int | Sequence[Sequence[torch.Tensor]] | None = None,
                         sparse_as_dense: bool = False, process_set: object = None
                         ) -> _Optimizer:
    """Wraps `optimizer` (any torch.optim.Optimizer) so that step() applies the gradients
    averaged (op=Average) or summed (op=Sum) over every rank. The result is an instance of the
    optimizer's own class (state_dict, param_groups and LR schedulers work as before).

    named_parameters: model.named_parameters(), so that errors name the parameters; without it
    they are numbered. backward_passes_per_step: backward passes whose gradients accumulate
    locally before one reduction. compression: Compression.fp16 sends half the bytes. Sparse
    gradients (an nn.Embedding's with sparse=True) are reduced as dense tensors and handed back
    sparse, whatever sparse_as_dense says."""
    if num_groups or groups:
        warnings.warn("DistributedOptimizer: num_groups and groups are ignored; dtrain's "
                      "coordinator fuses ready gradients by size (DTRAIN_FUSION_THRESHOLD)")
    # As Horovod, a class named as the optimizer's, deriving from it; the mixin comes first.
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__),
               {"__doc__": _DistributedOptimizer.__doc__})
    wrapped = cls(optimizer.param_groups, named_parameters, compression,
                  backward_passes_per_step, op, gradient_predivide_factor)
    wrapped.state.update(optimizer.state)
    return cast(_Optimizer, wrapped)
