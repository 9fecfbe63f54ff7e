// pipeline_bench: each schedule on stages of calibrated cost, its measured bubble against the
// verifier's, and the micro-batches each rank held against the verifier's count
// (docs/performance.md, "Pipeline schedules").
//
//   build/bin/dtrain run -n 4 -- build/bin/pipeline_bench --microbatches 8 --rounds 3
//
// A stage is a module that sleeps: its forward for --forward-ms, its backward for
// --backward-input-ms when the input's gradient is wanted and --backward-weight-ms when the
// weight's is (both in a whole backward; zb-h1 asks for them in separate passes). Sleeping, not
// spinning, so 4 ranks on 2 cores still see their stages take the time asked. Interleaved stages
// take 1/v of each cost, so every schedule does the same work. The measured bubble of a step is
// 1 - (time the ranks spent in passes) / (ranks x the step's wall time, from a barrier); the
// figures are medians over --steps steps x --rounds rounds, the schedules in alternating order.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include "dtrain/dtrain.h"
#include "dtrain/pipeline/verifier.h"
#include "dtrain/torch/pipeline.h"
#include "dtrain/torch/tensor_view.h"

namespace {

void sleep_ms(double ms) {
  std::this_thread::sleep_until(std::chrono::steady_clock::now() +
                                std::chrono::duration<double, std::milli>(ms));
}

// y = x; its backward sleeps for the gradients asked of it.
struct Sleeper : torch::autograd::Function<Sleeper> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, double input_ms, double weight_ms) {
    ctx->saved_data["input_ms"] = input_ms;
    ctx->saved_data["weight_ms"] = weight_ms;
    ctx->save_for_backward({weight});
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const bool input = ctx->needs_input_grad(0), weight = ctx->needs_input_grad(1);
    sleep_ms((input ? ctx->saved_data["input_ms"].toDouble() : 0) +
             (weight ? ctx->saved_data["weight_ms"].toDouble() : 0));
    at::Tensor w = ctx->get_saved_variables()[0];
    return {input ? grads[0] : at::Tensor(), weight ? torch::zeros_like(w) : at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

// A stage's cost.
struct CalibratedImpl : torch::nn::Module {
  double f, b, w;
  at::Tensor weight;
  CalibratedImpl(double f_ms, double b_ms, double w_ms) : f(f_ms), b(b_ms), w(w_ms) {
    weight = register_parameter("weight", torch::ones({1}));
  }
  at::Tensor forward(const at::Tensor& x) {
    sleep_ms(f);
    return Sleeper::apply(x, weight, b, w);
  }
};
TORCH_MODULE(Calibrated);

// A free module with a parameter before it: its output is where a split backward's B stops on
// the first stage (whose input needs no gradient), as inside any real stage.
struct TapImpl : torch::nn::Module {
  at::Tensor scale;
  TapImpl() { scale = register_parameter("scale", torch::ones({1})); }
  at::Tensor forward(const at::Tensor& x) { return x * scale; }
};
TORCH_MODULE(Tap);

struct Flags {
  std::vector<std::string> schedules{"gpipe", "1f1b", "interleaved-1f1b", "zb-h1"};
  int microbatches = 8;
  int virtual_stages = 2;
  double forward_ms = 10, backward_input_ms = 10, backward_weight_ms = 10;
  int steps = 3;
  int rounds = 3;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Pipeline schedules on calibrated stages: measured bubble against the verifier's"};
  app.option_defaults()->always_capture_default();
  Flags f;
  app.add_option("--schedules", f.schedules)->delimiter(',');
  app.add_option("--microbatches", f.microbatches)->check(CLI::Range(1, 1024));
  app.add_option("--virtual-stages", f.virtual_stages, "for interleaved-1f1b")->check(CLI::Range(1, 16));
  app.add_option("--forward-ms", f.forward_ms)->check(CLI::Range(0.0, 1000.0));
  app.add_option("--backward-input-ms", f.backward_input_ms)->check(CLI::Range(0.0, 1000.0));
  app.add_option("--backward-weight-ms", f.backward_weight_ms)->check(CLI::Range(0.0, 1000.0));
  app.add_option("--steps", f.steps, "timed steps per schedule and round")->check(CLI::Range(1, 1000));
  app.add_option("--rounds", f.rounds)->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  try {
    at::set_num_threads(1);
    auto world = dtrain::init_process_group();
    const int p = world->size();
    const bool lead = world->rank() == 0;
    struct Row {
      std::vector<double> bubble, step_ms;
      std::vector<int> peak;
    };
    std::map<std::string, Row> rows;
    for (int round = 0; round < f.rounds; ++round) {
      auto order = f.schedules;
      if (round % 2 == 1) std::reverse(order.begin(), order.end());
      for (const auto& name : order) {
        const int v = name == "interleaved-1f1b" ? f.virtual_stages : 1;
        std::vector<torch::nn::Sequential> stages;
        for (int s = world->rank(); s < p * v; s += p)
          stages.push_back(torch::nn::Sequential(
              Tap(), Calibrated(f.forward_ms / v, f.backward_input_ms / v, f.backward_weight_ms / v)));
        dtrain::Pipeline pipe(stages, world, {.schedule = name, .microbatches = f.microbatches,
                                              .virtual_stages = v});
        auto x = torch::randn({f.microbatches * 2, 4});
        auto y = torch::zeros({f.microbatches * 2, 4});
        auto loss = [](const at::Tensor& out, const at::Tensor& t) { return (out - t).pow(2).mean(); };
        pipe.step(x, y, loss);  // warm-up
        Row& row = rows[name];
        for (int i = 0; i < f.steps; ++i) {
          world->barrier()->wait();
          pipe.step(x, y, loss);
          const auto st = pipe.stats();
          auto figures = torch::tensor({st.compute_ms, st.step_ms}, torch::kDouble);
          auto busy = figures.slice(0, 0, 1).clone(), wall = figures.slice(0, 1, 2).clone();
          world->allreduce(dtrain::view_of(busy))->wait();
          world->allreduce(dtrain::view_of(wall), {.op = dtrain::ReduceOp::kMax})->wait();
          row.bubble.push_back(1 - busy.item<double>() / (p * wall.item<double>()));
          row.step_ms.push_back(wall.item<double>());
          auto peaks = torch::zeros({p}, torch::kLong);
          peaks[world->rank()] = st.peak_microbatches;
          world->allreduce(dtrain::view_of(peaks))->wait();
          row.peak.assign(peaks.data_ptr<int64_t>(), peaks.data_ptr<int64_t>() + p);
        }
      }
    }
    if (lead) {
      std::printf("pipeline_bench: %d ranks, %d micro-batches, F %g ms, B %g ms, W %g ms, %d steps x "
                  "%d rounds\n\n",
                  p, f.microbatches, f.forward_ms, f.backward_input_ms, f.backward_weight_ms,
                  f.steps, f.rounds);
      std::printf("| schedule | v | bubble, verifier | bubble, measured | measured / verifier | "
                  "step ms, verifier | step ms, measured | peak micro-batches, verifier | measured |\n");
      std::printf("|---|---|---|---|---|---|---|---|---|\n");
      for (const auto& name : f.schedules) {
        const int v = name == "interleaved-1f1b" ? f.virtual_stages : 1;
        auto s = dtrain::pipeline::make_schedule(
            {.name = name, .ranks = p, .microbatches = f.microbatches, .virtual_stages = v});
        auto r = dtrain::pipeline::check(
            s, {f.forward_ms / v, f.backward_input_ms / v, f.backward_weight_ms / v, 0});
        const Row& row = rows[name];
        const double measured = median(row.bubble);
        std::printf("| %s | %d | %.3f | %.3f | %.3f | %.0f | %.0f | %s | %s |\n", name.c_str(), v,
                    r.bubble, measured, measured / r.bubble, r.makespan, median(row.step_ms),
                    fmt::format("{}", fmt::join(r.peak_microbatches, " ")).c_str(),
                    fmt::format("{}", fmt::join(row.peak, " ")).c_str());
      }
      std::fflush(stdout);
    }
    world->barrier()->wait();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeline_bench: %s\n", e.what());
    return 1;
  }
}
