#include "python/torch/c10d_backend.h"

#include <numeric>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "dtrain/torch/tensor_view.h"
#include "python/python_site.h"
#include "python/torch/c10d_store.h"
#include "python/torch/c10d_work.h"

namespace dtrain::python {
namespace {

using std::chrono::milliseconds;

// Whether dtrain has a type of its own for `t`'s elements (it reduces those).
bool typed(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kChar:
    case at::kByte:
    case at::kShort:
    case at::kInt:
    case at::kLong:
    case at::kBool:
      return true;
    default:
      return false;
  }
}

// How an operation that only moves data counts `t`: in its own elements where dtrain has their
// type, else in bytes (float8, uint16, complex ...: any dtype moves, none needs arithmetic).
int64_t unit_bytes(const at::Tensor& t) { return typed(t) ? 1 : t.element_size(); }

DType dtype_of(const at::Tensor& t) {
  // bool travels as a byte (0 or 1); reductions map to logical ones (reduce_op below).
  if (t.scalar_type() == at::kBool) return DType::kU8;
  return typed(t) ? dtrain::to_dtype(t.scalar_type()) : DType::kU8;
}

// The view dtrain reads and writes: the tensor's own memory, which must be contiguous. Its
// elements are bytes where dtrain has no type for them (unit_bytes).
TensorView view_of(const at::Tensor& t) {
  if (!t.is_cuda() && !t.is_cpu())
    throw InvalidArgumentError(
        fmt::format("dtrain backend: tensors on {} cannot be communicated (CPU and CUDA only)",
                    t.device().str()));
  return placed_as(
      TensorView{t.data_ptr(), static_cast<size_t>(t.numel() * unit_bytes(t)), dtype_of(t)}, t);
}

using OpSite = C10dBackend::OpSite;

std::string str(const OpSite& s) {
  return fmt::format("{} on rank {} of group {}", s.op, s.rank, s.group);
}

// The one tensor torch passes per process (lists of several are for one process driving several
// GPUs, which dtrain does not do: one process per GPU).
at::Tensor& single(std::vector<at::Tensor>& tensors, const OpSite& op) {
  if (tensors.size() != 1)
    throw InvalidArgumentError(fmt::format(
        "dtrain backend: {} takes one tensor per process, got a list of {} (run one process "
        "per device)",
        str(op), tensors.size()));
  return tensors[0];
}

ReduceOp reduce_op(const c10d::ReduceOp& op, const at::Tensor& t, const OpSite& what) {
  if (!typed(t))
    throw InvalidArgumentError(fmt::format(
        "dtrain backend: {} cannot reduce {} tensors (it reduces float, double, half, bfloat16, "
        "int8, uint8, int16, int32, int64 and bool; every dtype can be broadcast, gathered, "
        "scattered, sent and exchanged all to all)",
        str(what), c10::toString(t.scalar_type())));
  const bool boolean = t.scalar_type() == at::kBool;
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return boolean ? ReduceOp::kMax : ReduceOp::kSum;  // logical or
    case c10d::ReduceOp::PREMUL_SUM:
      return ReduceOp::kSum;  // after scaling: see premultiply
    case c10d::ReduceOp::AVG:
      if (boolean) break;
      return ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT:
      return boolean ? ReduceOp::kMin : ReduceOp::kProd;  // and
    case c10d::ReduceOp::MIN:
      return ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return ReduceOp::kMax;
    case c10d::ReduceOp::BAND:
      return ReduceOp::kBand;
    case c10d::ReduceOp::BOR:
      return ReduceOp::kBor;
    case c10d::ReduceOp::BXOR:
      return ReduceOp::kBxor;
    default:
      break;
  }
  throw InvalidArgumentError(
      fmt::format("dtrain backend: {} with reduce op {} on {} tensors is "
                  "not supported",
                  str(what), static_cast<int>(op.op_), c10::toString(t.scalar_type())));
}

// PREMUL_SUM (torch.distributed._make_nccl_premul_sum): multiply by the factor, then sum.
void premultiply(const c10d::ReduceOp& op, at::Tensor& t) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return;
  auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  if (s == nullptr) throw InvalidArgumentError("dtrain backend: PREMUL_SUM without its factor");
  if (s->tensor_factor.defined())
    t.mul_(s->tensor_factor.to(t.device()));
  else
    t.mul_(s->double_factor);
}

// A contiguous tensor the operation can use in place of `t`: `t` itself when it is contiguous,
// else a copy (copied back by the caller once the operation succeeds, when `t` is an output).
at::Tensor contiguous(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// One flat buffer of `tensors` laid end to end (same dtype and device as the first).
at::Tensor flat_like(const std::vector<at::Tensor>& tensors, const at::Tensor& like) {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.numel();
  return at::empty({n}, like.options());
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* op, const char* what) {
  if (a.scalar_type() != b.scalar_type() || a.device() != b.device())
    throw InvalidArgumentError(fmt::format(
        "dtrain backend: {}: {} must have the input's dtype and device ({} on {}), got {} on {}",
        op, what, c10::toString(b.scalar_type()), b.device().str(), c10::toString(a.scalar_type()),
        a.device().str()));
}

void check_list(const std::vector<at::Tensor>& list, size_t n, int64_t numel,
                const at::Tensor& like, const char* op, const char* what) {
  if (list.size() != n)
    throw InvalidArgumentError(fmt::format(
        "dtrain backend: {}: {} has {} tensors; the group has {} ranks", op, what, list.size(), n));
  for (size_t i = 0; i < list.size(); ++i) {
    check_same(list[i], like, op, what);
    if (list[i].numel() != numel)
      throw InvalidArgumentError(
          fmt::format("dtrain backend: {}: tensor {} of {} has {} elements, the input {}", op, i,
                      what, list[i].numel(), numel));
  }
}

// Copies block i of `flat` (blocks of each destination's size, in order) into each destination.
void copy_out(const at::Tensor& flat, std::vector<at::Tensor>& dests) {
  int64_t off = 0;
  for (auto& d : dests) {
    d.copy_(flat.narrow(0, off, d.numel()).view(d.sizes()));
    off += d.numel();
  }
}

void copy_in(at::Tensor& flat, const std::vector<at::Tensor>& sources) {
  int64_t off = 0;
  for (const auto& s : sources) {
    flat.narrow(0, off, s.numel()).copy_(s.reshape({-1}));
    off += s.numel();
  }
}

}  // namespace

C10dBackend::C10dBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         const GroupOptions& options)
    : c10d::Backend(rank, size),
      completer_(std::make_shared<FutureCompleter>()),
      options_(c10::make_intrusive<c10d::Backend::Options>("dtrain", options.timeout)) {
  options_->group_name = options.name;
  ProcessGroupOptions o;
  o.name = options.name;
  o.timeout = options.timeout;
  // torch's timeout bounds the group's making too (its store waits): members that never come,
  // such as ranks that built different meshes, fail the call within it.
  o.connect_timeout =
      options.connect_timeout.count() > 0 ? options.connect_timeout : options.timeout;
  // torch's blocking calls wait right after the asynchronous call: let them run the collective
  // on their own thread (docs/performance.md, "PyTorch on dtrain"). DDP's all-reduces start
  // within the grace, still overlapping backward.
  o.async_grace = std::chrono::microseconds(200);
  pg_ = dtrain::ProcessGroup::create(std::make_shared<C10dStore>(store), rank, size, o);
}

C10dBackend::~C10dBackend() = default;

milliseconds C10dBackend::timeout_of(milliseconds t) const {
  // Unset: setTimeout's, else 0, which dtrain reads as the group's own default.
  return t == c10d::kUnsetTimeout ? default_timeout_.load() : t;
}

c10::intrusive_ptr<C10dWork> C10dBackend::make_work(c10d::OpType type, const char* title,
                                                    bool collective) {
  const uint64_t seq = collective ? seq_.fetch_add(1) + 1 : 0;
  auto work = c10::make_intrusive<C10dWork>(rank_, type, title, completer_, collective, seq);
  if (coalesced_) coalesced_->push_back(work);
  return work;
}

void C10dBackend::startCoalescing() {
  if (coalesced_)
    throw InvalidArgumentError(fmt::format(
        "dtrain backend: startCoalescing on rank {} of group {} while already coalescing (end "
        "the first with endCoalescing)",
        rank_, pg_->name()));
  coalesced_.emplace();
}

c10::intrusive_ptr<c10d::Work> C10dBackend::endCoalescing() {
  if (!coalesced_)
    throw InvalidArgumentError(
        fmt::format("dtrain backend: endCoalescing on rank {} of group {} without startCoalescing",
                    rank_, pg_->name()));
  std::vector<c10::intrusive_ptr<C10dWork>> parts = std::move(*coalesced_);
  coalesced_.reset();
  auto work = c10::make_intrusive<C10dWork>(rank_, c10d::OpType::COALESCED, "dtrain:coalesced",
                                            completer_, true, seq_.load());
  std::vector<at::Tensor> outputs;
  for (auto& part : parts) {
    for (auto& t : part->result()) outputs.push_back(t);
    work->add(std::move(part));
  }
  work->set_result(std::move(outputs));
  return work;
}

void C10dBackend::setTimeout(milliseconds timeout) { default_timeout_.store(timeout); }

void C10dBackend::abort() {
  pg_->abort(fmt::format("torch aborted the process group on rank {}", rank_));
}

c10::intrusive_ptr<c10d::Work> C10dBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                      const c10d::BroadcastOptions& opts) {
  const PythonCaller caller;
  at::Tensor t = single(tensors, site("broadcast"));
  at::Tensor buf = contiguous(t);
  auto work = make_work(c10d::OpType::BROADCAST, "dtrain:broadcast", true);
  work->add(pg_->broadcast(view_of(buf), {.root = static_cast<int>(opts.rootRank),
                                          .timeout = timeout_of(opts.timeout)}));
  work->keep_alive(buf);
  if (!buf.is_same(t)) work->then([t, buf]() mutable { t.copy_(buf); });
  work->set_result({t});
  return work;
}

c10::intrusive_ptr<c10d::Work> C10dBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts) {
  at::Tensor t = single(tensors, site("all_reduce"));
  const ReduceOp op = reduce_op(opts.reduceOp, t, site("all_reduce"));
  auto work = make_work(c10d::OpType::ALLREDUCE, "dtrain:all_reduce", true);
  if (size_ == 1 && opts.reduceOp.op_ != c10d::ReduceOp::PREMUL_SUM) {
    // Every reduction of one rank's tensor is that tensor: a Work that has ended, no hand-off to
    // the group's thread (a script run alone calls all_reduce as often as a job does).
    work->set_result({t});
    return work;
  }
  const PythonCaller caller;
  at::Tensor buf = contiguous(t);
  premultiply(opts.reduceOp, buf);
  work->add(pg_->allreduce(view_of(buf), {.op = op, .timeout = timeout_of(opts.timeout)}));
  work->keep_alive(buf);
  if (!buf.is_same(t)) work->then([t, buf]() mutable { t.copy_(buf); });
  work->set_result({t});
  return work;
}

c10::intrusive_ptr<c10d::Work> C10dBackend::allreduce_compressed(const at::Tensor& tensor,
                                                                 Wire wire,
                                                                 const at::Tensor& error) {
  const PythonCaller caller;
  if (wire == Wire::kExact)
    throw InvalidArgumentError(fmt::format(
        "rank {}: allreduce_compressed: the exact wire is torch.distributed.all_reduce; choose "
        "int8, int4, bf16 or fp16",
        rank_));
  for (const at::Tensor* t : {&tensor, &error})
    if (t->defined() && !t->is_contiguous())
      throw InvalidArgumentError(fmt::format(
          "rank {}: all_reduce with {} on the wire takes contiguous tensors; the {} is not", rank_,
          to_string(wire), t == &tensor ? "tensor" : "error-feedback buffer"));
  const char* title = wire == Wire::kInt8   ? "dtrain:all_reduce_int8"
                      : wire == Wire::kInt4 ? "dtrain:all_reduce_int4"
                      : wire == Wire::kBf16 ? "dtrain:all_reduce_bf16"
                                            : "dtrain:all_reduce_fp16";
  auto work = make_work(c10d::OpType::ALLREDUCE, title, true);
  AllreduceOptions o{.op = ReduceOp::kAvg, .timeout = timeout_of(c10d::kUnsetTimeout)};
  o.wire = wire;
  if (error.defined()) o.error = view_of(error);
  work->add(pg_->allreduce(view_of(tensor), o));
  work->keep_alive(tensor);
  if (error.defined()) work->keep_alive(error);
  work->set_result({tensor});
  return work;
}

c10::intrusive_ptr<c10d::Work> C10dBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const PythonCaller caller;
  if (tensors.empty())
    throw InvalidArgumentError("dtrain backend: allreduce_coalesced of an empty list");
  for (const auto& t : tensors) check_same(t, tensors[0], "allreduce_coalesced", "every tensor");
  const ReduceOp op = reduce_op(opts.reduceOp, tensors[0], site("allreduce_coalesced"));
  at::Tensor flat = flat_like(tensors, tensors[0]);
  copy_in(flat, tensors);
  premultiply(opts.reduceOp, flat);
  auto work = make_work(c10d::OpType::ALLREDUCE_COALESCED, "dtrain:allreduce_coalesced", true);
  work->add(pg_->allreduce(view_of(flat), {.op = op, .timeout = timeout_of(opts.timeout)}));
  work->keep_alive(flat);
  work->then([tensors, flat]() mutable { copy_out(flat, tensors); });
  work->set_result(tensors);
  return work;
}

c10::intrusive_ptr<c10d::Work> C10dBackend::reduce(std::vector<at::Tensor>& tensors,
                                                   const c10d::ReduceOptions& opts) {
  const PythonCaller caller;
  at::Tensor t = single(tensors, site("reduce"));
  const ReduceOp op = reduce_op(opts.reduceOp, t, site("reduce"));
  const bool root = opts.rootRank == rank_;
  // dtrain's reduce leaves the other ranks' buffers undefined; torch users expect theirs intact.
  at::Tensor buf = root ? contiguous(t) : t.contiguous().clone();
  premultiply(opts.reduceOp, buf);
  auto work = make_work(c10d::OpType::REDUCE, "dtrain:reduce", true);
  work->add(pg_->reduce(
      view_of(buf),
      {.root = static_cast<int>(opts.rootRank), .op = op, .timeout = timeout_of(opts.timeout)}));
  work->keep_alive(buf);
  if (root && !buf.is_same(t)) work->then([t, buf]() mutable { t.copy_(buf); });
  work->set_result({t});
  return work;
}

c10::intrusive_ptr<c10d::Work> C10dBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllgatherOptions& opts) {
  const PythonCaller caller;
  at::Tensor in = contiguous(single(inputs, site("all_gather")));
  if (outputs.size() != 1)
    throw InvalidArgumentError(fmt::format(
        "dtrain backend: all_gather takes one output list per process, got {}", outputs.size()));
  auto& outs = outputs[0];
  check_list(outs, size_, in.numel(), in, "all_gather", "the output list");
  at::Tensor flat = at::empty({in.numel() * size_}, in.options());
  auto work = make_work(c10d::OpType::ALLGATHER, "dtrain:all_gather", true);
  work->add(pg_->allgather(view_of(flat), view_of(in), {.timeout = timeout_of(opts.timeout)}));
  work->keep_alive(in);
  work->keep_alive(flat);
  work->then([outs, flat]() mutable { copy_out(flat, outs); });
  work->set_result(outs);
  return work;
}

c10::intrusive_ptr<c10d::Work> C10dBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                            const c10d::AllgatherOptions& opts) {
  const PythonCaller caller;
  check_same(output, input, "all_gather_into_tensor", "the output");
  if (output.numel() != input.numel() * size_)
    throw InvalidArgumentError(fmt::format(
        "dtrain backend: all_gather_into_tensor: the output has {} elements; it needs world "
        "size x input = {} x {}",
        output.numel(), size_, input.numel()));
  at::Tensor in = contiguous(input), out = contiguous(output);
  auto work = make_work(c10d::OpType::_ALLGATHER_BASE, "dtrain:all_gather_into_tensor", true);
  work->add(pg_->allgather(view_of(out), view_of(in), {.timeout = timeout_of(opts.timeout)}));
  work->keep_alive(in);
  work->keep_alive(out);
  if (!out.is_same(output)) work->then([output, out]() mutable { output.copy_(out); });
  work->set_result({output});
  return work;
}

c10::intrusive_ptr<c10d::Work> C10dBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const PythonCaller caller;
  // torch's layout: one list per rank, each holding that rank's copy of every input.
  if (outputs.size() != static_cast<size_t>(size_))
    throw InvalidArgumentError(
        fmt::format("dtrain backend: allgather_coalesced: {} output lists; it takes one per rank "
                    "of the group ({}), each with one tensor per input",
                    outputs.size(), size_));
  if (inputs.empty())
    throw InvalidArgumentError("dtrain backend: allgather_coalesced of an empty list");
  for (size_t r = 0; r < outputs.size(); ++r) {
    if (outputs[r].size() != inputs.size())
      throw InvalidArgumentError(fmt::format(
          "dtrain backend: allgather_coalesced: output list {} has {} tensors for {} inputs", r,
          outputs[r].size(), inputs.size()));
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_same(outputs[r][i], inputs[i], "allgather_coalesced", "an output");
      if (outputs[r][i].numel() != inputs[i].numel())
        throw InvalidArgumentError(fmt::format(
            "dtrain backend: allgather_coalesced: output {} of rank {} has {} elements, input {} "
            "has {}",
            i, r, outputs[r][i].numel(), i, inputs[i].numel()));
    }
  }
  for (const auto& t : inputs) check_same(t, inputs[0], "allgather_coalesced", "every input");
  // One all-gather of every input laid end to end: rank r's block is its inputs in order.
  at::Tensor block = flat_like(inputs, inputs[0]);
  copy_in(block, inputs);
  at::Tensor flat = at::empty({block.numel() * size_}, block.options());
  auto work = make_work(c10d::OpType::ALLGATHER_COALESCED, "dtrain:allgather_coalesced", true);
  work->add(pg_->allgather(view_of(flat), view_of(block), {.timeout = timeout_of(opts.timeout)}));
  work->keep_alive(block);
  work->keep_alive(flat);
  work->then([outputs, flat, per = block.numel()]() mutable {
    for (size_t r = 0; r < outputs.size(); ++r) copy_out(flat.narrow(0, r * per, per), outputs[r]);
  });
  std::vector<at::Tensor> result;
  for (auto& list : outputs) result.insert(result.end(), list.begin(), list.end());
  work->set_result(result);
  return work;
}

c10::intrusive_ptr<c10d::Work> C10dBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const PythonCaller caller;
  if (outputs.size() != inputs.size() || inputs.empty())
    throw InvalidArgumentError(fmt::format(
        "dtrain backend: allgather_into_tensor_coalesced: {} outputs for {} inputs (one each, "
        "at least one)",
        outputs.size(), inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_same(outputs[i], inputs[i], "allgather_into_tensor_coalesced", "an output");
    if (outputs[i].numel() != inputs[i].numel() * size_)
      throw InvalidArgumentError(fmt::format(
          "dtrain backend: allgather_into_tensor_coalesced: output {} has {} elements; it needs "
          "world size x input = {} x {}",
          i, outputs[i].numel(), size_, inputs[i].numel()));
  }
  if (inputs.size() == 1) return _allgather_base(outputs[0], inputs[0], opts);
  for (const auto& t : inputs)
    check_same(t, inputs[0], "allgather_into_tensor_coalesced", "every input");
  // One all-gather of the inputs laid end to end; output i takes piece i of every rank's block.
  at::Tensor block = flat_like(inputs, inputs[0]);
  copy_in(block, inputs);
  at::Tensor flat = at::empty({block.numel() * size_}, block.options());
  auto work =
      make_work(c10d::OpType::ALLGATHER_COALESCED, "dtrain:allgather_into_tensor_coalesced", true);
  work->add(pg_->allgather(view_of(flat), view_of(block), {.timeout = timeout_of(opts.timeout)}));
  work->keep_alive(block);
  work->keep_alive(flat);
  const int n = size_;
  work->then([outputs, inputs, flat, n, per = block.numel()]() mutable {
    int64_t off = 0;
    for (size_t i = 0; i < outputs.size(); ++i) {
      const int64_t k = inputs[i].numel();
      // rank r's copy of input i sits at r * per + off in flat: a strided view of n rows of k.
      outputs[i].copy_(flat.view({n, per}).narrow(1, off, k).reshape(outputs[i].sizes()));
      off += k;
    }
  });
  work->set_result(outputs);
  return work;
}

c10::intrusive_ptr<c10d::Work> C10dBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs,
                                                   const c10d::GatherOptions& opts) {
  const PythonCaller caller;
  at::Tensor in = contiguous(single(inputs, site("gather")));
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor flat;
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    if (outputs.size() != 1)
      throw InvalidArgumentError(fmt::format(
          "dtrain backend: gather: the root takes one output list, got {}", outputs.size()));
    outs = outputs[0];
    check_list(outs, size_, in.numel(), in, "gather", "the root's output list");
    flat = at::empty({in.numel() * size_}, in.options());
  } else if (!outputs.empty() && !outputs[0].empty()) {
    throw InvalidArgumentError(fmt::format(
        "dtrain backend: gather: rank {} is not the root ({}) and must pass no output list", rank_,
        root));
  }
  auto work = make_work(c10d::OpType::GATHER, "dtrain:gather", true);
  TensorView out_view = flat.defined() ? view_of(flat) : TensorView{nullptr, 0, dtype_of(in)};
  work->add(
      pg_->gather(out_view, view_of(in), {.root = root, .timeout = timeout_of(opts.timeout)}));
  work->keep_alive(in);
  if (flat.defined()) {
    work->keep_alive(flat);
    work->then([outs, flat]() mutable { copy_out(flat, outs); });
  }
  work->set_result(outs);
  return work;
}

c10::intrusive_ptr<c10d::Work> C10dBackend::scatter(std::vector<at::Tensor>& outputs,
                                                    std::vector<std::vector<at::Tensor>>& inputs,
                                                    const c10d::ScatterOptions& opts) {
  const PythonCaller caller;
  at::Tensor output = single(outputs, site("scatter"));
  at::Tensor out = contiguous(output);
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor flat;
  if (rank_ == root) {
    if (inputs.size() != 1)
      throw InvalidArgumentError(fmt::format(
          "dtrain backend: scatter: the root takes one input list, got {}", inputs.size()));
    check_list(inputs[0], size_, out.numel(), out, "scatter", "the root's input list");
    flat = flat_like(inputs[0], out);
    copy_in(flat, inputs[0]);
  } else if (!inputs.empty() && !inputs[0].empty()) {
    throw InvalidArgumentError(fmt::format(
        "dtrain backend: scatter: rank {} is not the root ({}) and must pass no input list", rank_,
        root));
  }
  auto work = make_work(c10d::OpType::SCATTER, "dtrain:scatter", true);
  TensorView in_view = flat.defined() ? view_of(flat) : TensorView{nullptr, 0, dtype_of(out)};
  work->add(
      pg_->scatter(view_of(out), in_view, {.root = root, .timeout = timeout_of(opts.timeout)}));
  work->keep_alive(out);
  if (flat.defined()) work->keep_alive(flat);
  if (!out.is_same(output)) work->then([output, out]() mutable { output.copy_(out); });
  work->set_result({output});
  return work;
}

c10::intrusive_ptr<c10d::Work> C10dBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const PythonCaller caller;
  at::Tensor output = single(outputs, site("reduce_scatter"));
  if (inputs.size() != 1)
    throw InvalidArgumentError(fmt::format(
        "dtrain backend: reduce_scatter takes one input list per process, got {}", inputs.size()));
  check_list(inputs[0], size_, output.numel(), output, "reduce_scatter", "the input list");
  const ReduceOp op = reduce_op(opts.reduceOp, output, site("reduce_scatter"));
  at::Tensor flat = flat_like(inputs[0], output);
  copy_in(flat, inputs[0]);
  premultiply(opts.reduceOp, flat);
  at::Tensor out = contiguous(output);
  auto work = make_work(c10d::OpType::REDUCE_SCATTER, "dtrain:reduce_scatter", true);
  work->add(pg_->reduce_scatter(view_of(out), view_of(flat),
                                {.op = op, .timeout = timeout_of(opts.timeout)}));
  work->keep_alive(flat);
  work->keep_alive(out);
  if (!out.is_same(output)) work->then([output, out]() mutable { output.copy_(out); });
  work->set_result({output});
  return work;
}

c10::intrusive_ptr<c10d::Work> C10dBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const PythonCaller caller;
  check_same(output, input, "reduce_scatter_tensor", "the output");
  if (input.numel() != output.numel() * size_)
    throw InvalidArgumentError(fmt::format(
        "dtrain backend: reduce_scatter_tensor: the input has {} elements; it needs world size "
        "x output = {} x {}",
        input.numel(), size_, output.numel()));
  const ReduceOp op = reduce_op(opts.reduceOp, output, site("reduce_scatter_tensor"));
  at::Tensor in = contiguous(input);
  if (opts.reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM) {
    in = in.clone();  // the caller's input stays as it was
    premultiply(opts.reduceOp, in);
  }
  at::Tensor out = contiguous(output);
  auto work = make_work(c10d::OpType::_REDUCE_SCATTER_BASE, "dtrain:reduce_scatter_tensor", true);
  work->add(pg_->reduce_scatter(view_of(out), view_of(in),
                                {.op = op, .timeout = timeout_of(opts.timeout)}));
  work->keep_alive(in);
  work->keep_alive(out);
  if (!out.is_same(output)) work->then([output, out]() mutable { output.copy_(out); });
  work->set_result({output});
  return work;
}

c10::intrusive_ptr<c10d::Work> C10dBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const PythonCaller caller;
  if (outputs.size() != inputs.size() || inputs.empty())
    throw InvalidArgumentError(fmt::format(
        "dtrain backend: reduce_scatter_tensor_coalesced: {} outputs for {} inputs (one each, "
        "at least one)",
        outputs.size(), inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_same(outputs[i], inputs[i], "reduce_scatter_tensor_coalesced", "an output");
    if (inputs[i].numel() != outputs[i].numel() * size_)
      throw InvalidArgumentError(fmt::format(
          "dtrain backend: reduce_scatter_tensor_coalesced: input {} has {} elements; it needs "
          "world size x output = {} x {}",
          i, inputs[i].numel(), size_, outputs[i].numel()));
  }
  if (inputs.size() == 1) return _reduce_scatter_base(outputs[0], inputs[0], opts);
  for (const auto& t : inputs)
    check_same(t, inputs[0], "reduce_scatter_tensor_coalesced", "every input");
  const ReduceOp op = reduce_op(opts.reduceOp, outputs[0], site("reduce_scatter_tensor_coalesced"));
  // Block r of the flat input (for rank r) is block r of every input in turn; the flat output
  // is every output laid end to end.
  int64_t per = 0;
  for (const auto& t : outputs) per += t.numel();
  const int n = size_;
  at::Tensor flat_in = at::empty({per * n}, inputs[0].options());
  int64_t off = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int64_t k = outputs[i].numel();
    flat_in.view({n, per}).narrow(1, off, k).copy_(inputs[i].reshape({n, k}));
    off += k;
  }
  premultiply(opts.reduceOp, flat_in);
  at::Tensor flat_out = at::empty({per}, outputs[0].options());
  auto work =
      make_work(c10d::OpType::REDUCE_SCATTER, "dtrain:reduce_scatter_tensor_coalesced", true);
  work->add(pg_->reduce_scatter(view_of(flat_out), view_of(flat_in),
                                {.op = op, .timeout = timeout_of(opts.timeout)}));
  work->keep_alive(flat_in);
  work->keep_alive(flat_out);
  work->then([outputs, flat_out]() mutable { copy_out(flat_out, outputs); });
  work->set_result(outputs);
  return work;
}

c10::intrusive_ptr<c10d::Work> C10dBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                          std::vector<int64_t>& output_split_sizes,
                                                          std::vector<int64_t>& input_split_sizes,
                                                          const c10d::AllToAllOptions& opts) {
  const PythonCaller caller;
  check_same(output, input, "all_to_all_single", "the output");
  at::Tensor in = contiguous(input), out = contiguous(output);
  auto work = make_work(c10d::OpType::ALLTOALL_BASE, "dtrain:all_to_all_single", true);
  const milliseconds timeout = timeout_of(opts.timeout);
  if (output_split_sizes.empty() && input_split_sizes.empty()) {
    work->add(pg_->alltoall(view_of(out), view_of(in), {.timeout = timeout}));
  } else {
    // Split sizes count rows (the first dimension); dtrain counts elements.
    auto counts = [&](const std::vector<int64_t>& splits, const at::Tensor& t, const char* what) {
      const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
      const int64_t row = rows == 0 ? 0 : t.numel() / rows;
      std::vector<size_t> c(size_);
      if (splits.empty()) {
        if (rows % size_ != 0)
          throw InvalidArgumentError(fmt::format(
              "dtrain backend: all_to_all_single: {} has {} rows, not a multiple of the world "
              "size {}; pass its split sizes",
              what, rows, size_));
        std::fill(c.begin(), c.end(), static_cast<size_t>(rows / size_ * row * unit_bytes(t)));
        return c;
      }
      if (splits.size() != static_cast<size_t>(size_))
        throw InvalidArgumentError(
            fmt::format("dtrain backend: all_to_all_single: {} split sizes for {} ranks",
                        splits.size(), size_));
      int64_t total = 0;
      for (int i = 0; i < size_; ++i) {
        if (splits[i] < 0)
          throw InvalidArgumentError(fmt::format(
              "dtrain backend: all_to_all_single: split size {} of {} is negative", i, what));
        c[i] = static_cast<size_t>(splits[i] * row * unit_bytes(t));
        total += splits[i];
      }
      if (total != rows)
        throw InvalidArgumentError(fmt::format(
            "dtrain backend: all_to_all_single: the split sizes of {} add up to {} rows; it has {}",
            what, total, rows));
      return c;
    };
    auto in_counts = counts(input_split_sizes, in, "the input");
    auto out_counts = counts(output_split_sizes, out, "the output");
    work->add(
        pg_->alltoallv(view_of(out), out_counts, view_of(in), in_counts, {.timeout = timeout}));
  }
  work->keep_alive(in);
  work->keep_alive(out);
  if (!out.is_same(output)) work->then([output, out]() mutable { output.copy_(out); });
  work->set_result({output});
  return work;
}

c10::intrusive_ptr<c10d::Work> C10dBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllToAllOptions& opts) {
  const PythonCaller caller;
  if (inputs.size() != static_cast<size_t>(size_) || outputs.size() != static_cast<size_t>(size_))
    throw InvalidArgumentError(
        fmt::format("dtrain backend: all_to_all: {} inputs and {} outputs; the group has {} ranks",
                    inputs.size(), outputs.size(), size_));
  for (const auto& t : inputs) check_same(t, inputs[0], "all_to_all", "every input");
  for (const auto& t : outputs) check_same(t, inputs[0], "all_to_all", "every output");
  std::vector<size_t> in_counts, out_counts;
  for (const auto& t : inputs) in_counts.push_back(static_cast<size_t>(t.numel() * unit_bytes(t)));
  for (const auto& t : outputs)
    out_counts.push_back(static_cast<size_t>(t.numel() * unit_bytes(t)));
  at::Tensor in = flat_like(inputs, inputs[0]), out = flat_like(outputs, inputs[0]);
  copy_in(in, inputs);
  auto work = make_work(c10d::OpType::ALLTOALL, "dtrain:all_to_all", true);
  work->add(pg_->alltoallv(view_of(out), out_counts, view_of(in), in_counts,
                           {.timeout = timeout_of(opts.timeout)}));
  work->keep_alive(in);
  work->keep_alive(out);
  work->then([outputs, out]() mutable { copy_out(out, outputs); });
  work->set_result(outputs);
  return work;
}

c10::intrusive_ptr<c10d::Work> C10dBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                 int tag) {
  const PythonCaller caller;
  at::Tensor t = contiguous(single(tensors, site("send")));
  auto work = make_work(c10d::OpType::SEND, "dtrain:send", false);
  work->add(pg_->isend(view_of(t), dst, tag));
  work->keep_alive(t);
  return work;
}

c10::intrusive_ptr<c10d::Work> C10dBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                 int tag) {
  const PythonCaller caller;
  at::Tensor t = single(tensors, site("recv"));
  at::Tensor buf = contiguous(t);
  auto work = make_work(c10d::OpType::RECV, "dtrain:recv", false);
  work->add(pg_->irecv(view_of(buf), src, tag));
  work->keep_alive(buf);
  if (!buf.is_same(t)) work->then([t, buf]() mutable { t.copy_(buf); });
  work->set_result({t});
  return work;
}

c10::intrusive_ptr<c10d::Work> C10dBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                          int tag) {
  const PythonCaller caller;
  at::Tensor t = single(tensors, site("recv"));
  at::Tensor buf = contiguous(t);
  auto work = make_work(c10d::OpType::RECVANYSOURCE, "dtrain:recv_anysource", false);
  work->add(pg_->irecv_any(view_of(buf), tag));
  work->keep_alive(buf);
  if (!buf.is_same(t)) work->then([t, buf]() mutable { t.copy_(buf); });
  work->set_result({t});
  return work;
}

c10::intrusive_ptr<c10d::Work> C10dBackend::barrier(const c10d::BarrierOptions& opts) {
  const PythonCaller caller;
  auto work = make_work(c10d::OpType::BARRIER, "dtrain:barrier", true);
  work->add(pg_->barrier({.timeout = timeout_of(opts.timeout)}));
  return work;
}

void C10dBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  const PythonCaller caller;
  seq_.fetch_add(1);
  pg_->barrier({.timeout = timeout_of(opts.timeout)})->wait();
}

std::shared_ptr<dtrain::ProcessGroup> dtrain_group(const c10::intrusive_ptr<c10d::Backend>& backend,
                                                   const char* what) {
  if (!backend) return nullptr;
  auto* ours = dynamic_cast<C10dBackend*>(backend.get());
  if (ours == nullptr)
    throw InvalidArgumentError(
        fmt::format("{}: the group's backend is {}, not dtrain's: make the group with "
                    "init_process_group('dtrain') or new_group(backend='dtrain')",
                    what, backend->getBackendName()));
  return ours->shared_group();
}

}  // namespace dtrain::python
