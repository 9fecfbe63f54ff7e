// `dtrain predict`: the time per step and the scaling efficiency of a data-parallel job at up to
// thousands of ranks, for each layout, from a measured compute time and a network description
// (a named network or a calibration file). docs/scaling.md says how the model was checked.
//   dtrain predict --params 25.6M --compute-ms 250 --per-host 4 --network 25gbe --intra nvlink
//   dtrain predict --model weights.safetensors --compute-ms 40 --network costs.json --svg eff.svg
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/scaling_model.h"
#include "common/safetensors_file.h"
#include "tools/dtrain/commands.h"
#include "tools/dtrain/units.h"

namespace dtrain::tools {
namespace {

using comm::CostConstants;
using comm::CostModel;

struct PredictFlags {
  std::string params;  // 25.6M, 1.3B or a plain number
  std::string model;
  double compute_ms = 0;
  std::vector<int> ranks{1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
  int per_host = 1;
  int hosts_per_rack = 0;
  std::string network = "10gbe";
  std::string intra;  // empty: a calibration file's own link inside a host, else shm
  double rack_gbps = 0;
  double gamma_gbps = 0;
  std::vector<std::string> layouts{"ddp", "ddp-ring", "ddp-hierarchical", "ddp-recursive-doubling"};
  comm::StepModel step;
  double bucket_mib = 25;
  double activation_mib = 4;
  std::string csv;
  std::string svg;
};

struct Named {
  const char* name;
  double alpha_us;
  double gbytes_per_s;
};
// Between hosts: the one-way latency of a small message (kernel TCP on 1/10 GbE, RoCE verbs on
// 25/100 GbE as the clusters of Horovod's and BytePS's papers) and 94% of the line rate.
constexpr Named kNetworks[] = {
    {"1gbe", 50, 0.1175}, {"10gbe", 25, 1.175}, {"25gbe", 8, 2.94}, {"100gbe", 4, 11.75}};
// Inside a host: shared memory between CPU processes, GPUs over PCIe 3 or NVLink (NCCL's ring
// bandwidth on a DGX-1 class machine).
constexpr Named kIntra[] = {{"shm", 2, 10}, {"pcie", 8, 10}, {"nvlink", 5, 40}};

template <size_t N>
const Named* find_named(const Named (&table)[N], const std::string& name) {
  for (const auto& n : table)
    if (name == n.name) return &n;
  return nullptr;
}

CostConstants network_constants(const PredictFlags& f) {
  CostConstants k;
  const Named* named = find_named(kNetworks, f.network);
  if (named) {
    k.alpha = named->alpha_us * 1e-6;
    k.beta = 1.0 / (named->gbytes_per_s * 1e9);
  } else {
    k = CostModel::read_file(f.network, k);  // a calibration file: its measured links stand
  }
  // A named link inside hosts replaces a calibration file's measured one only when asked for.
  if (named || !f.intra.empty()) {
    const std::string name = f.intra.empty() ? "shm" : f.intra;
    const Named* intra = find_named(kIntra, name);
    if (!intra)
      throw std::runtime_error(
          fmt::format("dtrain predict: --intra '{}' is not shm, pcie or nvlink", name));
    k.alpha_local = intra->alpha_us * 1e-6;
    k.beta_local = 1.0 / (intra->gbytes_per_s * 1e9);
    // GPUs reduce far faster than they are fed: the reduction hides behind the copies.
    if (name != "shm") k.gamma = 1.0 / 500e9;
  }
  if (f.rack_gbps > 0) {
    k.alpha_rack = k.alpha * 2;
    k.beta_rack = 1.0 / (f.rack_gbps / 8 * 0.94 * 1e9);
  }
  if (f.gamma_gbps > 0) k.gamma = 1.0 / (f.gamma_gbps * 1e9);
  return k;
}

// Efficiency against ranks (log scale), one line per layout, as plain SVG.
void write_svg(const std::string& path, const std::vector<std::string>& layouts,
               const std::vector<std::vector<comm::StepPrediction>>& rows,
               const std::string& title) {
  const int W = 640, H = 400, L = 60, R = 170, T = 40, B = 50;
  const double xmax = std::log2(static_cast<double>(rows.back().front().ranks));
  auto x = [&](int n) {
    return L + (xmax > 0 ? std::log2(static_cast<double>(n)) / xmax : 0) * (W - L - R);
  };
  auto y = [&](double e) { return H - B - e * (H - B - T); };
  const char* colours[] = {"#1f6feb", "#d1242f", "#1a7f37", "#8250df",
                           "#bf8700", "#57606a", "#cf222e"};
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"{}\" height=\"{}\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"20\" text-anchor=\"middle\" font-size=\"13\">{}</text>\n",
      W, H, W, H, (W - R + L) / 2, title);
  for (int e = 0; e <= 10; e += 2) {
    out += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n",
                       L, y(e / 10.0), W - R, y(e / 10.0));
    out += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}%</text>\n", L - 6,
                       y(e / 10.0) + 4, e * 10);
  }
  for (const auto& p : rows)
    out += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                       x(p.front().ranks), H - B + 18, p.front().ranks);
  out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">ranks</text>\n",
                     (W - R + L) / 2, H - 12);
  out += fmt::format(
      "<text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">scaling "
      "efficiency</text>\n",
      H / 2, H / 2);
  for (size_t l = 0; l < layouts.size(); ++l) {
    std::string points;
    for (const auto& p : rows)
      if (p[l].runs) points += fmt::format("{:.1f},{:.1f} ", x(p[l].ranks), y(p[l].efficiency));
    const char* c = colours[l % std::size(colours)];
    out += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n",
                       points, c);
    out += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"{}\">{}</text>\n", W - R + 10,
                       T + 16 * (l + 1), c, layouts[l]);
  }
  out += "</svg>\n";
  std::ofstream f(path);
  f << out;
  if (!f) throw std::runtime_error(fmt::format("dtrain predict: cannot write '{}'", path));
}

void run_predict(PredictFlags f) {
  if (!f.model.empty()) {
    double total = 0;
    for (const auto& e : read_safetensors_file(f.model)) {
      double n = 1;
      for (int64_t d : e.shape) n *= static_cast<double>(d);
      total += n;
    }
    f.step.parameters = total;
  } else if (!f.params.empty()) {
    f.step.parameters = parse_count(f.params, "dtrain predict: --params");
  }
  if (f.step.parameters <= 0)
    throw std::runtime_error("dtrain predict: give --params N or --model FILE.safetensors");
  if (f.compute_ms <= 0)
    throw std::runtime_error(
        "dtrain predict: give --compute-ms, the measured time of one rank's forward and backward");
  f.step.compute_s = f.compute_ms / 1e3;
  f.step.bucket_bytes = f.bucket_mib * 1024 * 1024;
  f.step.activation_bytes = f.activation_mib * 1024 * 1024;
  const CostModel model(network_constants(f));
  const auto& k = model.constants();
  std::printf(
      "%.4gM parameters (%.1f MiB of gradients), %.1f ms compute per step, %d rank(s) per host%s\n",
      f.step.parameters / 1e6, f.step.parameters * f.step.bytes_per_gradient / 1048576,
      f.compute_ms, f.per_host,
      f.hosts_per_rack > 0 ? fmt::format(", {} hosts per rack", f.hosts_per_rack).c_str() : "");
  std::printf(
      "links: between hosts %.1f us + %.2f GB/s, inside %.1f us + %.1f GB/s%s; reduction %.0f "
      "GB/s\n",
      k.alpha * 1e6, 1e-9 / k.beta, k.alpha_local * 1e6, 1e-9 / k.beta_local,
      k.beta_rack > 0 ? fmt::format(", between racks {:.1f} us + {:.2f} GB/s", k.rack().alpha * 1e6,
                                    1e-9 / k.rack().beta)
                            .c_str()
                      : "",
      1e-9 / k.gamma);
  std::string header = fmt::format("{:>6}", "ranks");
  for (const auto& l : f.layouts) header += fmt::format("  {:>24}", l);
  std::printf("%s\n%*s", header.c_str(), 6, "");
  for (size_t i = 0; i < f.layouts.size(); ++i) std::printf("  %24s", "step ms  efficiency");
  std::printf("\n");
  std::vector<std::vector<comm::StepPrediction>> rows;
  for (int n : f.ranks) {
    comm::ClusterShape shape{n, f.per_host, f.hosts_per_rack};
    std::vector<comm::StepPrediction> row;
    std::string line = fmt::format("{:>6}", n);
    for (const auto& l : f.layouts) {
      row.push_back(comm::predict_step(model, f.step, shape, l));
      line += row.back().runs ? fmt::format("  {:>13.1f} {:>9.1f}%", row.back().step_s * 1e3,
                                            row.back().efficiency * 100)
                              : fmt::format("  {:>24}", "-");
    }
    std::printf("%s\n", line.c_str());
    rows.push_back(std::move(row));
  }
  if (!f.csv.empty()) {
    std::ofstream out(f.csv);
    out << "ranks,layout,step_ms,comm_ms,exposed_ms,efficiency\n";
    for (const auto& row : rows)
      for (const auto& p : row)
        if (p.runs)
          out << fmt::format("{},{},{:.3f},{:.3f},{:.3f},{:.4f}\n", p.ranks, p.layout,
                             p.step_s * 1e3, p.comm_s * 1e3, p.exposed_s * 1e3, p.efficiency);
    if (!out) throw std::runtime_error(fmt::format("dtrain predict: cannot write '{}'", f.csv));
  }
  if (!f.svg.empty())
    write_svg(f.svg, f.layouts, rows,
              fmt::format("{:.3g}M parameters, {} ms compute, {} per host, {}",
                          f.step.parameters / 1e6, f.compute_ms, f.per_host, f.network));
}

}  // namespace

CLI::App* add_predict_command(CLI::App& app) {
  auto f = std::make_shared<PredictFlags>();
  CLI::App* cmd = app.add_subcommand(
      "predict",
      "Time per step and scaling efficiency at up to thousands of ranks, per layout, from "
      "the cost model (`dtrain docs scaling`)");
  cmd->add_option("--params", f->params, "Parameters of the model: 25.6M, 1.3B or a number");
  cmd->add_option("--model", f->model, "Count the parameters of this safetensors file instead");
  cmd->add_option("--compute-ms", f->compute_ms,
                  "Measured forward + backward of one rank's batch, ms")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--ranks", f->ranks, "World sizes to predict")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--per-host", f->per_host, "Ranks (GPUs) per host")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--hosts-per-rack", f->hosts_per_rack,
                  "Hosts behind each rack switch (0: one rack)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--network", f->network,
                  "Between hosts: 1gbe, 10gbe, 25gbe, 100gbe, or a calibration file (dtrain bench "
                  "allreduce --calibrate)")
      ->capture_default_str();
  cmd->add_option("--intra", f->intra,
                  "Inside a host: shm, pcie or nvlink (default: a calibration file's own "
                  "measured link, else shm)");
  cmd->add_option("--rack-gbps", f->rack_gbps, "Gbit/s of each rack's uplink, shared by its hosts")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--gamma-gbps", f->gamma_gbps, "GB/s of reduction")->check(CLI::PositiveNumber);
  cmd->add_option("--layouts", f->layouts,
                  "ddp (the cost model's choice), ddp-ring, ddp-hierarchical, "
                  "ddp-recursive-doubling, ps, zero3, pipeline")
      ->delimiter(',')
      ->check(CLI::IsMember(comm::step_layouts()));
  cmd->add_option("--bucket-mib", f->bucket_mib, "Gradients per all-reduce bucket")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--bytes-per-gradient", f->step.bytes_per_gradient, "4 (fp32) or 2 (fp16/bf16)")
      ->capture_default_str();
  cmd->add_option("--backward-share", f->step.backward_share,
                  "Part of the compute that is backward")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--ps-servers", f->step.ps_servers,
                  "ps: parameter servers (each on a host of its own)");
  cmd->add_option("--stages", f->step.pipeline_stages, "pipeline: stages")->capture_default_str();
  cmd->add_option("--micro-batches", f->step.micro_batches, "pipeline: micro-batches per step")
      ->capture_default_str();
  cmd->add_option("--activation-mib", f->activation_mib,
                  "pipeline: activations a stage sends per step")
      ->capture_default_str();
  cmd->add_option("--csv", f->csv, "Also write the predictions as CSV");
  cmd->add_option("--svg", f->svg, "Also draw efficiency against ranks as SVG");
  cmd->callback([f] { run_predict(*f); });
  return cmd;
}

}  // namespace dtrain::tools
