// ShardedDataParallel: flat units, their gathers and releases, and the reduce-scatter of their
// gradients from autograd hooks.
//
// How a unit's parameters come and go: every parameter of a unit is a view of one flat buffer
// (one StorageImpl). Releasing swaps that storage's memory for nothing and points each parameter
// at an empty tensor; gathering gives the same storage new memory and points the parameters back.
// Autograd's saved tensors (the parameter itself, or views such as weight.t()) share that
// storage, so backward reads the re-gathered values; PyTorch's FSDP frees its flat parameters
// the same way (storage.resize_(0)). The parameters' gradient accumulators are held from
// construction, while the parameters have their real shapes, so the shapes autograd checks
// gradients against stay right while a parameter is empty.
//
// Policies: what a unit shards beyond its optimizer state (its gradient, its parameters) is the
// UnitPolicy it carries (unit_policy.h), read from the stage once at construction; the code asks
// the policy, never the stage.
//
// Order: gathers and reductions are collectives, so every rank issues them in one order: units
// gather in forward order (the next one prefetched) and in reverse during backward, and reduce
// strictly from the last unit to the first, whatever order the gradient hooks fire in.
#include "dtrain/torch/sharded_data_parallel.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include "dtrain/error.h"
#include "dtrain/timeline.h"
#include "dtrain/torch/broadcast.h"
#include "dtrain/torch/tensor_view.h"
#include "torch/autograd_node.h"
#include "torch/unit_policy.h"

namespace dtrain {

struct ShardedDataParallel::Unit {
  size_t first_child = 0, end_child = 0;  // Sequential children [first, end)
  UnitPolicy policy;                      // what the stage shards of this unit
  std::vector<std::string> names;
  std::vector<at::Tensor> params;  // the module's parameters (autograd leaves)
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> offsets, numels;
  int64_t numel = 0, padded = 0, shard_numel = 0;
  std::vector<AutogradNodePtr> accumulators;  // keep the hooks and shapes
  std::vector<uintptr_t> hook_keys;

  at::Tensor full;       // padded flat parameters; its storage is released when resharded
  bool whole = false;    // full has memory and the parameters point into it
  bool current = false;  // full holds the shards' latest values
  std::shared_ptr<Work> gather_work;
  at::Tensor gather_in, gather_out;  // 16-bit copies while a gather is in flight

  at::Tensor shard;      // this rank's fp32 master elements: what the optimizer steps
  at::Tensor grad_full;  // padded flat gradients; the parameters' .grad are views of it
  std::shared_ptr<Work> reduce_work;
  at::Tensor reduce_in, reduce_out;

  std::vector<uint8_t> ready;  // this backward: parameter got its gradient
  size_t ready_count = 0;
  bool complete = false;  // this backward: every parameter has its gradient

  // fp32 on the parameters' device (the model's: agree_on_model refuses several): the flat
  // buffers the unit makes live there.
  at::TensorOptions flat_options() const {
    return at::TensorOptions()
        .dtype(at::kFloat)
        .device(params.empty() ? at::Device(at::kCPU) : params.front().device());
  }

  // Places a parameter after the ones before it in the flat buffer (not yet padded).
  void append(const std::string& name, const at::Tensor& p) {
    names.push_back(name);
    params.push_back(p);
    shapes.push_back(p.sizes().vec());
    offsets.push_back(numel);
    numels.push_back(p.numel());
    numel += p.numel();
  }
};

// The modules of one unit, before their parameters are laid out.
struct ShardedDataParallel::UnitModules {
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
  size_t first_child = 0, end_child = 0;  // Sequential children [first, end)
};

namespace {

// Whole gradients waiting for their reduce-scatter at once: one overlaps the backward of the
// unit before it, and bounds what stages 2 and 3 hold (each more would hold another unit).
constexpr size_t kReductionsInFlight = 1;

c10::StorageImpl& storage_of(const at::Tensor& t) { return *t.storage().unsafeGetStorageImpl(); }

void free_memory(const at::Tensor& flat) {
  auto& s = storage_of(flat);
  s.set_data_ptr_noswap(at::DataPtr(nullptr, flat.device()));
  s.set_nbytes(0);
}

// From the allocator of the tensor's device (a GPU's caching allocator allocates on the current
// device, hence the guard).
void give_memory(const at::Tensor& flat) {
  auto& s = storage_of(flat);
  const size_t bytes = static_cast<size_t>(flat.numel()) * flat.element_size();
  const c10::DeviceGuard on(flat.device());
  s.set_data_ptr_noswap(c10::GetAllocator(flat.device().type())->allocate(bytes));
  s.set_nbytes(bytes);
}

std::string describe_dtype(at::ScalarType t) { return c10::toString(t); }

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t count = 0;
  for (const auto& p : module.parameters()) count += p.numel();
  return count;
}

std::unordered_map<const c10::TensorImpl*, std::string> parameter_names(
    const torch::nn::Module& module) {
  std::unordered_map<const c10::TensorImpl*, std::string> name_of;
  for (const auto& p : module.named_parameters(true))
    name_of[p.value().unsafeGetTensorImpl()] = p.key();
  return name_of;
}

// Each refusal overwrites the one before it: the last reason found is the one reported.
std::string refusal_of_options(const ShardingOptions& options) {
  std::string refusal;
  if (options.stage < 1 || options.stage > 3)
    refusal = fmt::format("stage {} is not 1, 2 or 3", options.stage);
  if (options.communication_dtype != at::kFloat && options.communication_dtype != at::kBFloat16 &&
      options.communication_dtype != at::kHalf)
    refusal = fmt::format("communication_dtype {} is not float, bfloat16 or half",
                          describe_dtype(options.communication_dtype));
  return refusal;
}

std::string refusal_of_parameter(const at::Tensor& p, const std::string& name) {
  std::string refusal;
  if (p.scalar_type() != at::kFloat)
    refusal = fmt::format(
        "parameter '{}' is {}; ShardedDataParallel keeps fp32 parameters "
        "(communication_dtype sets what goes on the wire)",
        name, describe_dtype(p.scalar_type()));
  if (!p.requires_grad())
    refusal = fmt::format(
        "parameter '{}' does not require grad; frozen parameters are not "
        "sharded: keep them out of the model given to "
        "ShardedDataParallel",
        name);
  return refusal;
}

// Buffers are not sharded, but every rank must have the same ones (rank 0's are broadcast).
std::string describe_buffers(const torch::nn::Module& module) {
  std::string description;
  for (const auto& b : module.named_buffers(true))
    description += fmt::format("{}:{};", b.key(), b.value().sizes().vec());
  return description;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction

ShardedDataParallel::ShardedDataParallel(torch::nn::Sequential model,
                                         std::shared_ptr<ProcessGroup> group,
                                         ShardingOptions options)
    : ShardedDataParallel(model.ptr(), {}, std::move(group), std::move(options)) {}

ShardedDataParallel::ShardedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                         std::shared_ptr<ProcessGroup> group,
                                         ShardingOptions options)
    : ShardedDataParallel(module, {{module}}, std::move(group), std::move(options)) {}

ShardedDataParallel::ShardedDataParallel(
    std::shared_ptr<torch::nn::Module> module,
    std::vector<std::vector<std::shared_ptr<torch::nn::Module>>> given_units,
    std::shared_ptr<ProcessGroup> group, ShardingOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(std::move(options)) {
  if (module_ == nullptr || group_ == nullptr)
    throw InvalidArgumentError("ShardedDataParallel: module and process group must be set");
  Timeline::get(group_->rank());
  // Everything a rank could refuse is decided locally, then agreed on, so that either every
  // rank constructs or every rank throws the same reasons.
  std::string refusal = refusal_of_options(options_);
  std::string description = lay_out_units(find_units(std::move(given_units)), refusal);
  description += describe_buffers(*module_);
  agree_on_model(description, refusal);
  broadcast_parameters(*module_, *group_, 0, options_.timeout);
  // One unit at a time, so that at stage 3 each unit is released before the next is flattened.
  for (size_t u = 0; u < units_.size(); ++u) shard_unit(u);
}

// Children of a Sequential (each child with parameters starts a unit, children without join the
// one before), or the units given.
std::vector<ShardedDataParallel::UnitModules> ShardedDataParallel::find_units(
    std::vector<std::vector<std::shared_ptr<torch::nn::Module>>> given_units) {
  std::vector<UnitModules> units;
  if (!given_units.empty()) {
    for (auto& modules : given_units) units.push_back({std::move(modules)});
    return units;
  }
  sequential_ = true;
  const auto children = module_->children();
  for (size_t i = 0; i < children.size(); ++i) {
    int64_t open = 0;  // parameters of the unit being filled
    if (!units.empty())
      for (const auto& m : units.back().modules) open += parameter_count(*m);
    const bool starts = units.empty() || (parameter_count(*children[i]) > 0 && open > 0 &&
                                          open >= options_.min_unit_parameters);
    if (starts) units.push_back({{}, i, i});
    units.back().modules.push_back(children[i]);
    units.back().end_child = i + 1;
  }
  return units;
}

// Makes units_ from the modules: each unit's parameters in registration order, padded to a
// multiple of N. Refuses (into `refusal`) what cannot be sharded; returns the names, shapes and
// units that ranks compare.
std::string ShardedDataParallel::lay_out_units(const std::vector<UnitModules>& unit_modules,
                                               std::string& refusal) {
  const UnitPolicy policy = unit_policy(options_);
  const int n = group_->size();
  const auto name_of = parameter_names(*module_);
  std::unordered_set<const c10::TensorImpl*> seen;
  std::string description;
  std::optional<at::Device> device;  // the first parameter's
  for (size_t u = 0; u < unit_modules.size(); ++u) {
    auto unit = std::make_unique<Unit>();
    unit->first_child = unit_modules[u].first_child;
    unit->end_child = unit_modules[u].end_child;
    unit->policy = policy;
    for (const auto& m : unit_modules[u].modules)
      for (const auto& p : m->parameters(true)) {
        const auto named = name_of.find(p.unsafeGetTensorImpl());
        const std::string name = named != name_of.end() ? named->second : std::string("<unnamed>");
        if (!seen.insert(p.unsafeGetTensorImpl()).second) {
          refusal = fmt::format(
              "parameter '{}' is used by two units (tied weights); put the "
              "modules that share it into one unit (min_unit_parameters) or "
              "wrap the model as one unit",
              name);
          continue;
        }
        if (std::string reason = refusal_of_parameter(p, name); !reason.empty()) refusal = reason;
        if (!device) device = p.device();
        if (p.device() != *device)
          refusal = fmt::format(
              "parameter '{}' is on {}, others on {}: ShardedDataParallel keeps a model on one "
              "device (move it with ->to(device))",
              name, p.device().str(), device->str());
        unit->append(name, p);
        description += fmt::format("{}:{}:{};", name, p.sizes().vec(), u);
      }
    unit->padded = (unit->numel + n - 1) / n * n;
    unit->shard_numel = unit->padded / n;
    units_.push_back(std::move(unit));
  }
  if (std::all_of(units_.begin(), units_.end(), [](const auto& u) { return u->params.empty(); }))
    refusal = "the model has no parameters";
  return description;
}

// Collective: a fingerprint of the model and whether this rank refuses, from every rank; throws
// on every rank if any rank refuses or has another model.
void ShardedDataParallel::agree_on_model(const std::string& description,
                                         const std::string& refusal) const {
  const int rank = group_->rank(), n = group_->size();
  std::vector<int64_t> mine = {static_cast<int64_t>(std::hash<std::string>{}(description)),
                               refusal.empty() ? 0 : 1};
  std::vector<int64_t> all(2 * static_cast<size_t>(n));
  AllgatherOptions ao;
  ao.timeout = options_.timeout;
  group_->allgather(TensorView::of(all), TensorView::of(mine), ao)->wait();
  std::vector<int> differ, refusing;
  for (int r = 0; r < n; ++r) {
    if (all[2 * r] != all[0]) differ.push_back(r);
    if (all[2 * r + 1] != 0) refusing.push_back(r);
  }
  if (!refusal.empty())
    throw InvalidArgumentError(fmt::format("rank {}: ShardedDataParallel: {}", rank, refusal));
  if (!refusing.empty())
    throw InvalidArgumentError(fmt::format(
        "rank {}: ShardedDataParallel: ranks [{}] refused the model (their errors say why)", rank,
        fmt::join(refusing, ", ")));
  if (!differ.empty())
    throw InvalidArgumentError(fmt::format(
        "rank {}: ShardedDataParallel: ranks [{}] have a model that differs from rank 0's "
        "(parameter names, shapes, buffers or units differ); every rank must build the same "
        "model with the same options",
        rank, fmt::join(differ, ", ")));
}

// Rank 0's parameters (already broadcast) into the unit's flat buffer, this rank's shard out of
// it, the hooks that reduce its gradients; then the unit as its policy keeps it between steps.
void ShardedDataParallel::shard_unit(size_t u) {
  c10::NoGradGuard no_grad;
  flatten_parameters(u);
  take_shard(u);
  register_gradient_hooks(u);
  const UnitPolicy& policy = units_[u]->policy;
  if (!policy.shard_gradients) ensure_gradients(u);  // the whole gradient lives between steps
  if (policy.reshard_parameters) release(u);
}

// Each parameter becomes a view of the unit's buffer, so that the buffer's storage can be
// released and given memory again under the parameters.
void ShardedDataParallel::flatten_parameters(size_t u) {
  Unit& unit = *units_[u];
  unit.full = at::zeros({unit.padded}, unit.flat_options());
  for (size_t i = 0; i < unit.params.size(); ++i) {
    at::Tensor view = unit.full.narrow(0, unit.offsets[i], unit.numels[i]).view(unit.shapes[i]);
    view.copy_(unit.params[i]);
    unit.params[i].set_data(view);
  }
  unit.whole = unit.current = true;
}

void ShardedDataParallel::take_shard(size_t u) {
  Unit& unit = *units_[u];
  unit.shard = unit.full.narrow(0, group_->rank() * unit.shard_numel, unit.shard_numel).clone();
  unit.shard.set_requires_grad(true);
}

// A hook on each parameter's gradient accumulator, held from now while the parameter has its
// real shape (see the top of this file).
void ShardedDataParallel::register_gradient_hooks(size_t u) {
  Unit& unit = *units_[u];
  unit.ready.assign(unit.params.size(), 0);
  for (size_t i = 0; i < unit.params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(unit.params[i]);
    auto key = acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, u, i](const torch::autograd::variable_list& outputs,
                     const torch::autograd::variable_list&) {
          on_gradient(u, i);
          return outputs;
        }));
    unit.accumulators.push_back(std::move(acc));
    unit.hook_keys.push_back(key);
  }
}

ShardedDataParallel::~ShardedDataParallel() {
  for (auto& unit : units_) {
    for (size_t i = 0; i < unit->accumulators.size(); ++i)
      unit->accumulators[i]->del_post_hook(unit->hook_keys[i]);
    // A collective still in flight writes into these buffers: let it finish (or fail) first.
    try {
      if (unit->gather_work) unit->gather_work->wait();
      if (unit->reduce_work) unit->reduce_work->wait();
    } catch (...) {
    }
  }
}

std::vector<ShardedUnit> ShardedDataParallel::units() const {
  std::vector<ShardedUnit> out;
  for (const auto& u : units_)
    out.push_back({u->names, u->shapes, u->offsets, u->numel, u->shard_numel});
  return out;
}

std::vector<at::Tensor> ShardedDataParallel::parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& u : units_) out.push_back(u->shard);
  return out;
}

std::string ShardedDataParallel::where(size_t unit) const {
  const Unit& u = *units_[unit];
  return fmt::format(
      "rank {}: ShardedDataParallel unit {} of {} ([{}])", group_->rank(), unit, units_.size(),
      u.names.size() <= 3 ? fmt::format("{}", fmt::join(u.names, ", "))
                          : fmt::format("{}, ... {} parameters", u.names[0], u.names.size()));
}

// ---------------------------------------------------------------------------------------------
// Gathering and releasing parameters

void ShardedDataParallel::start_gather(size_t u) {
  Unit& unit = *units_[u];
  if (unit.current || unit.gather_work) return;
  if (!unit.whole) give_memory(unit.full);
  AllgatherOptions o;
  o.timeout = options_.timeout;
  c10::NoGradGuard no_grad;
  if (options_.communication_dtype == at::kFloat) {
    unit.gather_work = group_->allgather(view_of(unit.full), view_of(unit.shard.detach()), o);
  } else {
    unit.gather_in = unit.shard.detach().to(options_.communication_dtype);
    unit.gather_out = at::empty({unit.padded}, unit.gather_in.options());
    unit.gather_work = group_->allgather(view_of(unit.gather_out), view_of(unit.gather_in), o);
  }
}

void ShardedDataParallel::finish_gather(size_t u) {
  Unit& unit = *units_[u];
  if (unit.current) return;
  start_gather(u);
  {
    TimelineSpan span("wait for parameters", "comm");
    unit.gather_work->wait();
  }
  unit.gather_work = nullptr;
  c10::NoGradGuard no_grad;
  if (unit.gather_out.defined()) {
    unit.full.copy_(unit.gather_out);
    unit.gather_out = unit.gather_in = at::Tensor();
  }
  if (!unit.whole)
    for (size_t i = 0; i < unit.params.size(); ++i)
      unit.params[i].set_data(
          unit.full.narrow(0, unit.offsets[i], unit.numels[i]).view(unit.shapes[i]));
  unit.whole = unit.current = true;
}

void ShardedDataParallel::release(size_t u) {
  Unit& unit = *units_[u];
  if (unit.gather_work) {  // the worker writes into the buffer: let it finish first
    unit.gather_work->wait();
    unit.gather_work = nullptr;
    unit.gather_out = unit.gather_in = at::Tensor();
  }
  if (storage_of(unit.full).nbytes() == 0) return;
  c10::NoGradGuard no_grad;
  for (auto& p : unit.params) p.set_data(at::empty({0}, p.options()));
  free_memory(unit.full);
  unit.whole = unit.current = false;
}

void ShardedDataParallel::gather_parameters() {
  for (size_t u = 0; u < units_.size(); ++u) start_gather(u);
  for (size_t u = 0; u < units_.size(); ++u) finish_gather(u);
}

void ShardedDataParallel::shards_changed() {
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u]->policy.reshard_parameters) release(u);
    units_[u]->current = false;
  }
}

std::map<std::string, at::Tensor> ShardedDataParallel::full_parameters() {
  std::map<std::string, at::Tensor> out;
  AllgatherOptions o;
  o.timeout = options_.timeout;
  c10::NoGradGuard no_grad;
  for (auto& unit : units_) {
    at::Tensor flat = at::empty({unit->padded}, unit->flat_options());
    group_->allgather(view_of(flat), view_of(unit->shard.detach()), o)->wait();
    for (size_t i = 0; i < unit->params.size(); ++i)
      out[unit->names[i]] =
          flat.narrow(0, unit->offsets[i], unit->numels[i]).view(unit->shapes[i]).clone();
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Forward

void ShardedDataParallel::begin_forward() {
  // A resharded unit may still be whole: the last unit of a forward that had no backward.
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u]->policy.reshard_parameters) release(u);
  if (armed_ && !backward_started_) armed_ = false;  // the last forward had no backward
  if (backward_started_) {
    // A backward that threw (a failed collective) never finished: start over cleanly.
    backward_started_ = finish_queued_ = armed_ = false;
    for (auto& unit : units_) {
      std::fill(unit->ready.begin(), unit->ready.end(), 0);
      unit->ready_count = 0;
      unit->complete = false;
    }
  }
  if (options_.broadcast_buffers && at::GradMode::is_enabled() && group_->size() > 1) {
    std::vector<at::Tensor> buffers;
    for (const auto& b : module_->buffers(true)) buffers.push_back(b);
    if (!buffers.empty()) {
      TimelineSpan span("broadcast buffers", "comm");
      broadcast_tensors(*group_, buffers, 0, options_.timeout);
    }
  }
}

void ShardedDataParallel::begin_module_forward() {
  if (units_.size() > 1)
    throw InvalidArgumentError(fmt::format(
        "rank {}: ShardedDataParallel: forward(fn) runs a model of one unit; this Sequential has "
        "{} units: call forward(input)",
        group_->rank(), units_.size()));
  begin_forward();
  gather_for_forward(0);
}

void ShardedDataParallel::gather_for_forward(size_t u) {
  start_gather(u);
  if (units_[u]->policy.prefetch && u + 1 < units_.size()) start_gather(u + 1);
  finish_gather(u);
}

void ShardedDataParallel::after_unit_forward(size_t u, const at::Tensor& output, bool last) {
  const bool grad = at::GradMode::is_enabled();
  if (grad && output.defined() && output.requires_grad())
    output.register_hook([this, u](const at::Tensor&) { before_unit_backward(u); });
  // The last unit's backward comes right after its forward: keep it rather than gather it again.
  if (units_[u]->policy.reshard_parameters && !(grad && last)) release(u);
}

at::Tensor ShardedDataParallel::forward(const at::Tensor& input) {
  if (!sequential_)
    throw InvalidArgumentError(fmt::format(
        "rank {}: ShardedDataParallel: forward(tensor) runs a Sequential; this model was given "
        "as one module: call forward([&] {{ return model->forward(x); }})",
        group_->rank()));
  begin_forward();
  auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(module_.get());
  at::Tensor x = input;
  for (size_t u = 0; u < units_.size(); ++u) {
    gather_for_forward(u);
    for (size_t c = units_[u]->first_child; c < units_[u]->end_child; ++c)
      x = seq->begin()[static_cast<std::ptrdiff_t>(c)].forward(x);
    after_unit_forward(u, x, u + 1 == units_.size());
  }
  armed_ = at::GradMode::is_enabled() && sync_;
  return x;
}

void ShardedDataParallel::end_forward(const at::Tensor& output) {
  after_unit_forward(0, output, true);
  armed_ = at::GradMode::is_enabled() && sync_;
}

void ShardedDataParallel::end_forward(const std::vector<at::Tensor>& outputs) {
  const bool grad = at::GradMode::is_enabled();
  for (const auto& out : outputs)
    if (grad && out.defined() && out.requires_grad())
      out.register_hook([this](const at::Tensor&) { before_unit_backward(0); });
  if (units_[0]->policy.reshard_parameters && !grad) release(0);
  armed_ = grad && sync_;
}

// ---------------------------------------------------------------------------------------------
// Backward

void ShardedDataParallel::queue_finish() {
  if (!backward_started_) {
    backward_started_ = true;
    next_to_reduce_ = static_cast<int64_t>(units_.size()) - 1;
  }
  if (finish_queued_) return;
  finish_queued_ = true;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
}

void ShardedDataParallel::ensure_gradients(size_t u) {
  Unit& unit = *units_[u];
  c10::NoGradGuard no_grad;
  if (!unit.grad_full.defined()) unit.grad_full = at::zeros({unit.padded}, unit.flat_options());
  for (size_t i = 0; i < unit.params.size(); ++i) {
    at::Tensor slot = unit.grad_full.narrow(0, unit.offsets[i], unit.numels[i]);
    at::Tensor& grad = unit.params[i].mutable_grad();
    if (grad.defined() && grad.data_ptr() == slot.data_ptr()) continue;
    // The user replaced or reset the gradient (model->zero_grad()): it is what counts now.
    if (grad.defined())
      slot.copy_(grad.reshape({-1}));
    else
      slot.zero_();
    grad = slot.view(unit.shapes[i]);
  }
}

void ShardedDataParallel::before_unit_backward(size_t u) {
  queue_finish();
  const UnitPolicy& policy = units_[u]->policy;
  if (policy.reshard_parameters) {
    start_gather(u);
    if (policy.prefetch && u > 0) start_gather(u - 1);
    finish_gather(u);
  }
  ensure_gradients(u);
}

void ShardedDataParallel::on_gradient(size_t u, size_t i) {
  queue_finish();
  Unit& unit = *units_[u];
  if (unit.ready[i] && armed_)
    throw InvalidArgumentError(fmt::format(
        "{}: parameter '{}' received a gradient twice in one backward (a second backward "
        "through the same forward); run one backward per forward, and use no_sync() to "
        "accumulate over several",
        where(u), unit.names[i]));
  ensure_gradients(u);  // adopts a gradient autograd put somewhere else
  if (!unit.ready[i]) {
    unit.ready[i] = 1;
    ++unit.ready_count;
  }
  if (unit.ready_count < unit.params.size()) return;
  unit.complete = true;
  if (unit.policy.reshard_parameters) release(u);  // its backward is done: gradients accumulated
  if (armed_) launch_ready_reductions();
}

void ShardedDataParallel::launch_ready_reductions() {
  while (next_to_reduce_ >= 0 && units_[static_cast<size_t>(next_to_reduce_)]->complete) {
    launch_reduction(static_cast<size_t>(next_to_reduce_));
    --next_to_reduce_;
  }
}

void ShardedDataParallel::launch_reduction(size_t u) {
  Unit& unit = *units_[u];
  // At most kReductionsInFlight whole gradients wait for the network at once: finish the oldest
  // (the highest unit) before adding one, and any that finished meanwhile.
  size_t in_flight = 0;
  for (size_t v = units_.size(); v-- > u + 1;) {
    if (!units_[v]->reduce_work) continue;
    if (units_[v]->reduce_work->is_completed())
      complete_reduction(v);
    else
      ++in_flight;
  }
  for (size_t v = units_.size(); v-- > u + 1 && in_flight >= kReductionsInFlight;)
    if (units_[v]->reduce_work) {
      complete_reduction(v);
      --in_flight;
    }
  ensure_gradients(u);  // a unit no gradient reached reduces zeros, as every rank must take part
  c10::NoGradGuard no_grad;
  ReduceScatterOptions o;
  o.op = ReduceOp::kAvg;
  o.timeout = options_.timeout;
  if (options_.communication_dtype == at::kFloat) {
    unit.reduce_in = unit.grad_full;
  } else {
    unit.reduce_in = unit.grad_full.to(options_.communication_dtype);
  }
  unit.reduce_out = at::empty({unit.shard_numel}, unit.reduce_in.options());
  unit.reduce_work = group_->reduce_scatter(view_of(unit.reduce_out), view_of(unit.reduce_in), o);
  if (unit.policy.shard_gradients) {  // the whole gradient is this rank's no more
    for (auto& p : unit.params) p.mutable_grad().reset();
    unit.grad_full = at::Tensor();
  }
}

void ShardedDataParallel::complete_reduction(size_t u) {
  Unit& unit = *units_[u];
  {
    TimelineSpan span("wait for gradients", "comm");
    unit.reduce_work->wait();
  }
  c10::NoGradGuard no_grad;
  at::Tensor reduced = unit.reduce_out.scalar_type() == at::kFloat ? unit.reduce_out
                                                                   : unit.reduce_out.to(at::kFloat);
  at::Tensor& grad = unit.shard.mutable_grad();
  if (grad.defined())
    grad.add_(reduced);
  else
    grad = reduced;
  unit.reduce_work = nullptr;
  unit.reduce_in = unit.reduce_out = at::Tensor();
  if (!unit.policy.shard_gradients) unit.grad_full.zero_();   // consumed; the views stay
  if (!unit.policy.reshard_parameters) unit.current = false;  // the step changes the shards
}

void ShardedDataParallel::finish_backward() {
  finish_queued_ = false;
  backward_started_ = false;
  const bool reduce = armed_;
  armed_ = false;
  if (reduce) {
    while (next_to_reduce_ >= 0) {
      launch_reduction(static_cast<size_t>(next_to_reduce_));
      --next_to_reduce_;
    }
    for (size_t u = units_.size(); u-- > 0;)
      if (units_[u]->reduce_work) complete_reduction(u);
  }
  for (size_t u = units_.size(); u-- > 0;) {
    Unit& unit = *units_[u];
    if (unit.policy.reshard_parameters) release(u);
    std::fill(unit.ready.begin(), unit.ready.end(), 0);
    unit.ready_count = 0;
    unit.complete = false;
  }
}

void ShardedDataParallel::reduce_gradients() {
  if (std::any_of(units_.begin(), units_.end(),
                  [](const auto& unit) { return unit->policy.reshard_parameters; }))
    throw InvalidArgumentError(fmt::format(
        "rank {}: ShardedDataParallel: reduce_gradients() serves runners that call the module "
        "themselves, which need its parameters whole: use stage 1 or 2 (stage 3 gathers them in "
        "its own forward)",
        group_->rank()));
  if (finish_queued_)
    throw InvalidArgumentError(fmt::format(
        "rank {}: ShardedDataParallel: reduce_gradients() called during a backward pass",
        group_->rank()));
  for (size_t u = units_.size(); u-- > 0;) launch_reduction(u);
  for (size_t u = units_.size(); u-- > 0;)
    if (units_[u]->reduce_work) complete_reduction(u);
}

// ---------------------------------------------------------------------------------------------
// Clipping

double ShardedDataParallel::clip_grad_norm(double max_norm) {
  c10::NoGradGuard no_grad;
  std::vector<double> squares = {0.0};
  for (const auto& unit : units_) {
    const at::Tensor& g = unit->shard.grad();
    if (g.defined()) squares[0] += g.to(at::kDouble).pow(2).sum().item<double>();
  }
  AllreduceOptions o;
  o.timeout = options_.timeout;
  group_->allreduce(TensorView::of(squares), o)->wait();
  const double norm = std::sqrt(squares[0]);
  const double coefficient = max_norm / (norm + 1e-6);  // torch::nn::utils::clip_grad_norm_'s
  if (coefficient < 1)
    for (auto& unit : units_)
      if (unit->shard.grad().defined()) unit->shard.mutable_grad().mul_(coefficient);
  return norm;
}

}  // namespace dtrain
