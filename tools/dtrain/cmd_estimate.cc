// `dtrain estimate`: the bytes per rank a training job holds, per layout (docs/memory.md).
//   dtrain estimate --params 7B --optimizer adam --precision bf16 --world-size 8 --layout zero3
//   dtrain estimate --model weights.safetensors --world-size 4          # every layout
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "common/safetensors_file.h"
#include "dtrain/memory_estimate.h"
#include "tools/dtrain/commands.h"
#include "tools/dtrain/units.h"

namespace dtrain::tools {
namespace {

struct EstimateFlags {
  MemoryEstimateOptions options;
  std::string params;                    // 110000000, 1.1e8, 110M, 7B (units.h)
  std::vector<std::string> layer_sizes;  // the same, per layer
  std::string largest_unit;
  std::string model;
  std::string layout = "all";
};

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", bytes / 1048576.0); }

void run_estimate(EstimateFlags f) {
  if (!f.params.empty()) f.options.parameters = parse_whole_count(f.params, "--params");
  if (!f.largest_unit.empty())
    f.options.largest_unit = parse_whole_count(f.largest_unit, "--largest-unit");
  if (!f.model.empty()) {
    // A unit is a module: the tensors whose names share all but the last part ("3.weight" and
    // "3.bias"), as ShardedDataParallel gathers a Sequential's children.
    int64_t total = 0;
    std::map<std::string, int64_t> units;
    for (const auto& e : read_safetensors_file(f.model)) {
      int64_t n = 1;
      for (int64_t d : e.shape) n *= d;
      total += n;
      const auto dot = e.name.rfind('.');
      units[dot == std::string::npos ? e.name : e.name.substr(0, dot)] += n;
    }
    f.options.parameters = total;
    for (const auto& [unit, n] : units)
      if (f.options.largest_unit == 0 || n > f.options.largest_unit) f.options.largest_unit = n;
  }
  if (!f.layer_sizes.empty()) {
    f.options.parameters = 0;
    for (const auto& text : f.layer_sizes) {
      const int64_t n = parse_whole_count(text, "--layers");
      f.options.parameters += n;
      f.options.largest_unit = std::max(f.options.largest_unit, n);
    }
  }
  if (f.options.parameters <= 0)
    throw std::runtime_error(
        "dtrain estimate: give --params N, --layers N,N,... or --model FILE.safetensors");
  const auto& all = memory_layouts();
  std::vector<std::string> layouts = f.layout == "all" ? all : std::vector<std::string>{f.layout};
  std::printf("%lld parameters, %s, %s, %d rank(s): per rank\n",
              static_cast<long long>(f.options.parameters), f.options.optimizer.c_str(),
              f.options.precision.c_str(), f.options.world_size);
  // ZeRO cuts by the ranks, tensor and pipeline layouts by the ranks they are given: a world of
  // one cuts nothing, whatever the layout says.
  if (f.options.world_size == 1 && (f.layout == "all" || f.layout != "ddp"))
    std::printf(
        "a world of one shards and cuts nothing: give --world-size N to see a layout "
        "spread over N ranks\n");
  if (layouts.size() == 1) {
    f.options.layout = layouts[0];
    const MemoryEstimate e = estimate_memory(f.options);
    const char* names[] = {"parameters", "gradients", "optimizer state", "gathered"};
    const int64_t values[] = {e.parameters, e.gradients, e.optimizer, e.gathered};
    std::printf("layout %s\n", layouts[0].c_str());
    for (int i = 0; i < 4; ++i)
      if (values[i] > 0 || !e.notes[i].empty())
        std::printf("%-16s %14lld  %10s  %s\n", names[i], static_cast<long long>(values[i]),
                    mib(values[i]).c_str(), e.notes[i].c_str());
    std::printf("%-16s %14lld  %10s\n", "model states", static_cast<long long>(e.model_states()),
                mib(e.model_states()).c_str());
    std::printf("%-16s %14lld  %10s  %s\n", "activations", static_cast<long long>(e.activations),
                mib(e.activations).c_str(), e.notes.back().c_str());
    std::printf("%-16s %14lld  %10s\n", "total", static_cast<long long>(e.total()),
                mib(e.total()).c_str());
    return;
  }
  std::string header = fmt::format("{:<16}", "");
  std::vector<MemoryEstimate> es;
  for (const auto& l : layouts) {
    f.options.layout = l;
    es.push_back(estimate_memory(f.options));
    header += fmt::format(" {:>12}", l);
  }
  std::printf("%s\n", header.c_str());
  auto row = [&](const char* name, auto get) {
    std::string line = fmt::format("{:<16}", name);
    for (const auto& e : es) line += fmt::format(" {:>12}", mib(get(e)));
    std::printf("%s\n", line.c_str());
  };
  row("parameters", [](const MemoryEstimate& e) { return e.parameters; });
  row("gradients", [](const MemoryEstimate& e) { return e.gradients; });
  row("optimizer state", [](const MemoryEstimate& e) { return e.optimizer; });
  row("gathered", [](const MemoryEstimate& e) { return e.gathered; });
  row("model states", [](const MemoryEstimate& e) { return e.model_states(); });
  row("activations", [](const MemoryEstimate& e) { return e.activations; });
  row("total", [](const MemoryEstimate& e) { return e.total(); });
}

}  // namespace

CLI::App* add_estimate_command(CLI::App& app) {
  auto f = std::make_shared<EstimateFlags>();
  CLI::App* cmd = app.add_subcommand(
      "estimate",
      "Bytes per rank of parameters, gradients, optimizer state and activations, for "
      "DDP, ZeRO 1-3, tensor and pipeline layouts (`dtrain docs memory`)");
  cmd->add_option("--params", f->params, "Parameters of the model: 110000000, 1.1e8, 110M, 7B");
  cmd->add_option("--model", f->model, "Count the parameters of this safetensors file instead");
  cmd->add_option("--optimizer", f->options.optimizer)
      ->check(CLI::IsMember({"sgd", "momentum", "adam", "adamw"}))
      ->capture_default_str();
  cmd->add_option("--precision", f->options.precision,
                  "fp32, or bf16/fp16 (16-bit parameters and gradients, an fp32 master copy)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  cmd->add_option("--world-size", f->options.world_size, "Ranks (the sharding or cutting degree)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  std::vector<std::string> choices = memory_layouts();
  choices.push_back("all");
  cmd->add_option("--layout", f->layout, "ddp, zero1, zero2, zero3, tp, pp or all")
      ->check(CLI::IsMember(choices))
      ->capture_default_str();
  cmd->add_option("--layers", f->layer_sizes,
                  "Parameters of each layer (unit), e.g. 1049600,1049600,10250 or 1M,1M,10K: "
                  "their sum is the model, the largest the largest unit")
      ->delimiter(',');
  cmd->add_option("--largest-unit", f->largest_unit,
                  "zero: parameters of the largest unit (a Sequential child, gathered at once at "
                  "stage 3; --model: its largest module's tensors together), e.g. 50M");
  cmd->add_option("--batch", f->options.batch, "Samples per rank per step (for activations)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("--activation-bytes", f->options.activation_bytes_per_sample,
                  "Activation bytes one sample keeps for backward, through the whole model")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--microbatches", f->options.microbatches, "pp: micro-batches per batch")
      ->check(CLI::Range(1, 1 << 20));
  cmd->callback([f] { run_estimate(*f); });
  return cmd;
}

}  // namespace dtrain::tools
