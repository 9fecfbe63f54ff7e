// Training a LibTorch module through the parameter server (dtrain/ps.h): the servers hold the
// parameters and run the optimizer; each worker pushes its gradients and pulls the new values.
//
//   auto client = std::shared_ptr<dtrain::ps::Client>(dtrain::ps::Client::from_env());
//   dtrain::ps::TableOptions opt;                     // sync / async / SSP, server optimizer
//   opt.optimizer = {.kind = dtrain::ps::OptimizerOptions::Kind::kMomentum, .lr = 0.01f};
//   dtrain::ParameterServerTrainer ps(*model, client, opt);   // worker 0's weights everywhere
//   for (...) {
//     model->zero_grad();
//     loss.backward();
//     ps.step();   // push every gradient, pull every parameter (in parallel, all servers)
//   }
//
// Every parameter is a dense table under its PyTorch name; the tables spread over the servers
// (placement.h). Buffers (batch-norm statistics) stay local to each worker.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dtrain/ps.h"

namespace torch::nn {
class Module;
}

namespace dtrain {

class ParameterServerTrainer {
 public:
  // Creates one table per parameter (the first worker's values win; tables a restarted server
  // restored are attached to), then pulls the servers' values into the module.
  ParameterServerTrainer(torch::nn::Module& module, std::shared_ptr<ps::Client> client,
                         const ps::TableOptions& options);

  // Pushes the gradient of every parameter that has one and pulls every parameter's new value.
  void step();
  // Pulls every parameter's current value (e.g. before evaluating).
  void pull();

 private:
  struct Param {
    std::string name;
    at::Tensor value;
    at::Tensor grad_buffer;  // zeros for parameters without a gradient this step
  };
  std::shared_ptr<ps::Client> client_;
  std::vector<Param> params_;
};

}  // namespace dtrain
