#include "launch/gpu_topology.h"

#include <algorithm>
#include <functional>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::launch {

int link_score(const std::string& link) {
  static const std::regex kNvLink("NV(\\d+)");
  std::smatch m;
  if (std::regex_match(link, m, kNvLink)) return 100 + std::stoi(m[1]);
  if (link == "PIX") return 50;
  if (link == "PXB") return 40;
  if (link == "PHB") return 30;
  if (link == "NODE") return 20;
  if (link == "SYS" || link == "SOC") return 10;  // SOC: older drivers' name for SYS
  return 0;
}

std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> cpus;
  std::stringstream in(text);
  static const std::regex kRange("(\\d+)(?:-(\\d+))?");
  for (std::string part; std::getline(in, part, ',');) {
    std::smatch m;
    if (!std::regex_match(part, m, kRange) || part.size() > 12)
      throw InvalidArgumentError(fmt::format("'{}' is not a CPU list such as 0-3,8", text));
    const int lo = std::stoi(m[1]), hi = m[2].matched ? std::stoi(m[2]) : lo;
    if (hi < lo || hi > 65535)
      throw InvalidArgumentError(fmt::format("'{}' is not a CPU list such as 0-3,8", text));
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  return cpus;
}

GpuTopology parse_nvidia_smi_topo(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> header;
  GpuTopology t;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    // Columns are tab-separated; the header names them ("GPU0", ..., "CPU Affinity", ...).
    std::vector<std::string> cells;
    std::stringstream fields(line);
    for (std::string cell; std::getline(fields, cell, '\t');) {
      cell.erase(0, cell.find_first_not_of(' '));
      cell.erase(cell.find_last_not_of(" \r") + 1);
      cells.push_back(cell);
    }
    if (header.empty()) {
      if (cells.size() > 1 && cells[0].empty() && cells[1] == "GPU0") header = cells;
      continue;
    }
    if (cells.empty() || !std::regex_match(cells[0], std::regex("GPU\\d+"))) continue;
    if (cells.size() < header.size() - 1)
      throw InvalidArgumentError(
          fmt::format("nvidia-smi topo -m, line {}: {} columns where the header has {}: {}",
                      line_no, cells.size(), header.size(), line));
    const int gpu = std::stoi(cells[0].substr(3));
    if (gpu != t.gpus())
      throw InvalidArgumentError(fmt::format(
          "nvidia-smi topo -m, line {}: GPU{} where GPU{} was expected", line_no, gpu, t.gpus()));
    std::vector<std::string> links;
    std::vector<int> cpus;
    int numa = -1;
    for (size_t c = 1; c < header.size() && c < cells.size(); ++c) {
      if (std::regex_match(header[c], std::regex("GPU\\d+"))) {  // not "GPU NUMA ID"
        if (cells[c] != "X" && link_score(cells[c]) == 0)
          throw InvalidArgumentError(
              fmt::format("nvidia-smi topo -m, line {}: unknown link '{}' between GPU{} and {}",
                          line_no, cells[c], gpu, header[c]));
        links.push_back(cells[c]);
      } else if (header[c] == "CPU Affinity" && cells[c] != "N/A" && !cells[c].empty()) {
        cpus = parse_cpu_list(cells[c]);
      } else if ((header[c] == "NUMA Affinity" || header[c] == "NUMA") && cells[c] != "N/A" &&
                 std::regex_match(cells[c], std::regex("\\d+"))) {
        numa = std::stoi(cells[c]);
      }
    }
    t.link.push_back(std::move(links));
    t.cpus.push_back(std::move(cpus));
    t.numa.push_back(numa);
  }
  if (t.gpus() == 0)
    throw InvalidArgumentError("nvidia-smi topo -m: no GPU rows (a header line of GPU0 ...)");
  for (int i = 0; i < t.gpus(); ++i)
    if (static_cast<int>(t.link[i].size()) != t.gpus() || t.link[i][i] != "X")
      throw InvalidArgumentError(
          fmt::format("nvidia-smi topo -m: GPU{} has {} GPU columns for {} GPUs", i,
                      t.link[i].size(), t.gpus()));
  return t;
}

std::vector<std::vector<int>> pick_gpu_sets(const GpuTopology& t, int ranks, int per_rank) {
  if (ranks < 1 || per_rank < 1 || ranks * per_rank > t.gpus())
    throw InvalidArgumentError(
        fmt::format("{} rank(s) x {} GPU(s) each need {} GPUs; this node has {}", ranks, per_rank,
                    ranks * per_rank, t.gpus()));
  std::vector<bool> taken(t.gpus(), false);
  std::vector<std::vector<int>> sets;
  for (int r = 0; r < ranks; ++r) {
    // Every combination of the GPUs left (nodes have at most a few dozen GPUs and a rank takes
    // few: C(16, 8) = 12870 at most in practice): the weakest link highest, then the sum.
    std::vector<int> left;
    for (int g = 0; g < t.gpus(); ++g)
      if (!taken[g]) left.push_back(g);
    std::vector<int> best, current;
    std::pair<int, int> best_score{-1, -1};
    std::function<void(size_t)> search = [&](size_t from) {
      if (static_cast<int>(current.size()) == per_rank) {
        int weakest = 1000, sum = 0;
        for (size_t a = 0; a < current.size(); ++a)
          for (size_t b = a + 1; b < current.size(); ++b) {
            const int s = link_score(t.link[current[a]][current[b]]);
            weakest = std::min(weakest, s);
            sum += s;
          }
        if (std::pair{weakest, sum} > best_score) best_score = {weakest, sum}, best = current;
        return;
      }
      for (size_t i = from; i < left.size(); ++i) {
        current.push_back(left[i]);
        search(i + 1);
        current.pop_back();
      }
    };
    search(0);
    for (int g : best) taken[g] = true;
    sets.push_back(best);
  }
  return sets;
}

}  // namespace dtrain::launch
