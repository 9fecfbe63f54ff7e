"""Pipeline parallelism for torch modules, on dtrain's schedules and transport.

A model cut into stages, one (or, interleaved, several) per rank; each batch cut into
micro-batches that flow through the stages as a schedule says: ``gpipe``, ``1f1b``,
``interleaved-1f1b`` or ``zb-h1`` (``dtrain pipeline-plan`` draws them). The schedules, their
verifier and the messages between stages are the C++ runner's (``dtrain::Pipeline``); this
module runs the actions on torch modules::

    import torch, torch.nn.functional as F
    import dtrain, dtrain.pipeline

    world = dtrain.init()                                      # under dtrain run -n 4
    layout = dtrain.ParallelLayout(world, pipeline_stages=2)   # 2 stages x 2 replicas
    torch.manual_seed(0)
    model = torch.nn.Sequential(...)                           # the same on every rank
    cuts = dtrain.pipeline.balance_by_parameters(model, 2)
    stage = model[cuts[layout.stage]:cuts[layout.stage + 1]]   # keeps the model's names
    pipe = dtrain.pipeline.Pipeline([stage], layout.pipeline_group, schedule="1f1b",
                                    microbatches=8, data_group=layout.data_group)
    opt = torch.optim.SGD(pipe.parameters(), lr=0.1)
    for x, y in batches:                  # x is read on the first stage, y on the last
        opt.zero_grad()
        loss = pipe.step(x, y, F.cross_entropy)   # a tensor on the last stage, None elsewhere
        opt.step()

The loss function returns the mean over its micro-batch; each micro-batch's loss is weighed by
its share of the batch, so the gradients are those of the whole batch's mean (the unsplit
model's, to rounding). With a data group, each stage's gradients are averaged over its replicas
at the end of the step. Errors name the rank, its stages, the step, the action and the peer; a
failing rank aborts the pipeline's group, so every rank raises at once instead of waiting.
Ranks of the C++ runner and of this one may not be mixed in one pipeline (they agree on the
messages but a C++ stage cannot hold a Python module).
"""
import time

import numpy as np
import torch

from dtrain import _core
from dtrain._core import Error, InvalidArgumentError

__all__ = ["Pipeline", "schedule", "schedules", "verify", "balance", "balance_by_parameters",
           "ParallelLayout"]

ParallelLayout = _core.ParallelLayout

_ACTIVATION, _GRADIENT = 1, 2
_DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16",
           torch.bfloat16: "bf16", torch.int8: "i8", torch.uint8: "u8", torch.int32: "i32",
           torch.int64: "i64"}
_TORCH_DTYPES = {v: k for k, v in _DTYPES.items()}


def schedule(name, ranks, microbatches, virtual_stages=1):
    """The verified schedule: a dict with 'actions' ([(op, stage, microbatch), ...] per rank)."""
    return _core.pipeline_schedule(name, ranks, microbatches, virtual_stages)


def schedules():
    """[(name, summary, interleaved)] of the registered schedules."""
    return _core.pipeline_schedules()


def verify(sched, forward=1.0, backward_input=1.0, backward_weight=1.0, transfer=0.0):
    """Runs a schedule (a dict from schedule(), or its JSON) offline: bubble, makespan, peak
    micro-batches per rank, a text chart; 'ok' False and 'error' naming the action when wrong."""
    text = sched["json"] if isinstance(sched, dict) else sched
    return _core.pipeline_verify(text, forward, backward_input, backward_weight, transfer)


def balance(costs, parts):
    """Cut points of contiguous parts whose largest cost is the least possible (each part at
    least one item): part k is items cuts[k] .. cuts[k+1]-1. Items that cost nothing join the
    part before them, as the C++ balance() does."""
    costs = [float(c) for c in costs]
    n = len(costs)
    if parts < 1 or parts > n:
        raise InvalidArgumentError(
            f"balance: {n} modules cannot make {parts} stages of at least one module each")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            best[k][i] = min(max(best[k - 1][j], prefix[i] - prefix[j]) for j in range(k - 1, i))
    bound = best[parts][n] * (1 + 1e-12)
    cuts, i = [], 0
    for k in range(parts):
        cuts.append(i)
        total = costs[i]
        i += 1
        while i < n and n - i > parts - k - 1 and total + costs[i] <= bound:
            total += costs[i]
            i += 1
    return cuts + [n]


def balance_by_parameters(model, parts):
    """balance() of an nn.Sequential's children by their parameter counts."""
    return balance([sum(p.numel() for p in m.parameters()) for m in model], parts)


class _Slot:
    """One (stage, micro-batch) in flight on this rank."""
    __slots__ = ("input", "output", "grad_output", "module_outputs", "modules", "module_grads")

    def __init__(self):
        self.input = self.output = self.grad_output = None
        self.module_outputs, self.modules, self.module_grads = [], [], []


class Pipeline:
    """Runs this rank's stages of a pipeline (see the module's documentation).

    stages: this rank's stages (torch modules taking and returning one tensor) in model order:
    one, or ``virtual_stages`` for interleaved-1f1b (stages r, r + p, ...). group: the
    pipeline's ranks (a dtrain ProcessGroup: ``dtrain.init()``, a ``ParallelLayout``'s
    pipeline_group); rank i of it runs stage i. data_group: this stage's replicas, or None.
    Each message waits at most the group's timeout (``dtrain.init(timeout=...)``). Collective
    over `group`.
    """

    def __init__(self, stages, group, schedule="1f1b", microbatches=4, virtual_stages=1,
                 data_group=None):
        stages = list(stages)
        self._rank, self._p = group.rank, group.size
        self._group = group.new_group(list(range(self._p)))  # tags and abort of its own
        self._data = data_group if data_group is not None and data_group.size > 1 else None
        self._m = microbatches
        # What this rank cannot accept is said on every rank (the others would otherwise wait
        # for it until their timeout); then every rank must run the same schedule.
        refusal, self._id = None, 0
        try:
            self._sched = _core.pipeline_schedule(schedule, self._p, microbatches, virtual_stages)
            self._id = _core.pipeline_schedule_id(schedule, self._p, virtual_stages)
            self._last = self._p * virtual_stages - 1
            self._stage_ids = list(range(self._rank, self._last + 1, self._p))
            refusal = _refuse_stages(stages, self._stage_ids, self._sched)
        except Error as e:
            refusal = str(e)
        mine = np.array([0 if refusal else 1, self._id, microbatches, virtual_stages], np.int64)
        every = self._group.allgather(mine).reshape(self._p, 4)
        if refusal:
            raise InvalidArgumentError(f"Pipeline: {refusal}")
        for r, theirs in enumerate(every):
            if theirs[0] == 0:
                raise InvalidArgumentError(f"Pipeline: rank {r} of the pipeline refused its "
                                           f"stages or options (its error says why)")
            if not np.array_equal(theirs, mine):
                raise InvalidArgumentError(
                    f"Pipeline: rank {r} of the pipeline runs {theirs[2]} micro-batches, "
                    f"{theirs[3]} virtual stage(s) and schedule id 0x{int(theirs[1]):08x}; rank "
                    f"{self._rank} (this one) runs {microbatches} micro-batches of {schedule} with "
                    f"{virtual_stages} virtual stage(s) (id 0x{self._id:08x}): give every rank "
                    f"the same options")
        self._stages = dict(zip(self._stage_ids, stages))
        self._steps = 0
        self.stats = {}

    @property
    def schedule(self):
        """The schedule this rank runs (schedule()'s dict)."""
        return self._sched

    def parameters(self):
        """This rank's parameters (every stage it holds), for the optimizer."""
        return [p for s in self._stages.values() for p in s.parameters()]

    def holds_first_stage(self):
        return 0 in self._stages

    def holds_last_stage(self):
        return self._last in self._stages

    # Messages: a header (pipeline/message.h) then the tensor's bytes, with one tag per
    # (direction, sending stage, micro-batch).

    def _send(self, direction, stage_from, mb, tensor):
        to = stage_from + 1 if direction == _ACTIVATION else stage_from - 1
        peer = to % self._p
        if tensor.device.type != "cpu":
            raise InvalidArgumentError(
                f"stage {stage_from} produced a tensor on {tensor.device}: the pipeline's "
                f"messages go through host memory, so its stages run on the CPU")
        t = tensor.detach().contiguous()
        if peer == self._rank:
            self._local[(direction, stage_from, mb)] = t
            return
        dtype = _DTYPES.get(t.dtype)
        if dtype is None:
            raise InvalidArgumentError(f"tensors of dtype {t.dtype} cannot go between stages")
        header = _core.pipeline_encode_header(direction, stage_from, mb, self._steps,
                                              self._message_microbatches, self._id, dtype,
                                              list(t.shape))
        tag = _core.pipeline_message_tag(direction, stage_from, mb, self._last + 1)
        self._sends.append(self._group.isend(np.frombuffer(header, np.uint8), peer, tag))
        if t.numel() > 0:
            self._sends.append(self._group.isend(_bytes_of(t), peer, tag))
        self.stats["bytes_sent"] += len(header) + t.numel() * t.element_size()

    def _recv(self, direction, stage_to, mb):
        src = stage_to - 1 if direction == _ACTIVATION else stage_to + 1
        peer = src % self._p
        if peer == self._rank:
            return self._local.pop((direction, src, mb)), None
        started = time.perf_counter()
        tag = _core.pipeline_message_tag(direction, src, mb, self._last + 1)
        header = np.zeros(_core.PIPELINE_HEADER_BYTES, np.uint8)
        self._group.recv(header, src=peer, tag=tag)
        (d, stage, got_mb, step, microbatches, schedule_id, dtype, shape,
         text) = _core.pipeline_decode_header(header)
        kind = "activation" if direction == _ACTIVATION else "gradient"
        if schedule_id != self._id or (not self._forward_only and microbatches != self._m):
            raise InvalidArgumentError(
                f"rank {peer} runs another schedule or micro-batch count ({microbatches} "
                f"micro-batches, schedule id 0x{schedule_id:08x}) than this rank "
                f"({self._sched['name']}, {self._m} micro-batches, id 0x{self._id:08x}): give "
                f"every rank the same options")
        if d != direction or stage != src or got_mb != mb or step != self._steps:
            raise InvalidArgumentError(
                f"expected the {kind} of micro-batch {mb} from stage {src} (rank {peer}) for "
                f"step {self._steps}, got the {text}")
        t = torch.empty(shape, dtype=_TORCH_DTYPES[dtype])
        if t.numel() > 0:
            self._group.recv(_bytes_of(t), src=peer, tag=tag)
        self.stats["wait_ms"] += (time.perf_counter() - started) * 1e3
        return t, microbatches

    # The step.

    def _begin(self, forward_only):
        self._slots, self._grads, self._local, self._sends = {}, {}, {}, []
        self._held = 0
        self._forward_only = forward_only
        self._message_microbatches = self._m
        self._where = "setting up the step"
        self.stats = {"step": self._steps, "step_ms": 0.0, "compute_ms": 0.0, "wait_ms": 0.0,
                      "peak_microbatches": 0, "bytes_sent": 0}

    def _fail(self, e):
        stages = ", ".join(map(str, self._stage_ids))
        text = (f"rank {self._rank} of the pipeline (stage{'s' if len(self._stage_ids) > 1 else ''}"
                f" {stages}), step {self._steps}, {self._where}: {e}")
        # Every other rank of the pipeline fails at once with this text, and so do the stage's
        # replicas, which would wait in the gradient all-reduce.
        for g in (self._group, self._data):
            if g is not None:
                try:
                    g.abort(text)
                except Error:
                    pass
        if isinstance(e, Error):
            return type(e)(text)
        return InvalidArgumentError(text)

    def step(self, input, target, loss_fn):
        """One training step (forward and backward of every micro-batch as the schedule orders
        them); gradients accumulate into the stages' parameters (zero them before). Returns the
        batch's loss on the last stage's rank, None elsewhere."""
        try:
            return self._run_step(input, target, loss_fn)
        except KeyboardInterrupt:
            self._group.abort(f"rank {self._rank} of the pipeline was interrupted (Ctrl-C)")
            raise
        except Exception as e:  # noqa: BLE001 - every failure aborts the pipeline's group
            raise self._fail(e) from e

    def forward(self, input):
        """Forward only, without gradients (evaluation): the model's output for `input` on the
        last stage's rank, None elsewhere."""
        try:
            return self._run_forward(input)
        except KeyboardInterrupt:
            self._group.abort(f"rank {self._rank} of the pipeline was interrupted (Ctrl-C)")
            raise
        except Exception as e:  # noqa: BLE001
            raise self._fail(e) from e

    def _cut(self, t, what, stage):
        if t is None:
            raise InvalidArgumentError(f"the {what} is None; this rank holds stage {stage}, "
                                       f"which needs it")
        rows = t.shape[0] if t.dim() > 0 else 0
        if rows < self._m:
            raise InvalidArgumentError(
                f"the {what} has {rows} rows: it cannot make {self._m} micro-batches; give at "
                f"least {self._m} rows or fewer micro-batches")
        return list(torch.tensor_split(t, self._m))

    def _forward_pass(self, s, mb, x, split):
        slot = self._slots.setdefault((s, mb), _Slot())
        slot.input = x
        stage = self._stages[s]
        if split and isinstance(stage, torch.nn.Sequential):
            h = x
            for k, module in enumerate(stage):
                h = module(h)
                if h.requires_grad and any(p.requires_grad for p in module.parameters()):
                    slot.module_outputs.append(h)
                    slot.modules.append(module)
        else:
            h = stage(x)
            if split and h.requires_grad:
                slot.module_outputs.append(h)
                slot.modules.append(stage)
        slot.output = h
        self._held += 1
        self.stats["peak_microbatches"] = max(self.stats["peak_microbatches"], self._held)
        return slot

    def _backward_input(self, slot, s, mb):
        root_grad = torch.ones_like(slot.output) if s == self._last else slot.grad_output
        want_input = s > 0 and slot.input.requires_grad
        wrt = [slot.input] if want_input else []
        slot.module_grads = [None] * len(slot.module_outputs)
        asked = []
        for i, o in enumerate(slot.module_outputs):
            if o is slot.output:
                slot.module_grads[i] = root_grad
            else:
                wrt.append(o)
                asked.append(i)
        if not wrt:
            return
        g = torch.autograd.grad([slot.output], wrt, [root_grad], retain_graph=True,
                                allow_unused=True)
        j = 0
        if want_input:
            self._grads[(s, mb)] = g[0]
            j = 1
        for i in asked:
            slot.module_grads[i] = g[j]
            j += 1

    def _backward_weight(self, slot):
        for o, module, g in zip(slot.module_outputs, slot.modules, slot.module_grads):
            params = [p for p in module.parameters() if p.requires_grad]
            if g is not None and params:
                torch.autograd.backward([o], [g], retain_graph=True, inputs=params)

    def _run_step(self, input, target, loss_fn):
        self._begin(forward_only=False)
        started = time.perf_counter()
        split = self._sched["split_backward"]
        xs = self._cut(input, "input", 0) if self.holds_first_stage() else None
        ys = weights = None
        if self.holds_last_stage():
            ys = self._cut(target, "target", self._last)
            weights = [y.shape[0] / target.shape[0] for y in ys]
        loss_sum = None
        for index, (op, s, mb) in enumerate(self._sched["actions"][self._rank]):
            self._where = f"action {index} of {self._sched['name']} ({op} {mb} of stage {s})"
            t0 = time.perf_counter()
            if op == "recv_activation":
                t, _ = self._recv(_ACTIVATION, s, mb)
                if not t.is_floating_point():
                    raise InvalidArgumentError(
                        f"stage {s - 1} sent an activation of dtype {t.dtype}: activations "
                        f"between stages must be floating point, for their gradients")
                self._slots.setdefault((s, mb), _Slot()).input = t.requires_grad_(True)
                continue
            if op == "recv_gradient":
                self._slots[(s, mb)].grad_output = self._recv(_GRADIENT, s, mb)[0]
                continue
            if op == "send_activation":
                self._send(_ACTIVATION, s, mb, self._slots[(s, mb)].output)
                continue
            if op == "send_gradient":
                g = self._grads.pop((s, mb), None)
                if g is None:
                    raise InvalidArgumentError(
                        f"stage {s}'s input has no gradient (does its output depend on its input?)")
                self._send(_GRADIENT, s, mb, g)
                continue
            if op == "forward":
                x = xs[mb] if s == 0 else self._slots[(s, mb)].input
                slot = self._forward_pass(s, mb, x, split)
                if s == self._last:
                    loss = loss_fn(slot.output, ys[mb])
                    if loss.numel() != 1:
                        raise InvalidArgumentError(
                            f"the loss function returned a tensor of shape {list(loss.shape)}; "
                            f"return the mean over the micro-batch (a scalar)")
                    slot.output = loss.reshape(()) * weights[mb]
                    d = slot.output.detach()
                    loss_sum = d if loss_sum is None else loss_sum + d
            elif op == "backward":
                slot = self._slots.pop((s, mb))
                if slot.output.requires_grad:
                    if s == self._last:
                        slot.output.backward()
                    else:
                        slot.output.backward(slot.grad_output)
                if s > 0:
                    self._grads[(s, mb)] = slot.input.grad
                self._held -= 1
            elif op == "backward_input":
                self._backward_input(self._slots[(s, mb)], s, mb)
            elif op == "backward_weight":
                self._backward_weight(self._slots.pop((s, mb)))
                self._held -= 1
            self.stats["compute_ms"] += (time.perf_counter() - t0) * 1e3
            # A tensor is needed no longer than its send: keep only the sends still running (a
            # finished one's wait() returns at once, or raises its error now).
            still = []
            for w in self._sends:
                if w.is_completed():
                    w.wait()
                else:
                    still.append(w)
            self._sends = still
        self._where = "waiting for this step's sends"
        for w in self._sends:
            w.wait()
        self._sends = []
        if self._data is not None:
            self._where = "averaging gradients over the data-parallel group"
            self._average_over_replicas()
        self.stats["step_ms"] = (time.perf_counter() - started) * 1e3
        self._steps += 1
        return loss_sum

    def _average_over_replicas(self):
        for stage in self._stages.values():
            params = [p for p in stage.parameters() if p.requires_grad]
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            if not params:
                continue
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            self._data.allreduce(flat.numpy())
            flat /= self._data.size
            offset = 0
            for p in params:
                n = p.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p))
                offset += n

    def _run_forward(self, input):
        self._begin(forward_only=True)
        started = time.perf_counter()
        outputs, count = [], -1
        with torch.no_grad():
            if self.holds_first_stage():
                if input is None or input.dim() == 0 or input.shape[0] < 1:
                    raise InvalidArgumentError(
                        "the input is None or empty; this rank holds stage 0")
                xs = list(torch.tensor_split(input, min(self._m, input.shape[0])))
                count = self._message_microbatches = len(xs)
            mb = 0
            while count < 0 or mb < count:
                for s in self._stage_ids:
                    self._where = f"the forward of micro-batch {mb} of stage {s} (forward only)"
                    if s == 0:
                        x = xs[mb]
                    else:
                        x, n = self._recv(_ACTIVATION, s, mb)
                        if count < 0:
                            count = self._message_microbatches = n
                    t0 = time.perf_counter()
                    out = self._stages[s](x)
                    self.stats["compute_ms"] += (time.perf_counter() - t0) * 1e3
                    if s < self._last:
                        self._send(_ACTIVATION, s, mb, out)
                    else:
                        outputs.append(out)
                mb += 1
        self._where = "waiting for the forward's sends"
        for w in self._sends:
            w.wait()
        self._sends = []
        self.stats["step_ms"] = (time.perf_counter() - started) * 1e3
        self._steps += 1
        return torch.cat(outputs) if outputs else None


def _refuse_stages(stages, ids, sched):
    """What this rank's stages cannot do, or None."""
    if len(stages) != len(ids):
        return (f"rank {ids[0] % sched['ranks']} was given {len(stages)} stage modules for "
                f"{sched['virtual_stages']} virtual stage(s) per rank; give one module per stage "
                f"this rank holds ({', '.join(map(str, ids))})")
    for s, stage in zip(ids, stages):
        for p in stage.parameters():
            if p.device.type != "cpu":
                return (f"stage {s} has parameters on {p.device}: the pipeline's messages go "
                        f"through host memory, so its stages run on the CPU (move them with "
                        f".cpu())")
        if sched["split_backward"] and isinstance(stage, torch.nn.Sequential):
            # A split backward takes each module's weight gradient from that module's output
            # alone; a parameter two modules share would get the other's part twice.
            owner = {}
            for k, module in enumerate(stage):
                for p in module.parameters():
                    if owner.setdefault(id(p), k) != k:
                        return (f"stage {s} shares a parameter between its modules {owner[id(p)]} "
                                f"and {k}: {sched['name']} splits the backward by module and "
                                f"would count its gradient twice; use a schedule without the "
                                f"split (1f1b)")
    return None


def _bytes_of(t):
    """A contiguous tensor's memory as a NumPy array of bytes (no copy)."""
    return t.reshape(-1).view(torch.uint8).numpy()
