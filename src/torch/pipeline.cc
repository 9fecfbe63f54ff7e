// The pipeline runner: executes this rank's list of a schedule (dtrain/pipeline/schedule.h) on
// LibTorch stages, with self-describing messages (pipeline/message.h) over a private sub-group
// of the pipeline's group (so its tags are its own, and abort() there tells every peer).
#include "dtrain/torch/pipeline.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <numeric>
#include <tuple>

#include <fmt/format.h>
#include <torch/torch.h>

#include "common/log.h"
#include "dtrain/error.h"
#include "dtrain/pipeline/verifier.h"
#include "dtrain/torch/tensor_view.h"
#include "pipeline/message.h"

namespace dtrain {
namespace {

using pipeline::Action;
using pipeline::Direction;
using pipeline::MessageHeader;
using pipeline::Op;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

bool has_parameters(const torch::nn::Module& m) {
  for (const auto& p : m.parameters())
    if (p.requires_grad()) return true;
  return false;
}

// One (stage, micro-batch) in flight on this rank.
struct Slot {
  at::Tensor input;        // the forward's input; a leaf that needs its gradient when it came
                           // from another stage
  at::Tensor output;       // the forward's result; on the last stage, the weighted loss
  at::Tensor grad_output;  // the gradient of `output`, from the next stage
  // Split backward (zb-h1): the outputs of the stage's modules that have parameters, their
  // indices in the stage, and their gradients once B ran; W takes each module's weights from them.
  std::vector<at::Tensor> module_outputs;
  std::vector<size_t> modules;
  std::vector<at::Tensor> module_grads;
};

}  // namespace

struct Pipeline::Impl {
  std::vector<torch::nn::Sequential> stages;  // this rank's, in model order
  std::shared_ptr<ProcessGroup> group;        // private sub-group of the pipeline's group
  std::shared_ptr<ProcessGroup> data_group;
  PipelineOptions options;
  pipeline::Schedule schedule;
  uint32_t schedule_id = 0;
  int rank = 0, p = 1, last = 0;
  int64_t steps = 0;
  PipelineStats stats;

  // One step's state.
  std::map<std::pair<int, int>, Slot> slots;              // (stage, micro-batch)
  std::map<std::pair<int, int>, at::Tensor> grads;        // input gradients not yet sent
  std::map<std::tuple<int, int, int>, at::Tensor> local;  // messages to this rank itself
  struct Send {
    std::unique_ptr<std::array<std::byte, pipeline::kHeaderBytes>> header;
    at::Tensor tensor;
    std::shared_ptr<Work> header_work, tensor_work;
  };
  std::vector<Send> sends;
  int held = 0;
  // Forward-only calls cut the batch into as many micro-batches as it has rows, up to the
  // schedule's: the count travels in the messages' headers.
  bool forward_only = false;
  int message_microbatches = 0;
  // Where the step is, for errors.
  size_t action_index = 0;
  const Action* action = nullptr;
  std::string phase = "setting up the step";

  torch::nn::Sequential& stage(int s) { return stages[static_cast<size_t>(s / p)]; }

  // `t` where stage `s` of this rank computes: its parameters' device (refuse_stages checked
  // they share one); a stage without parameters computes where its input is.
  at::Tensor to_stage(int s, const at::Tensor& t) {
    const auto params = stage(s)->parameters();
    return params.empty() ? t : t.to(params.front().device());
  }

  std::string where() const {
    std::string at = action != nullptr ? fmt::format("action {} of {} ({})", action_index,
                                                     schedule.name, pipeline::describe(*action))
                                       : phase;
    return fmt::format("rank {} of the pipeline (stage{} {}), step {}, {}", rank,
                       schedule.virtual_stages > 1 ? "s" : "",
                       fmt::join(schedule.stages_of(rank), ", "), steps, at);
  }

  [[noreturn]] void fail(ErrorKind kind, const std::string& what) {
    const std::string text = fmt::format("{}: {}", where(), what);
    // Every other rank of the pipeline fails at once with this text instead of waiting for a
    // message this rank will not send, and so do the stage's replicas, which would wait in the
    // gradient all-reduce.
    group->abort(text);
    if (data_group && data_group->size() > 1) data_group->abort(text);
    throw_error(kind, text);
  }

  void send(Direction d, int stage_from, int mb, const at::Tensor& t) {
    const int to = d == Direction::kActivation ? stage_from + 1 : stage_from - 1;
    const int peer = schedule.rank_of(to);
    if (peer == rank) {
      local[{static_cast<int>(d), stage_from, mb}] = t.detach();
      return;
    }
    // The messages go through host memory: a GPU's tensor is copied there first (the copy
    // waits for the stage's work on the current stream).
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    MessageHeader h;
    h.direction = d;
    h.stage = stage_from;
    h.microbatch = mb;
    h.step = steps;
    h.microbatches = message_microbatches;
    h.schedule_id = schedule_id;
    h.dtype = to_dtype(c.scalar_type());
    h.shape = c.sizes().vec();
    Send s;
    s.header = std::make_unique<std::array<std::byte, pipeline::kHeaderBytes>>(pipeline::encode(h));
    s.tensor = c;
    const int tag = pipeline::message_tag(d, stage_from, mb, schedule.stages());
    const SendOptions o{options.timeout};
    s.header_work = group->isend(TensorView::raw(s.header->data(), s.header->size()), peer, tag, o);
    if (c.numel() > 0)
      s.tensor_work = group->isend(TensorView::raw(c.data_ptr(), c.nbytes()), peer, tag, o);
    stats.bytes_sent += pipeline::kHeaderBytes + c.nbytes();
    sends.push_back(std::move(s));
  }

  at::Tensor recv(Direction d, int stage_to, int mb, MessageHeader* header = nullptr) {
    const int from = d == Direction::kActivation ? stage_to - 1 : stage_to + 1;
    const int peer = schedule.rank_of(from);
    if (peer == rank) {
      auto it = local.find({static_cast<int>(d), from, mb});
      if (it == local.end())
        throw InternalError(
            "the message to this rank itself was not sent (the verifier passed it)");
      at::Tensor t = to_stage(stage_to, it->second);
      local.erase(it);
      return t;
    }
    const auto started = Clock::now();
    std::array<std::byte, pipeline::kHeaderBytes> bytes{};
    const int tag = pipeline::message_tag(d, from, mb, schedule.stages());
    const RecvOptions o{options.timeout};
    group->irecv(TensorView::raw(bytes.data(), bytes.size()), peer, tag, o)->wait();
    MessageHeader h = pipeline::decode(bytes);
    const char* kind = d == Direction::kActivation ? "activation" : "gradient";
    if (h.schedule_id != schedule_id || (!forward_only && h.microbatches != schedule.microbatches))
      throw InvalidArgumentError(fmt::format(
          "rank {} runs another schedule or micro-batch count ({} micro-batches, schedule id "
          "0x{:08x}) than this rank ({} of {}, {} micro-batches, id 0x{:08x}): give every rank "
          "the same PipelineOptions",
          peer, h.microbatches, h.schedule_id, schedule.name,
          schedule.virtual_stages > 1 ? fmt::format("{} stages per rank", schedule.virtual_stages)
                                      : std::string("one stage per rank"),
          schedule.microbatches, schedule_id));
    if (h.direction != d || h.stage != from || h.microbatch != mb || h.step != steps)
      throw InvalidArgumentError(fmt::format(
          "expected the {} of micro-batch {} from stage {} (rank {}) for step {}, got the {}", kind,
          mb, from, peer, steps, pipeline::describe(h)));
    at::Tensor t = at::empty(h.shape, at::TensorOptions().dtype(to_scalar_type(h.dtype)));
    if (t.numel() > 0)
      group->irecv(TensorView::raw(t.data_ptr(), t.nbytes()), peer, tag, o)->wait();
    stats.wait_ms += ms_since(started);
    if (header != nullptr) *header = h;
    return to_stage(stage_to, t);
  }

  static at::ScalarType to_scalar_type(DType d) {
    switch (d) {
      case DType::kF32:
        return at::kFloat;
      case DType::kF64:
        return at::kDouble;
      case DType::kF16:
        return at::kHalf;
      case DType::kBF16:
        return at::kBFloat16;
      case DType::kI8:
        return at::kChar;
      case DType::kU8:
        return at::kByte;
      case DType::kI16:
        return at::kShort;
      case DType::kI32:
        return at::kInt;
      case DType::kI64:
        return at::kLong;
    }
    return at::kFloat;
  }

  // Frees what completed sends held (an activation or gradient is needed no longer than its
  // send): otherwise every boundary tensor of the step would live until its end.
  void release_sent() {
    for (auto it = sends.begin(); it != sends.end();) {
      if (!it->header_work->is_completed() ||
          (it->tensor_work && !it->tensor_work->is_completed())) {
        ++it;
        continue;
      }
      it->header_work->wait();  // a finished send's wait returns at once, or throws its error now
      if (it->tensor_work) it->tensor_work->wait();
      it = sends.erase(it);
    }
  }

  void wait_sends() {
    for (auto& s : sends) {
      s.header_work->wait();
      if (s.tensor_work) s.tensor_work->wait();
    }
    sends.clear();
  }

  void begin_step() {
    slots.clear();
    grads.clear();
    local.clear();
    sends.clear();
    held = 0;
    forward_only = false;
    message_microbatches = schedule.microbatches;
    action = nullptr;
    stats = PipelineStats{};
    stats.step = steps;
  }

  void forward_pass(int s, int mb, const at::Tensor& in, bool split) {
    Slot& slot = slots[{s, mb}];
    slot.input = in;
    auto& seq = stage(s);
    at::Tensor h = in;
    if (split) {
      size_t k = 0;
      for (auto& module : *seq) {
        h = module.forward(h);
        if (has_parameters(*module.ptr()) && h.requires_grad()) {
          slot.module_outputs.push_back(h);
          slot.modules.push_back(k);
        }
        ++k;
      }
    } else {
      h = seq->forward(h);
    }
    slot.output = h;
    if (++held > stats.peak_microbatches) stats.peak_microbatches = held;
  }

  void backward_input(Slot& slot, int s, int mb) {
    const at::Tensor root_grad = s == last ? torch::ones_like(slot.output) : slot.grad_output;
    std::vector<at::Tensor> wrt;
    const bool want_input = s > 0 && slot.input.requires_grad();
    if (want_input) wrt.push_back(slot.input);
    slot.module_grads.assign(slot.module_outputs.size(), at::Tensor());
    std::vector<size_t> asked;
    for (size_t i = 0; i < slot.module_outputs.size(); ++i) {
      if (slot.module_outputs[i].is_same(slot.output)) {
        slot.module_grads[i] = root_grad;  // the stage's output: its gradient came with it
      } else {
        wrt.push_back(slot.module_outputs[i]);
        asked.push_back(i);
      }
    }
    if (wrt.empty()) return;
    auto g = torch::autograd::grad({slot.output}, wrt, {root_grad}, /*retain_graph=*/true,
                                   /*create_graph=*/false, /*allow_unused=*/true);
    size_t j = 0;
    if (want_input) grads[{s, mb}] = g[j++];
    for (size_t i : asked) slot.module_grads[i] = g[j++];
  }

  void backward_weight(Slot& slot, int s) {
    auto& seq = stage(s);
    for (size_t i = 0; i < slot.module_outputs.size(); ++i) {
      if (!slot.module_grads[i].defined()) continue;
      std::vector<at::Tensor> params;
      for (const auto& p : seq[slot.modules[i]]->parameters())
        if (p.requires_grad()) params.push_back(p);
      torch::autograd::backward({slot.module_outputs[i]}, {slot.module_grads[i]},
                                /*retain_graph=*/true, /*create_graph=*/false, params);
    }
  }

  void average_over_replicas() {
    if (!data_group || data_group->size() == 1) return;
    phase = "averaging gradients over the data-parallel group";
    action = nullptr;
    std::vector<at::Tensor> flats;
    std::vector<std::vector<at::Tensor>> owners;
    std::vector<std::shared_ptr<Work>> works;
    for (auto& seq : stages) {
      std::vector<at::Tensor> gs;
      for (auto& p : seq->parameters()) {
        if (!p.requires_grad()) continue;
        if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
        gs.push_back(p.grad());
      }
      if (gs.empty()) continue;
      std::vector<at::Tensor> views;
      for (auto& g : gs) views.push_back(g.reshape({-1}));
      at::Tensor flat = torch::cat(views);
      AllreduceOptions o;
      o.timeout = options.timeout;
      works.push_back(data_group->allreduce(view_of(flat), o));
      flats.push_back(flat);
      owners.push_back(std::move(gs));
    }
    for (auto& w : works) w->wait();
    const double n = data_group->size();
    for (size_t i = 0; i < flats.size(); ++i) {
      flats[i].div_(n);
      int64_t offset = 0;
      for (auto& g : owners[i]) {
        g.copy_(flats[i].slice(0, offset, offset + g.numel()).view_as(g));
        offset += g.numel();
      }
    }
  }

  at::Tensor run_step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss_fn) {
    begin_step();
    const auto started = Clock::now();
    const int m = schedule.microbatches;
    const bool split = schedule.split_backward();
    std::vector<at::Tensor> xs, ys;
    std::vector<double> weight;
    auto cut = [&](const at::Tensor& t, const char* what) {
      if (!t.defined())
        throw InvalidArgumentError(
            fmt::format("the {} is undefined; this rank holds stage {}, "
                        "which needs it",
                        what, what[0] == 'i' ? 0 : last));
      if (t.dim() == 0 || t.size(0) < m)
        throw InvalidArgumentError(fmt::format(
            "the {} has {} rows: it cannot make {} micro-batches; give at least {} rows or fewer "
            "micro-batches",
            what, t.dim() == 0 ? 0 : t.size(0), m, m));
      return t.tensor_split(m, 0);
    };
    if (holds_stage(0)) xs = cut(input, "input");
    if (holds_stage(last)) {
      ys = cut(target, "target");
      for (const auto& y : ys) weight.push_back(double(y.size(0)) / double(target.size(0)));
    }
    at::Tensor loss_sum;
    const auto& list = schedule.actions[rank];
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      action_index = i;
      action = &a;
      const auto t0 = Clock::now();
      switch (a.op) {
        case Op::kRecvActivation: {
          at::Tensor t = recv(Direction::kActivation, a.stage, a.microbatch);
          if (!t.is_floating_point())
            throw InvalidArgumentError(fmt::format(
                "stage {} sent an activation of dtype {}: activations between stages must be "
                "floating point, for their gradients",
                a.stage - 1, c10::toString(t.scalar_type())));
          slots[{a.stage, a.microbatch}].input = t.requires_grad_(true);
          continue;
        }
        case Op::kRecvGradient:
          slots[{a.stage, a.microbatch}].grad_output =
              recv(Direction::kGradient, a.stage, a.microbatch);
          continue;
        case Op::kSendActivation:
          send(Direction::kActivation, a.stage, a.microbatch,
               slots.at({a.stage, a.microbatch}).output);
          continue;
        case Op::kSendGradient: {
          auto it = grads.find({a.stage, a.microbatch});
          if (it == grads.end() || !it->second.defined())
            throw InvalidArgumentError(fmt::format(
                "stage {}'s input has no gradient (does its output depend on its input?)",
                a.stage));
          send(Direction::kGradient, a.stage, a.microbatch, it->second);
          grads.erase(it);
          continue;
        }
        case Op::kForward: {
          at::Tensor in =
              a.stage == 0 ? to_stage(0, xs[a.microbatch]) : slots[{a.stage, a.microbatch}].input;
          forward_pass(a.stage, a.microbatch, in, split);
          if (a.stage == last) {
            Slot& slot = slots[{a.stage, a.microbatch}];
            at::Tensor l = loss_fn(slot.output, ys[a.microbatch].to(slot.output.device()));
            if (l.numel() != 1)
              throw InvalidArgumentError(fmt::format(
                  "the loss function returned a tensor of shape [{}]; return the mean over the "
                  "micro-batch (a scalar)",
                  fmt::join(l.sizes(), ", ")));
            slot.output = l.reshape({}) * weight[a.microbatch];
            loss_sum = loss_sum.defined() ? loss_sum + slot.output.detach() : slot.output.detach();
          }
          break;
        }
        case Op::kBackward: {
          Slot& slot = slots.at({a.stage, a.microbatch});
          if (!slot.output.requires_grad()) {
            // Nothing before the output needs a gradient (a stage without parameters that got
            // the model's input): no backward to run.
          } else if (a.stage == last) {
            torch::autograd::backward({slot.output});
          } else {
            torch::autograd::backward({slot.output}, {slot.grad_output});
          }
          if (a.stage > 0) grads[{a.stage, a.microbatch}] = slot.input.grad();
          slots.erase({a.stage, a.microbatch});
          --held;
          break;
        }
        case Op::kBackwardInput:
          backward_input(slots.at({a.stage, a.microbatch}), a.stage, a.microbatch);
          break;
        case Op::kBackwardWeight:
          backward_weight(slots.at({a.stage, a.microbatch}), a.stage);
          slots.erase({a.stage, a.microbatch});
          --held;
          break;
      }
      stats.compute_ms += ms_since(t0);
      release_sent();
    }
    action = nullptr;
    phase = "waiting for this step's sends";
    wait_sends();
    average_over_replicas();
    stats.step_ms = ms_since(started);
    ++steps;
    return loss_sum;
  }

  at::Tensor run_forward(const at::Tensor& input) {
    begin_step();
    forward_only = true;
    const auto started = Clock::now();
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> xs, outputs;
    int count =
        -1;  // micro-batches: known on stage 0's rank, learnt from the first message elsewhere
    if (holds_stage(0)) {
      if (!input.defined() || input.dim() == 0 || input.size(0) < 1)
        throw InvalidArgumentError("the input is undefined or empty; this rank holds stage 0");
      xs = input.tensor_split(std::min<int64_t>(schedule.microbatches, input.size(0)), 0);
      count = static_cast<int>(xs.size());
      message_microbatches = count;
    }
    // Micro-batch by micro-batch, this rank's stages in model order: each receive depends on an
    // earlier (micro-batch, stage) only, so no two ranks wait for each other.
    for (int mb = 0; count < 0 || mb < count; ++mb) {
      for (int s : schedule.stages_of(rank)) {
        phase = fmt::format("the forward of micro-batch {} of stage {} (forward only)", mb, s);
        at::Tensor in;
        if (s == 0) {
          in = to_stage(0, xs[mb]);
        } else {
          MessageHeader h;
          in = recv(Direction::kActivation, s, mb, &h);
          if (count < 0) count = message_microbatches = h.microbatches;
        }
        const auto t0 = Clock::now();
        at::Tensor out = stage(s)->forward(in);
        stats.compute_ms += ms_since(t0);
        if (s < last)
          send(Direction::kActivation, s, mb, out);
        else
          outputs.push_back(out);
      }
    }
    phase = "waiting for the forward's sends";
    wait_sends();
    stats.step_ms = ms_since(started);
    ++steps;
    return outputs.empty() ? at::Tensor() : torch::cat(outputs);
  }

  bool holds_stage(int s) const { return schedule.rank_of(s) == rank; }
};

namespace {

// What this rank's stages cannot do, or "" when they are fine.
std::string refuse_stages(const std::vector<torch::nn::Sequential>& stages,
                          const pipeline::Schedule& schedule, int rank) {
  const auto ids = schedule.stages_of(rank);
  if (stages.size() != ids.size())
    return fmt::format(
        "rank {} was given {} stage modules for {} virtual stage(s) per rank; give "
        "one Sequential per stage this rank holds ({})",
        rank, stages.size(), schedule.virtual_stages, fmt::join(ids, ", "));
  for (size_t i = 0; i < stages.size(); ++i) {
    if (stages[i].is_empty() || stages[i]->size() == 0)
      return fmt::format("stage {} of rank {} is empty", ids[i], rank);
    const auto params = stages[i]->parameters();
    for (const auto& p : params)
      if (p.device() != params.front().device())
        return fmt::format(
            "stage {} has parameters on {} and on {}: a stage computes on one device (move it "
            "with .to(device))",
            ids[i], params.front().device().str(), p.device().str());
    if (!schedule.split_backward()) continue;
    // A split backward takes each module's weight gradient from that module's output alone; a
    // parameter two modules share would get the other module's part twice.
    std::map<const void*, size_t> owner;
    size_t k = 0;
    for (const auto& module : stages[i]->children()) {
      for (const auto& p : module->parameters()) {
        auto [it, fresh] = owner.emplace(p.unsafeGetTensorImpl(), k);
        if (!fresh && it->second != k)
          return fmt::format(
              "stage {} shares a parameter between its modules {} and {}: {} "
              "splits the backward by module and would count its gradient twice; "
              "use a schedule without the split (1f1b)",
              ids[i], it->second, k, schedule.name);
      }
      ++k;
    }
  }
  return "";
}

}  // namespace

Pipeline::Pipeline(std::vector<torch::nn::Sequential> stages, std::shared_ptr<ProcessGroup> group,
                   PipelineOptions options, std::shared_ptr<ProcessGroup> data_group)
    : impl_(std::make_unique<Impl>()) {
  if (!group) throw InvalidArgumentError("Pipeline: the pipeline group is null");
  Impl& d = *impl_;
  d.rank = group->rank();
  d.p = group->size();
  d.options = options;
  d.data_group = std::move(data_group);
  std::vector<int> all(d.p);
  std::iota(all.begin(), all.end(), 0);
  d.group = group->new_group(all);
  // Whatever this rank cannot accept is said on every rank: the others would otherwise wait for
  // it until their timeout. Then every rank must run the same schedule.
  std::string refusal;
  try {
    d.schedule = pipeline::make_schedule({.name = options.schedule,
                                          .ranks = d.p,
                                          .microbatches = options.microbatches,
                                          .virtual_stages = options.virtual_stages});
    pipeline::check(d.schedule);
    d.schedule_id = pipeline::schedule_id(d.schedule.name, d.p, d.schedule.virtual_stages);
    d.last = d.schedule.stages() - 1;
    refusal = refuse_stages(stages, d.schedule, d.rank);
  } catch (const Error& e) {
    refusal = e.what();
  }
  std::array<int64_t, 4> mine{refusal.empty() ? 1 : 0, d.schedule_id, options.microbatches,
                              options.virtual_stages};
  std::vector<int64_t> every(mine.size() * static_cast<size_t>(d.p));
  AllgatherOptions ao;
  ao.timeout = options.timeout;
  d.group->allgather(TensorView::of(every), TensorView::of(std::span<int64_t>(mine)), ao)->wait();
  if (!refusal.empty()) throw InvalidArgumentError(fmt::format("Pipeline: {}", refusal));
  for (int r = 0; r < d.p; ++r) {
    const int64_t* theirs = every.data() + mine.size() * r;
    if (theirs[0] == 0)
      throw InvalidArgumentError(fmt::format(
          "Pipeline: rank {} of the pipeline refused its stages or options (its error says why)",
          r));
    if (std::equal(mine.begin(), mine.end(), theirs)) continue;
    throw InvalidArgumentError(fmt::format(
        "Pipeline: rank {} of the pipeline runs {} micro-batches, {} virtual stage(s) and schedule "
        "id 0x{:08x}; rank {} (this one) runs {} micro-batches of {} with {} virtual stage(s) (id "
        "0x{:08x}): give every rank the same PipelineOptions",
        r, theirs[2], theirs[3], static_cast<uint32_t>(theirs[1]), d.rank, options.microbatches,
        options.schedule, options.virtual_stages, d.schedule_id));
  }
  d.stages = std::move(stages);
}

Pipeline::~Pipeline() = default;

at::Tensor Pipeline::step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss) {
  Impl& d = *impl_;
  try {
    return d.run_step(input, target, loss);
  } catch (const Error& e) {
    d.fail(e.kind(), e.what());
  } catch (const c10::Error& e) {
    d.fail(ErrorKind::kInvalidArgument, fmt::format("LibTorch: {}", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    d.fail(ErrorKind::kInvalidArgument, e.what());
  }
}

at::Tensor Pipeline::forward(const at::Tensor& input) {
  Impl& d = *impl_;
  try {
    return d.run_forward(input);
  } catch (const Error& e) {
    d.fail(e.kind(), e.what());
  } catch (const c10::Error& e) {
    d.fail(ErrorKind::kInvalidArgument, fmt::format("LibTorch: {}", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    d.fail(ErrorKind::kInvalidArgument, e.what());
  }
}

const pipeline::Schedule& Pipeline::schedule() const { return impl_->schedule; }

std::vector<at::Tensor> Pipeline::parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& s : impl_->stages)
    for (const auto& p : s->parameters()) out.push_back(p);
  return out;
}

bool Pipeline::holds_first_stage() const { return impl_->holds_stage(0); }
bool Pipeline::holds_last_stage() const { return impl_->holds_stage(impl_->last); }
PipelineStats Pipeline::stats() const { return impl_->stats; }

// Cutting a Sequential.

torch::nn::Sequential slice(const torch::nn::Sequential& model, size_t begin, size_t end) {
  const auto children = model->named_children();
  if (begin >= end || end > model->size())
    throw InvalidArgumentError(
        fmt::format("slice: modules [{}, {}) of a Sequential of {}: give 0 <= begin < end <= {}",
                    begin, end, model->size(), model->size()));
  torch::nn::Sequential out;
  for (size_t i = begin; i < end; ++i) out->push_back(children[i].key(), model->begin()[i]);
  return out;
}

std::vector<size_t> balance_by_parameters(const torch::nn::Sequential& model, int parts) {
  std::vector<double> costs;
  for (const auto& m : model->children()) {
    double n = 0;
    for (const auto& p : m->parameters()) n += static_cast<double>(p.numel());
    costs.push_back(n);
  }
  return balance(costs, parts);
}

std::vector<size_t> balance_by_time(const torch::nn::Sequential& model, int parts,
                                    const at::Tensor& sample, int repeats, ProcessGroup* group) {
  std::vector<double> costs;
  at::Tensor h = sample;
  for (auto module : *model) {  // AnyModule copies share the module
    std::vector<double> runs;
    at::Tensor out;
    for (int r = 0; r < std::max(1, repeats); ++r) {
      at::Tensor in = h.is_floating_point() ? h.detach().requires_grad_(true) : h;
      const auto t0 = Clock::now();
      out = module.forward(in);
      if (out.requires_grad()) out.sum().backward();
      runs.push_back(ms_since(t0));
    }
    std::nth_element(runs.begin(), runs.begin() + runs.size() / 2, runs.end());
    costs.push_back(runs[runs.size() / 2]);
    h = out.detach();
  }
  model.ptr()->zero_grad();
  if (group != nullptr && group->size() > 1) {
    AllreduceOptions o;
    o.async_op = false;
    group->allreduce(TensorView::of(costs), o)->wait();
    for (double& c : costs) c /= group->size();
  }
  return balance(costs, parts);
}

}  // namespace dtrain
