#include "dtrain/torch/parameter_server.h"

#include <fmt/format.h>
#include <torch/nn/module.h>

#include "dtrain/error.h"

namespace dtrain {

namespace {

TensorView view_of(const at::Tensor& t, const std::string& name) {
  if (t.scalar_type() != at::kFloat || !t.is_contiguous() || !t.device().is_cpu())
    throw InvalidArgumentError(
        fmt::format("parameter server: '{}' must be a contiguous f32 CPU tensor (it is {} on {})",
                    name, c10::toString(t.scalar_type()), t.device().str()));
  return TensorView{t.data_ptr(), static_cast<size_t>(t.numel()), DType::kF32};
}

}  // namespace

ParameterServerTrainer::ParameterServerTrainer(torch::nn::Module& module,
                                               std::shared_ptr<ps::Client> client,
                                               const ps::TableOptions& options)
    : client_(std::move(client)) {
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    Param param{p.key(), p.value(), at::zeros_like(p.value())};
    client_->create_dense(param.name, view_of(param.value, param.name), options);
    params_.push_back(std::move(param));
  }
  pull();
}

namespace {

// Waits for every handle (so that none still uses a tensor when this returns), then rethrows the
// first error.
void wait_all(std::vector<ps::Handle>& handles) {
  std::exception_ptr first;
  for (auto& h : handles) {
    try {
      h.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace

void ParameterServerTrainer::pull() {
  std::vector<ps::Handle> handles;
  for (auto& p : params_) handles.push_back(client_->pull(p.name, view_of(p.value, p.name)));
  wait_all(handles);
}

void ParameterServerTrainer::step() {
  std::vector<ps::Handle> handles;
  for (auto& p : params_) {
    // Every parameter is pushed every step, so that sync and SSP clocks advance together; a
    // parameter without a gradient pushes zeros.
    const at::Tensor& g = p.value.grad();
    const at::Tensor& grad = g.defined() ? g : p.grad_buffer;
    handles.push_back(
        client_->push_pull(p.name, view_of(grad, p.name + ".grad"), view_of(p.value, p.name)));
  }
  wait_all(handles);
}

}  // namespace dtrain
