#include "bench/bench_common.h"

#include <sys/resource.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

namespace dtrain::bench {
namespace {

struct CollectiveName {
  Collective c;
  std::string_view name;
};
constexpr CollectiveName kCollectives[] = {
    {Collective::kAllreduce, "allreduce"},
    {Collective::kBroadcast, "broadcast"},
    {Collective::kReduce, "reduce"},
    {Collective::kAllgather, "allgather"},
    {Collective::kGather, "gather"},
    {Collective::kScatter, "scatter"},
    {Collective::kReduceScatter, "reducescatter"},
    {Collective::kAlltoall, "alltoall"},
    {Collective::kBarrier, "barrier"},
    {Collective::kSendRecv, "sendrecv"},
};

std::string join_names() {
  std::string out;
  for (const auto& c : kCollectives) {
    if (!out.empty()) out += ", ";
    out += c.name;
  }
  return out;
}

template <typename T>
void fill_typed(Op op, int rank, T* data, size_t count) {
  for (size_t i = 0; i < count; ++i) data[i] = static_cast<T>(input_value(op, rank, i));
}

double reduce_all(Op op, int nranks, size_t index) {
  double acc = input_value(op, 0, index);
  for (int r = 1; r < nranks; ++r) {
    double v = input_value(op, r, index);
    switch (op) {
      case Op::kSum:
        acc += v;
        break;
      case Op::kProd:
        acc *= v;
        break;
      case Op::kMin:
        acc = std::min(acc, v);
        break;
      case Op::kMax:
        acc = std::max(acc, v);
        break;
    }
  }
  return acc;
}

// The value element `k` of rank `rank`'s output must hold; nullopt-like NaN for "unchecked".
template <typename T>
uint64_t count_wrong_typed(Collective c, Op op, int rank, int nranks, const Layout& l,
                           const T* out) {
  auto expect = [&](size_t k) -> double {
    switch (c) {
      case Collective::kAllreduce:
      case Collective::kReduce:
        return reduce_all(op, nranks, k);
      case Collective::kBroadcast:
        return input_value(op, 0, k);
      case Collective::kAllgather:
      case Collective::kGather:
        return input_value(op, static_cast<int>(k / l.block), k % l.block);
      case Collective::kScatter:
        return input_value(op, 0, rank * l.block + k);
      case Collective::kReduceScatter:
        return reduce_all(op, nranks, rank * l.block + k);
      case Collective::kAlltoall:
        return input_value(op, static_cast<int>(k / l.block), rank * l.block + k % l.block);
      case Collective::kSendRecv:
        return input_value(op, (rank + nranks - 1) % nranks, k);
      case Collective::kBarrier:
        return 0;
    }
    return 0;
  };
  if (c == Collective::kBarrier) return 0;
  if ((c == Collective::kReduce || c == Collective::kGather) && rank != 0) return 0;
  size_t n = 0;
  switch (c) {
    case Collective::kAllreduce:
    case Collective::kReduce:
    case Collective::kBroadcast:
    case Collective::kSendRecv:
      n = l.in_count;
      break;
    case Collective::kAllgather:
    case Collective::kGather:
    case Collective::kAlltoall:
      n = l.out_count;
      break;
    case Collective::kScatter:
    case Collective::kReduceScatter:
      n = l.block;
      break;
    case Collective::kBarrier:
      break;
  }
  uint64_t wrong = 0;
  for (size_t k = 0; k < n; ++k)
    if (out[k] != static_cast<T>(expect(k))) ++wrong;
  return wrong;
}

size_t parse_one_size(std::string_view s) {
  if (s.empty()) throw std::invalid_argument("empty size");
  std::string t(s);
  if (t.back() == 'B' || t.back() == 'b') t.pop_back();
  size_t mult = 1;
  if (!t.empty()) {
    switch (t.back()) {
      case 'K':
      case 'k':
        mult = size_t{1} << 10;
        t.pop_back();
        break;
      case 'M':
      case 'm':
        mult = size_t{1} << 20;
        t.pop_back();
        break;
      case 'G':
      case 'g':
        mult = size_t{1} << 30;
        t.pop_back();
        break;
      default:
        break;
    }
  }
  if (t.empty() || !std::all_of(t.begin(), t.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
    throw std::invalid_argument("bad size '" + std::string(s) +
                                "': use bytes with an optional K, M or G suffix, e.g. 64K");
  // Each rank holds a few buffers of the size, and so does every peer implementation: 1 GiB
  // each is already more than most machines that run several ranks have.
  constexpr size_t kMax = size_t{1} << 30;
  size_t n = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), n);
  if (ec != std::errc() || end != t.data() + t.size() || n > kMax / mult)
    throw std::invalid_argument("size '" + std::string(s) + "' is too large: at most 1G");
  return n * mult;
}

}  // namespace

std::string_view to_string(Collective c) {
  for (const auto& e : kCollectives)
    if (e.c == c) return e.name;
  return "?";
}
std::string_view to_string(ElemType t) {
  switch (t) {
    case ElemType::kF32:
      return "f32";
    case ElemType::kF64:
      return "f64";
    case ElemType::kI32:
      return "i32";
    case ElemType::kI64:
      return "i64";
  }
  return "?";
}
std::string_view to_string(Op op) {
  switch (op) {
    case Op::kSum:
      return "sum";
    case Op::kProd:
      return "prod";
    case Op::kMin:
      return "min";
    case Op::kMax:
      return "max";
  }
  return "?";
}

Collective parse_collective(std::string_view name) {
  for (const auto& e : kCollectives)
    if (e.name == name) return e.c;
  if (name == "reduce_scatter") return Collective::kReduceScatter;
  if (name == "all_reduce") return Collective::kAllreduce;
  if (name == "all_gather") return Collective::kAllgather;
  if (name == "all_to_all") return Collective::kAlltoall;
  throw std::invalid_argument("unknown collective '" + std::string(name) + "': use one of " +
                              join_names());
}
ElemType parse_elem_type(std::string_view name) {
  if (name == "f32" || name == "float" || name == "float32") return ElemType::kF32;
  if (name == "f64" || name == "double" || name == "float64") return ElemType::kF64;
  if (name == "i32" || name == "int" || name == "int32") return ElemType::kI32;
  if (name == "i64" || name == "int64") return ElemType::kI64;
  throw std::invalid_argument("unsupported dtype '" + std::string(name) +
                              "': the benchmark checks f32, f64, i32 and i64");
}
Op parse_op(std::string_view name) {
  if (name == "sum") return Op::kSum;
  if (name == "prod") return Op::kProd;
  if (name == "min") return Op::kMin;
  if (name == "max") return Op::kMax;
  throw std::invalid_argument("unsupported op '" + std::string(name) +
                              "': use sum, prod, min or max");
}

const std::vector<Collective>& all_collectives() {
  static const std::vector<Collective> all = [] {
    std::vector<Collective> v;
    for (const auto& e : kCollectives) v.push_back(e.c);
    return v;
  }();
  return all;
}

bool is_reduction(Collective c) {
  return c == Collective::kAllreduce || c == Collective::kReduce || c == Collective::kReduceScatter;
}

size_t elem_size(ElemType t) {
  switch (t) {
    case ElemType::kF32:
    case ElemType::kI32:
      return 4;
    case ElemType::kF64:
    case ElemType::kI64:
      return 8;
  }
  return 1;
}

std::vector<size_t> parse_sizes(std::string_view text) {
  std::vector<size_t> sizes;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string_view item =
        text.substr(pos, comma == std::string_view::npos ? text.npos : comma - pos);
    if (!item.empty()) {
      size_t colon = item.find(':');
      if (colon == std::string_view::npos) {
        sizes.push_back(parse_one_size(item));
      } else {
        size_t lo = parse_one_size(item.substr(0, colon));
        size_t hi = parse_one_size(item.substr(colon + 1));
        if (lo == 0 || lo > hi)
          throw std::invalid_argument("bad size range '" + std::string(item) +
                                      "': use LO:HI with 0 < LO <= HI, e.g. 4K:64M");
        for (size_t s = lo; s <= hi; s *= 2) sizes.push_back(s);
      }
    }
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  if (sizes.empty()) throw std::invalid_argument("no sizes given: e.g. --sizes 4K,64K,1M");
  return sizes;
}

std::string format_bytes(size_t bytes) {
  constexpr const char* kUnits[] = {"", "K", "M", "G"};
  int u = 0;
  while (u < 3 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return std::to_string(bytes) + kUnits[u];
}

Layout layout_for(Collective c, size_t requested_bytes, int nranks, ElemType t) {
  const size_t es = elem_size(t);
  const size_t n = static_cast<size_t>(nranks);
  Layout l;
  size_t count = requested_bytes / es;
  switch (c) {
    case Collective::kBarrier:
      return l;
    case Collective::kAllreduce:
    case Collective::kBroadcast:
    case Collective::kReduce:
      l.in_count = l.block = count;
      break;
    case Collective::kSendRecv:
      l.in_count = l.out_count = l.block = count;
      break;
    case Collective::kAllgather:
    case Collective::kGather:
      l.block = count / n;
      l.in_count = l.block;
      l.out_count = l.block * n;
      break;
    case Collective::kScatter:
    case Collective::kReduceScatter:
      l.block = count / n;
      l.in_count = l.block * n;
      l.out_count = l.block;
      break;
    case Collective::kAlltoall:
      l.block = count / n;
      l.in_count = l.out_count = l.block * n;
      break;
  }
  l.count = std::max(l.in_count, l.out_count);
  l.bytes = l.count * es;
  return l;
}

double busbw_factor(Collective c, int nranks) {
  const double n = nranks;
  switch (c) {
    case Collective::kAllreduce:
      return 2.0 * (n - 1) / n;
    case Collective::kReduceScatter:
    case Collective::kAllgather:
    case Collective::kAlltoall:
    case Collective::kGather:
    case Collective::kScatter:
      return (n - 1) / n;
    case Collective::kBroadcast:
    case Collective::kReduce:
    case Collective::kSendRecv:
      return 1.0;
    case Collective::kBarrier:
      return 0.0;
  }
  return 0.0;
}

double input_value(Op op, int rank, size_t index) {
  if (op == Op::kProd) return (static_cast<size_t>(rank) + index) % 3 == 0 ? -1.0 : 1.0;
  return static_cast<double>((5 * static_cast<uint64_t>(rank) + 3 * (index % 17)) % 17) - 8.0;
}

void fill_input(ElemType t, Op op, int rank, void* data, size_t count) {
  switch (t) {
    case ElemType::kF32:
      fill_typed(op, rank, static_cast<float*>(data), count);
      break;
    case ElemType::kF64:
      fill_typed(op, rank, static_cast<double*>(data), count);
      break;
    case ElemType::kI32:
      fill_typed(op, rank, static_cast<int32_t*>(data), count);
      break;
    case ElemType::kI64:
      fill_typed(op, rank, static_cast<int64_t*>(data), count);
      break;
  }
}

uint64_t count_wrong(Collective c, ElemType t, Op op, int rank, int nranks, const Layout& layout,
                     const void* output) {
  switch (t) {
    case ElemType::kF32:
      return count_wrong_typed(c, op, rank, nranks, layout, static_cast<const float*>(output));
    case ElemType::kF64:
      return count_wrong_typed(c, op, rank, nranks, layout, static_cast<const double*>(output));
    case ElemType::kI32:
      return count_wrong_typed(c, op, rank, nranks, layout, static_cast<const int32_t*>(output));
    case ElemType::kI64:
      return count_wrong_typed(c, op, rank, nranks, layout, static_cast<const int64_t*>(output));
  }
  return 0;
}

Buffers::Buffers(Collective c, ElemType t, Op op, int rank, int nranks, const Layout& layout,
                 bool in_place)
    : in_place_(in_place) {
  const size_t es = elem_size(t);
  // An in-place op may produce more than it consumes (gloo's old-style algorithms): size the one
  // buffer for both.
  size_t in_elems = in_place ? std::max(layout.in_count, layout.out_count) : layout.in_count;
  input_.resize(std::max<size_t>(in_elems * es, es));
  fill_input(t, op, rank, input_.data(), in_elems);
  pristine_ = input_;
  if (!in_place) output_.resize(std::max<size_t>(layout.out_count * es, es));
}

void Buffers::restore(bool poison) {
  if (in_place_) {
    std::memcpy(input_.data(), pristine_.data(), input_.size());
  } else if (poison) {
    // 0x7f bytes: a large value no input or reduction of small integers produces.
    std::memset(output_.data(), 0x7f, output_.size());
  }
}

double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

Measurement measure(const Hooks& hooks, int warmup, int iters) {
  auto now = hooks.now ? hooks.now : [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  auto prepare = [&] {
    if (hooks.prepare) hooks.prepare();
  };
  Measurement m;
  for (int i = 0; i < warmup; ++i) {
    prepare();
    hooks.barrier();
    hooks.run();
  }
  if (hooks.check) {
    if (hooks.prepare_check) {
      hooks.prepare_check();
    } else {
      prepare();
    }
    hooks.barrier();
    hooks.run();
    double local = static_cast<double>(hooks.check());
    m.wrong = static_cast<uint64_t>(hooks.sum_over_ranks(local));
    m.checked = true;
  }
  m.seconds.reserve(iters);
  const bool straggle = hooks.straggle_seconds > 0;
  const double waiters = straggle ? hooks.sum_over_ranks(hooks.straggler ? 0.0 : 1.0) : 0.0;
  for (int i = 0; i < iters; ++i) {
    prepare();
    hooks.barrier();
    const double cpu0 = straggle ? process_cpu_seconds() : 0.0;
    double t0 = now();
    if (straggle && hooks.straggler)
      std::this_thread::sleep_for(std::chrono::duration<double>(hooks.straggle_seconds));
    hooks.run();
    double t = now() - t0;
    const double cpu = straggle ? process_cpu_seconds() - cpu0 : 0.0;
    m.seconds.push_back(hooks.max_over_ranks(t));
    if (straggle && waiters > 0)
      m.wait_cpu_seconds.push_back(hooks.sum_over_ranks(hooks.straggler ? 0.0 : cpu) / waiters);
  }
  return m;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  if (n == 0) return 0;
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

Stats summarize(std::vector<double> seconds) {
  Stats s;
  if (seconds.empty()) return s;
  std::sort(seconds.begin(), seconds.end());
  const size_t n = seconds.size();
  s.median_us = 1e6 * median(seconds);
  // Nearest rank: the smallest value with at least 99% of the iterations at or below it.
  size_t rank = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(n)));
  s.p99_us = 1e6 * seconds[std::clamp<size_t>(rank, 1, n) - 1];
  return s;
}

Result make_result(std::string impl, Collective c, int nranks, const Layout& layout, ElemType t,
                   Op op, const Measurement& m, std::string algo) {
  Result r;
  r.impl = std::move(impl);
  r.coll = std::string(to_string(c));
  r.np = nranks;
  r.bytes = layout.bytes;
  r.count = layout.count;
  r.dtype = std::string(to_string(t));
  r.op = is_reduction(c) ? std::string(to_string(op)) : "none";
  Stats s = summarize(m.seconds);
  r.time_us = s.median_us;
  r.p99_us = s.p99_us;
  if (s.median_us > 0) {
    r.algbw_gbs = static_cast<double>(layout.bytes) / (s.median_us * 1e-6) / 1e9;
    r.busbw_gbs = r.algbw_gbs * busbw_factor(c, nranks);
  }
  r.wrong = m.checked ? static_cast<int64_t>(m.wrong) : -1;
  r.algo = std::move(algo);
  if (!m.wait_cpu_seconds.empty()) r.wait_cpu_us = summarize(m.wait_cpu_seconds).median_us;
  return r;
}

std::string to_json_line(const Result& r) {
  nlohmann::ordered_json j;
  j["impl"] = r.impl;
  j["coll"] = r.coll;
  j["np"] = r.np;
  j["bytes"] = r.bytes;
  j["count"] = r.count;
  j["dtype"] = r.dtype;
  j["op"] = r.op;
  j["time_us"] = r.time_us;
  j["p99_us"] = r.p99_us;
  j["algbw_gbs"] = r.algbw_gbs;
  j["busbw_gbs"] = r.busbw_gbs;
  j["wrong"] = r.wrong;
  j["algo"] = r.algo;
  if (r.wait_cpu_us >= 0) j["wait_cpu_us"] = r.wait_cpu_us;
  if (r.round > 0) j["round"] = r.round;
  if (r.bound_fraction >= 0) j["bound_fraction"] = r.bound_fraction;
  return j.dump();
}

Result parse_json_line(std::string_view line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("impl") || !j.contains("time_us"))
    throw std::invalid_argument("not a benchmark result line: " + std::string(line));
  Result r;
  try {
    r.impl = j.at("impl").get<std::string>();
    r.coll = j.at("coll").get<std::string>();
    r.np = j.at("np").get<int>();
    r.bytes = j.at("bytes").get<size_t>();
    r.count = j.value("count", size_t{0});
    r.dtype = j.value("dtype", std::string());
    r.op = j.value("op", std::string());
    r.time_us = j.at("time_us").get<double>();
    r.p99_us = j.value("p99_us", 0.0);
    r.algbw_gbs = j.value("algbw_gbs", 0.0);
    r.busbw_gbs = j.value("busbw_gbs", 0.0);
    r.wrong = j.value("wrong", int64_t{-1});
    r.algo = j.value("algo", std::string());
    r.wait_cpu_us = j.value("wait_cpu_us", -1.0);
    r.round = j.value("round", 0);
    r.bound_fraction = j.value("bound_fraction", -1.0);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("malformed benchmark result line (" + std::string(e.what()) +
                                "): " + std::string(line));
  }
  return r;
}

std::vector<std::string> to_peer_args(const PeerConfig& c) {
  std::string colls;
  for (Collective x : c.collectives) {
    if (!colls.empty()) colls += ",";
    colls += to_string(x);
  }
  std::string sizes;
  for (size_t s : c.sizes) {
    if (!sizes.empty()) sizes += ",";
    sizes += std::to_string(s);
  }
  std::vector<std::string> args = {"--coll",    colls,
                                   "--sizes",   sizes,
                                   "--dtype",   std::string(to_string(c.dtype)),
                                   "--op",      std::string(to_string(c.op)),
                                   "--iters",   std::to_string(c.iters),
                                   "--warmup",  std::to_string(c.warmup),
                                   "--check",   c.check ? "1" : "0",
                                   "--timeout", std::to_string(c.timeout_s)};
  if (!c.algo.empty()) {
    args.push_back("--algo");
    args.push_back(c.algo);
  }
  if (c.straggle_ms > 0) {
    args.push_back("--straggle-ms");
    args.push_back(std::to_string(c.straggle_ms));
  }
  return args;
}

PeerConfig parse_peer_args(const std::vector<std::string>& args) {
  static const std::string kUsage =
      "usage: --coll C[,C...] --sizes S[,S...] [--dtype f32] [--op sum] [--iters 20] "
      "[--warmup 5] [--check 1] [--timeout 60] [--algo NAME] [--straggle-ms MS]";
  PeerConfig c;
  bool have_coll = false;
  c.sizes = {4096};
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& key = args[i];
    if (i + 1 >= args.size())
      throw std::invalid_argument("missing value after " + key + "; " + kUsage);
    const std::string& value = args[++i];
    if (key == "--coll") {
      c.collectives.clear();
      size_t pos = 0;
      while (pos <= value.size()) {
        size_t comma = value.find(',', pos);
        std::string item =
            value.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        if (!item.empty()) c.collectives.push_back(parse_collective(item));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
      have_coll = !c.collectives.empty();
    } else if (key == "--sizes") {
      c.sizes = parse_sizes(value);
    } else if (key == "--dtype") {
      c.dtype = parse_elem_type(value);
    } else if (key == "--op") {
      c.op = parse_op(value);
    } else if (key == "--iters") {
      c.iters = std::stoi(value);
    } else if (key == "--warmup") {
      c.warmup = std::stoi(value);
    } else if (key == "--check") {
      c.check = value != "0";
    } else if (key == "--timeout") {
      c.timeout_s = std::stod(value);
    } else if (key == "--algo") {
      c.algo = value;
    } else if (key == "--straggle-ms") {
      c.straggle_ms = std::stod(value);
    } else {
      throw std::invalid_argument("unknown argument " + key + "; " + kUsage);
    }
  }
  if (!have_coll) throw std::invalid_argument("no --coll given; " + kUsage);
  if (c.iters < 1 || c.warmup < 0)
    throw std::invalid_argument("--iters must be >= 1, --warmup >= 0");
  return c;
}

}  // namespace dtrain::bench
