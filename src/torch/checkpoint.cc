// Checkpoints (format and guarantees in dtrain/torch/checkpoint.h).
//
// Why the steps are in this order: a checkpoint directory is valid only once its manifest, which
// carries every file's size and CRC-32, is in it, and it only gets its final name by a rename
// after everything in it was fsync'ed. So after a crash DIR holds complete checkpoints and at most
// a temporary directory; a checkpoint damaged later (a bad disk, a truncating copy) fails its
// checksums at load and the previous one is used.
#include "dtrain/torch/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <cxxabi.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <typeinfo>

#include "common/deadline.h"
#include "common/json_integer.h"
#include "common/log.h"
#include "common/socket.h"
#include "dtrain/error.h"
#include "dtrain/process_group.h"
#include "dtrain/torch/safetensors.h"

namespace dtrain {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using net::Fd;

namespace {

constexpr const char* kFormat = "dtrain-checkpoint";
constexpr int kVersion = 1;
constexpr const char* kManifest = "manifest.json";
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kRngFile = "rng.safetensors";
constexpr const char* kRngTensor = "torch.cpu_generator";
constexpr int64_t kNone = -1;       // load: DIR holds no checkpoint
constexpr int64_t kAllBroken = -2;  // load: DIR holds checkpoints, none verifies

// A checkpoint that fails verification: skipped at load in favour of an older one.
class CorruptCheckpoint : public InvalidArgumentError {
 public:
  explicit CorruptCheckpoint(const std::string& m) : InvalidArgumentError(m) {}
};

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string errno_text(int err) { return fmt::format("{} ({})", std::strerror(err), err); }

std::string hex32(uint32_t v) { return fmt::format("{:08x}", v); }

uint32_t crc_of(const std::string& text) {
  return static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(text.data()), static_cast<uInt>(text.size())));
}

struct FileSum {
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

// Size and CRC-32 of what is on disk; with `sync`, also makes it durable (fsync works on a
// read-only descriptor). Reading back checksums the bytes the file really holds.
FileSum sum_file(const std::string& path, bool sync) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid())
    throw InvalidArgumentError(fmt::format("cannot open {}: {}", path, errno_text(errno)));
  std::vector<unsigned char> buf(size_t{1} << 20);
  FileSum sum;
  uLong crc = crc32(0, nullptr, 0);
  for (;;) {
    ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw InvalidArgumentError(fmt::format("reading {} failed: {}", path, errno_text(errno)));
    if (n == 0) break;
    crc = crc32(crc, buf.data(), static_cast<uInt>(n));
    sum.bytes += static_cast<uint64_t>(n);
  }
  if (sync && ::fsync(fd.get()) != 0)
    throw InvalidArgumentError(fmt::format("fsync of {} failed: {}", path, errno_text(errno)));
  sum.crc = static_cast<uint32_t>(crc);
  return sum;
}

void write_durable(const std::string& path, const std::string& text) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid())
    throw InvalidArgumentError(fmt::format("cannot create {}: {}", path, errno_text(errno)));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw InvalidArgumentError(fmt::format("writing {} failed: {}", path, errno_text(errno)));
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0)
    throw InvalidArgumentError(fmt::format("fsync of {} failed: {}", path, errno_text(errno)));
}

// A rename is durable once the directory holding the name is.
void fsync_dir(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid() || ::fsync(fd.get()) != 0)
    throw InvalidArgumentError(
        fmt::format("fsync of directory {} failed: {}", dir, errno_text(errno)));
}

std::string read_text(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid())
    throw InvalidArgumentError(fmt::format("cannot open {}: {}", path, errno_text(errno)));
  std::string text;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw InvalidArgumentError(fmt::format("reading {} failed: {}", path, errno_text(errno)));
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

std::string step_name(int64_t step) { return fmt::format("step-{:06d}", step); }

// Steps of DIR's checkpoints (directories named step-<digits>), newest first.
std::vector<int64_t> list_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= 5 || name.compare(0, 5, "step-") != 0) continue;
    if (!std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    if (name.size() > 5 + 18) continue;
    if (e.is_directory(ec)) steps.push_back(std::stoll(name.substr(5)));
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

// Temporary directories of saves that never finished (their writer was killed), and directories
// set aside while replacing a checkpoint of the same step. Not ours: ours may be in progress.
void remove_stale_temporaries(const std::string& dir) {
  const std::string mine = fmt::format("-{}", ::getpid());
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".step-", 0) != 0) continue;
    const bool temp =
        name.find(".tmp-") != std::string::npos || name.find(".old-") != std::string::npos;
    const bool ours = name.size() >= mine.size() &&
                      name.compare(name.size() - mine.size(), mine.size(), mine) == 0;
    if (!temp || ours) continue;
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (rm) {
      DTRAIN_LOG_WARN("checkpoint: cannot remove the unfinished save {}: {}", e.path().string(),
                      rm.message());
    } else {
      DTRAIN_LOG_INFO("checkpoint: removed {}, left by a save that did not finish",
                      e.path().string());
    }
  }
}

std::string demangled(const std::type_info& type) {
  int status = 0;
  char* name = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string out = status == 0 && name != nullptr ? name : type.name();
  std::free(name);
  return out;
}

std::string param_key(const at::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

at::Tensor snapshot(const at::Tensor& t) {
  return t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
}

// Copies tensors into the buffers of the previous snapshot where they fit: a save then costs a
// memcpy, not fresh pages (page faults are most of a large first copy's time).
class Copier {
 public:
  explicit Copier(std::map<std::string, at::Tensor> spare) : spare_(std::move(spare)) {}
  at::Tensor operator()(const std::string& name, const at::Tensor& t) {
    auto node = spare_.extract(name);
    if (!node.empty() && node.mapped().sizes() == t.sizes() &&
        node.mapped().scalar_type() == t.scalar_type()) {
      node.mapped().copy_(t.detach());
      return node.mapped();
    }
    return snapshot(t);
  }

 private:
  std::map<std::string, at::Tensor> spare_;
};

// ---- optimizer state ----------------------------------------------------------------------

enum class OptimizerType { kSgd, kAdam, kAdamW };

OptimizerType optimizer_type(const torch::optim::Optimizer& opt) {
  if (dynamic_cast<const torch::optim::SGD*>(&opt) != nullptr) return OptimizerType::kSgd;
  if (dynamic_cast<const torch::optim::Adam*>(&opt) != nullptr) return OptimizerType::kAdam;
  if (dynamic_cast<const torch::optim::AdamW*>(&opt) != nullptr) return OptimizerType::kAdamW;
  throw InvalidArgumentError(fmt::format(
      "checkpoint: optimizer {} is not supported (SGD, Adam and AdamW are): its state could not be "
      "restored exactly; use one of those or save its state yourself",
      demangled(typeid(opt))));
}

const char* type_name(OptimizerType t) {
  switch (t) {
    case OptimizerType::kSgd:
      return "SGD";
    case OptimizerType::kAdam:
      return "Adam";
    case OptimizerType::kAdamW:
      return "AdamW";
  }
  return "?";
}

template <typename Options>
Json adam_options(const Options& o) {
  return {{"lr", o.lr()},
          {"betas", {std::get<0>(o.betas()), std::get<1>(o.betas())}},
          {"eps", o.eps()},
          {"weight_decay", o.weight_decay()},
          {"amsgrad", o.amsgrad()}};
}

template <typename Options>
void set_adam_options(Options& o, const Json& j) {
  o.lr(j.at("lr").get<double>());
  o.betas(std::make_tuple(j.at("betas").at(0).get<double>(), j.at("betas").at(1).get<double>()));
  o.eps(j.at("eps").get<double>());
  o.weight_decay(j.at("weight_decay").get<double>());
  o.amsgrad(j.at("amsgrad").get<bool>());
}

template <typename State>
void snapshot_adam_state(const State& s, const std::string& prefix, Copier& copy,
                         std::map<std::string, at::Tensor>& out) {
  out[prefix + "step"] = at::tensor(s.step(), at::kLong);
  for (const auto& [key, t] : {std::pair<const char*, const at::Tensor&>{"exp_avg", s.exp_avg()},
                               {"exp_avg_sq", s.exp_avg_sq()},
                               {"max_exp_avg_sq", s.max_exp_avg_sq()}})
    if (t.defined()) out[prefix + key] = copy(prefix + key, t);
}

// Names of the module's parameters by tensor identity (the optimizer holds the same tensors).
std::map<const void*, std::string> parameter_names(const torch::nn::Module& module) {
  std::map<const void*, std::string> names;
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    names[p.value().unsafeGetTensorImpl()] = p.key();
  return names;
}

std::string name_of(const std::map<const void*, std::string>& names, const at::Tensor& p,
                    size_t group, size_t index) {
  auto it = names.find(p.unsafeGetTensorImpl());
  if (it == names.end())
    throw InvalidArgumentError(fmt::format(
        "checkpoint: parameter {} of the optimizer's param group {} (shape {}) is not a parameter "
        "of the module; optimizer state is stored under the module's parameter names, so give the "
        "optimizer the module's parameters",
        index, group, p.sizes().vec()));
  return it->second;
}

// The manifest's "optimizer" entry, and its state tensors under optimizer.<param>.<state>.
Json snapshot_optimizer(const torch::optim::Optimizer& opt, const torch::nn::Module& module,
                        Copier& copy, std::map<std::string, at::Tensor>& tensors) {
  const OptimizerType type = optimizer_type(opt);
  const auto names = parameter_names(module);
  Json groups = Json::array();
  for (size_t g = 0; g < opt.param_groups().size(); ++g) {
    const auto& group = opt.param_groups()[g];
    Json params = Json::array();
    for (size_t i = 0; i < group.params().size(); ++i) {
      const at::Tensor& p = group.params()[i];
      const std::string name = name_of(names, p, g, i);
      params.push_back(name);
      auto it = opt.state().find(param_key(p));
      if (it == opt.state().end()) continue;  // no step taken with it yet
      const std::string prefix = "optimizer." + name + ".";
      if (type == OptimizerType::kSgd) {
        const auto& s = static_cast<const torch::optim::SGDParamState&>(*it->second);
        if (s.momentum_buffer().defined())
          tensors[prefix + "momentum_buffer"] =
              copy(prefix + "momentum_buffer", s.momentum_buffer());
      } else if (type == OptimizerType::kAdam) {
        snapshot_adam_state(static_cast<const torch::optim::AdamParamState&>(*it->second), prefix,
                            copy, tensors);
      } else {
        snapshot_adam_state(static_cast<const torch::optim::AdamWParamState&>(*it->second), prefix,
                            copy, tensors);
      }
    }
    Json options;
    if (type == OptimizerType::kSgd) {
      const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
      options = {{"lr", o.lr()},
                 {"momentum", o.momentum()},
                 {"dampening", o.dampening()},
                 {"weight_decay", o.weight_decay()},
                 {"nesterov", o.nesterov()}};
    } else if (type == OptimizerType::kAdam) {
      options = adam_options(static_cast<const torch::optim::AdamOptions&>(group.options()));
    } else {
      options = adam_options(static_cast<const torch::optim::AdamWOptions&>(group.options()));
    }
    groups.push_back({{"params", params}, {"options", options}});
  }
  return {{"type", type_name(type)}, {"param_groups", groups}};
}

template <typename State>
std::unique_ptr<torch::optim::OptimizerParamState> adam_state(
    const std::string& prefix, std::map<std::string, at::Tensor>& file, const at::Tensor& p) {
  auto take = [&](const std::string& key) {
    auto node = file.extract(prefix + key);
    return node.empty() ? at::Tensor() : node.mapped().to(p.device());
  };
  at::Tensor step = take("step");
  at::Tensor exp_avg = take("exp_avg"), exp_avg_sq = take("exp_avg_sq"),
             max_sq = take("max_exp_avg_sq");
  if (!step.defined() && !exp_avg.defined()) return nullptr;
  if (!step.defined() || !exp_avg.defined() || !exp_avg_sq.defined())
    throw InvalidArgumentError(
        fmt::format("checkpoint: the optimizer state of '{}' is incomplete (needs step, exp_avg "
                    "and exp_avg_sq)",
                    prefix.substr(10, prefix.size() - 11)));
  auto s = std::make_unique<State>();
  s->step(step.item<int64_t>());
  s->exp_avg(exp_avg);
  s->exp_avg_sq(exp_avg_sq);
  if (max_sq.defined()) s->max_exp_avg_sq(max_sq);
  return s;
}

void restore_optimizer(const Json& entry, std::map<std::string, at::Tensor> file,
                       torch::optim::Optimizer& opt, const torch::nn::Module& module,
                       const std::string& path) {
  const OptimizerType type = optimizer_type(opt);
  const std::string saved_type = entry.at("type").get<std::string>();
  if (saved_type != type_name(type))
    throw InvalidArgumentError(fmt::format(
        "checkpoint {} holds the state of a {} optimizer, but the optimizer to restore is {}; "
        "resume with the optimizer the run was started with",
        path, saved_type, type_name(type)));
  const Json& groups = entry.at("param_groups");
  if (groups.size() != opt.param_groups().size())
    throw InvalidArgumentError(
        fmt::format("checkpoint {} holds {} optimizer param groups, the optimizer has {}", path,
                    groups.size(), opt.param_groups().size()));
  const auto names = parameter_names(module);
  for (size_t g = 0; g < groups.size(); ++g) {
    auto& group = opt.param_groups()[g];
    std::vector<std::string> mine;
    for (size_t i = 0; i < group.params().size(); ++i)
      mine.push_back(name_of(names, group.params()[i], g, i));
    auto saved = groups[g].at("params").get<std::vector<std::string>>();
    if (saved != mine)
      throw InvalidArgumentError(
          fmt::format("checkpoint {}: optimizer param group {} held parameters [{}], the optimizer "
                      "now has [{}]",
                      path, g, fmt::join(saved, ", "), fmt::join(mine, ", ")));
    const Json& o = groups[g].at("options");
    if (type == OptimizerType::kSgd) {
      auto& so = static_cast<torch::optim::SGDOptions&>(group.options());
      so.lr(o.at("lr").get<double>());
      so.momentum(o.at("momentum").get<double>());
      so.dampening(o.at("dampening").get<double>());
      so.weight_decay(o.at("weight_decay").get<double>());
      so.nesterov(o.at("nesterov").get<bool>());
    } else if (type == OptimizerType::kAdam) {
      set_adam_options(static_cast<torch::optim::AdamOptions&>(group.options()), o);
    } else {
      set_adam_options(static_cast<torch::optim::AdamWOptions&>(group.options()), o);
    }
    for (size_t i = 0; i < group.params().size(); ++i) {
      const at::Tensor& p = group.params()[i];
      const std::string prefix = "optimizer." + mine[i] + ".";
      std::unique_ptr<torch::optim::OptimizerParamState> state;
      if (type == OptimizerType::kSgd) {
        auto node = file.extract(prefix + "momentum_buffer");
        if (!node.empty()) {
          auto s = std::make_unique<torch::optim::SGDParamState>();
          s->momentum_buffer(node.mapped().to(p.device()));
          state = std::move(s);
        }
      } else if (type == OptimizerType::kAdam) {
        state = adam_state<torch::optim::AdamParamState>(prefix, file, p);
      } else {
        state = adam_state<torch::optim::AdamWParamState>(prefix, file, p);
      }
      if (state) {
        opt.state()[param_key(p)] = std::move(state);
      } else {
        opt.state().erase(param_key(p));  // the parameter had no state yet when saved
      }
    }
  }
  if (!file.empty()) {
    std::vector<std::string> left;
    for (const auto& [name, t] : file) left.push_back(name);
    throw InvalidArgumentError(
        fmt::format("checkpoint {}: optimizer state for tensors the optimizer does not have: [{}]",
                    path, fmt::join(left, ", ")));
  }
}

// ---- the generator -------------------------------------------------------------------------

at::Tensor rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_rng_state(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// ---- the manifest --------------------------------------------------------------------------

// The manifest's own checksum: over its text without the checksum, as written (2-space indent).
std::string manifest_text(Json manifest) {
  manifest.erase("manifest_crc32");
  const uint32_t crc = crc_of(manifest.dump(2));
  manifest["manifest_crc32"] = hex32(crc);
  return manifest.dump(2) + "\n";
}

Json verify_files(const std::string& path, const Json& manifest);

// Checks that `path` is a complete checkpoint: its manifest parses and matches its checksum,
// and every file it lists has the recorded size and CRC-32. Throws CorruptCheckpoint saying
// which file and what was expected and found.
Json verify(const std::string& path) {
  const std::string manifest_path = path + "/" + kManifest;
  std::string text;
  try {
    text = read_text(manifest_path);
  } catch (const std::exception& e) {
    throw CorruptCheckpoint(fmt::format("{}: no readable manifest: {}", path, e.what()));
  }
  Json manifest = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (manifest.is_discarded() || !manifest.is_object())
    throw CorruptCheckpoint(
        fmt::format("{}: {} is not valid JSON ({} bytes; truncated or overwritten)", path,
                    kManifest, text.size()));
  if (!manifest.contains("manifest_crc32") || !manifest["manifest_crc32"].is_string())
    throw CorruptCheckpoint(fmt::format("{}: {} has no manifest_crc32", path, kManifest));
  const std::string recorded = manifest["manifest_crc32"].get<std::string>();
  Json body = manifest;
  body.erase("manifest_crc32");
  const std::string found = hex32(crc_of(body.dump(2)));
  if (found != recorded)
    throw CorruptCheckpoint(
        fmt::format("{}: {} is corrupt: CRC-32 {} expected (recorded in it), {} found", path,
                    kManifest, recorded, found));
  try {
    return verify_files(path, manifest);
  } catch (const nlohmann::json::exception& e) {
    throw CorruptCheckpoint(fmt::format("{}: {} lacks an entry or has one of the wrong type: {}",
                                        path, kManifest, e.what()));
  }
}

Json verify_files(const std::string& path, const Json& manifest) {
  if (manifest.value("format", "") != kFormat || json_integer<int>(manifest, "version", 0) != kVersion)
    throw CorruptCheckpoint(
        fmt::format("{}: {} is not a {} version {} manifest", path, kManifest, kFormat, kVersion));
  const Json& files = manifest.at("files");
  if (!files.contains(kModelFile))
    throw CorruptCheckpoint(fmt::format("{}: the manifest lists no {}", path, kModelFile));
  for (const auto& [name, entry] : files.items()) {
    const std::string file = path + "/" + name;
    const uint64_t bytes = json_integer<uint64_t>(entry.at("bytes"));
    const std::string crc = entry.at("crc32").get<std::string>();
    std::error_code ec;
    const uint64_t size = fs::file_size(file, ec);
    if (ec)
      throw CorruptCheckpoint(
          fmt::format("{}: {} is missing or unreadable ({}); the manifest expects "
                      "{} bytes",
                      path, name, ec.message(), bytes));
    if (size != bytes)
      throw CorruptCheckpoint(fmt::format(
          "{}: {} has {} bytes, the manifest expects {} (truncated?)", path, name, size, bytes));
    FileSum sum;
    try {
      sum = sum_file(file, /*sync=*/false);
    } catch (const std::exception& e) {
      throw CorruptCheckpoint(fmt::format("{}: {}", path, e.what()));
    }
    if (hex32(sum.crc) != crc)
      throw CorruptCheckpoint(
          fmt::format("{}: {} is corrupt: CRC-32 {} expected (manifest), {} found "
                      "over its {} bytes",
                      path, name, crc, hex32(sum.crc), sum.bytes));
  }
  return manifest;
}

TrainingProgress progress_of(const Json& m) {
  TrainingProgress p;
  p.step = json_integer<int64_t>(m.at("step"));
  p.epoch = json_integer<int64_t>(m.at("epoch"));
  p.epoch_consumed = json_integer<int64_t>(m.at("epoch_consumed"));
  p.epoch_size = json_integer<int64_t>(m.at("epoch_size"));
  p.world_size = json_integer<int>(m.at("world_size"));
  for (const auto& [k, v] : m.at("values").items())
    p.values[k] = v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>();
  return p;
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

// Everything a save writes, copied on the training thread.
struct Snapshot {
  std::string dir;
  int64_t step = 0;
  int rank = 0;
  int keep = 3;
  std::map<std::string, at::Tensor> model, optimizer, rng;
  Json manifest;  // without "files" and the checksum
  std::function<void(const std::string&)> after_file;
};

// Puts `tmp` in place as `final`. A checkpoint of the same step may exist (a resumed run saving
// a step again): the two are swapped atomically and the old one removed.
void install(const std::string& tmp, const std::string& final_path, const std::string& dir) {
  if (::rename(tmp.c_str(), final_path.c_str()) == 0) return;
  const int err = errno;
  if (err != ENOTEMPTY && err != EEXIST)
    throw InvalidArgumentError(
        fmt::format("renaming {} to {} failed: {}", tmp, final_path, errno_text(err)));
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) != 0) {
    // A filesystem without RENAME_EXCHANGE: set the old one aside first (names starting with a
    // dot are never taken for checkpoints, and a later writer removes them).
    const std::string aside =
        fmt::format("{}/.{}.old-{}", dir, fs::path(final_path).filename().string(), ::getpid());
    if (::rename(final_path.c_str(), aside.c_str()) != 0 ||
        ::rename(tmp.c_str(), final_path.c_str()) != 0)
      throw InvalidArgumentError(
          fmt::format("replacing {} failed: {}", final_path, errno_text(errno)));
    fs::remove_all(aside);
    return;
  }
  fs::remove_all(tmp);  // now the old checkpoint
}

// Writes the snapshot as DIR/step-N; returns the bytes written.
uint64_t write_snapshot(Snapshot& s) {
  const std::string name = step_name(s.step);
  const std::string tmp = fmt::format("{}/.{}.tmp-{}", s.dir, name, ::getpid());
  const std::string final_path = s.dir + "/" + name;
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec) || ec)
    throw InvalidArgumentError(fmt::format("cannot create {}: {}", tmp, ec.message()));
  try {
    Json files = Json::object();
    uint64_t bytes = 0;
    auto put = [&](const char* file, const std::map<std::string, at::Tensor>& tensors,
                   const std::map<std::string, std::string>& metadata) {
      const std::string path = tmp + "/" + file;
      save_safetensors(path, tensors, metadata);
      FileSum sum = sum_file(path, /*sync=*/true);
      files[file] = {{"bytes", sum.bytes}, {"crc32", hex32(sum.crc)}};
      bytes += sum.bytes;
      if (s.after_file) s.after_file(path);
    };
    put(kModelFile, s.model, {{"format", "pt"}});
    if (s.manifest.contains("optimizer")) put(kOptimizerFile, s.optimizer, {});
    put(kRngFile, s.rng, {});
    s.manifest["files"] = files;
    const std::string text = manifest_text(s.manifest);
    write_durable(tmp + "/" + kManifest, text);
    bytes += text.size();
    fsync_dir(tmp);
    install(tmp, final_path, s.dir);
    fsync_dir(s.dir);
    return bytes;
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

// After writing step `written`: checkpoints of later steps belong to a history training has
// abandoned (it resumed from an earlier state) and go; of the rest the newest `keep` stay, the one
// just written always among them.
void prune(const std::string& dir, int keep, int64_t written) {
  int kept = 0;
  for (int64_t step : list_steps(dir)) {
    if (step <= written && kept < std::max(keep, 1)) {
      ++kept;
      continue;
    }
    std::error_code ec;
    fs::remove_all(checkpoint_path(dir, step), ec);
    if (ec)
      DTRAIN_LOG_WARN("checkpoint: cannot remove the old checkpoint {}: {}",
                      checkpoint_path(dir, step), ec.message());
  }
}

// Loads a verified checkpoint's files into the module, the optimizer and the generator.
void load_files(const std::string& path, Json& manifest, torch::nn::Module& module,
                torch::optim::Optimizer* optimizer) {
  load_module_state(module, path + "/" + kModelFile);
  if (optimizer != nullptr) {
    if (!manifest.contains("optimizer"))
      throw InvalidArgumentError(fmt::format(
          "checkpoint {} holds no optimizer state (it was saved without an optimizer); load it "
          "without one",
          path));
    restore_optimizer(manifest["optimizer"], load_safetensors(path + "/" + kOptimizerFile),
                      *optimizer, module, path);
  }
  auto rng = load_safetensors(path + "/" + kRngFile);
  auto it = rng.find(kRngTensor);
  if (it == rng.end())
    throw InvalidArgumentError(
        fmt::format("checkpoint {}: {} has no {}", path, kRngFile, kRngTensor));
  set_rng_state(it->second);
}

}  // namespace

std::string checkpoint_path(const std::string& dir, int64_t step) {
  return dir + "/" + step_name(step);
}

// ---- the manager ---------------------------------------------------------------------------

struct CheckpointManager::Shared {
  std::mutex mu;  // guards everything below
  std::condition_variable idle;
  bool busy = false;         // a write is in flight
  std::string in_flight;     // its directory, for messages
  std::exception_ptr error;  // the last write's failure, rethrown once
  CheckpointStats stats;
  std::thread writer;  // the write in flight (joined before the next, detached on a hang)
  // The last snapshot's tensors, reused by the next (one copy of the state stays allocated).
  std::map<std::string, at::Tensor> spare_model, spare_optimizer;
};

CheckpointManager::CheckpointManager(CheckpointOptions options, std::shared_ptr<ProcessGroup> group)
    : options_(std::move(options)), group_(std::move(group)), shared_(std::make_shared<Shared>()) {
  rank_ = group_ ? group_->rank() : 0;
  const int world = group_ ? group_->size() : 1;
  if (options_.dir.empty())
    throw InvalidArgumentError(
        fmt::format("rank {}: CheckpointManager: no directory given", rank_));
  if (options_.keep < 1)
    throw InvalidArgumentError(fmt::format(
        "rank {}: CheckpointManager: keep is {}; at least the newest checkpoint must be kept",
        rank_, options_.keep));
  if (options_.writer_rank < 0 || options_.writer_rank >= world)
    throw InvalidArgumentError(
        fmt::format("rank {}: CheckpointManager: writer_rank {} is not a rank of the group of {}",
                    rank_, options_.writer_rank, world));
  if (is_writer()) {
    std::error_code ec;
    fs::create_directories(options_.dir, ec);
    if (ec || !fs::is_directory(options_.dir))
      throw InvalidArgumentError(
          fmt::format("rank {}: cannot create the checkpoint directory {}: {}", rank_, options_.dir,
                      ec ? ec.message() : "not a directory"));
    remove_stale_temporaries(options_.dir);  // one writer per directory: none of them is live
  }
}

CheckpointManager::~CheckpointManager() {
  std::unique_lock<std::mutex> lock(shared_->mu);
  const auto deadline = Deadline::after(options_.write_timeout);
  if (!shared_->idle.wait_until(lock, deadline.at(), [&] { return !shared_->busy; })) {
    DTRAIN_LOG_ERROR(
        "rank {}: checkpoint {} is still being written after {}; giving up on it (the "
        "newest complete checkpoint stays in {})",
        rank_, shared_->in_flight, deadline.describe(), options_.dir);
    shared_->writer.detach();  // it holds `shared_` itself
    return;
  }
  if (shared_->writer.joinable()) shared_->writer.join();
  if (shared_->error) {
    try {
      std::rethrow_exception(shared_->error);
    } catch (const std::exception& e) {
      DTRAIN_LOG_ERROR("rank {}: the last checkpoint write failed: {}", rank_, e.what());
    }
  }
}

bool CheckpointManager::is_writer() const { return rank_ == options_.writer_rank; }
const std::string& CheckpointManager::dir() const { return options_.dir; }

CheckpointStats CheckpointManager::stats() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->stats;
}

void CheckpointManager::wait() {
  std::unique_lock<std::mutex> lock(shared_->mu);
  const auto deadline = Deadline::after(options_.write_timeout);
  if (!shared_->idle.wait_until(lock, deadline.at(), [&] { return !shared_->busy; }))
    throw TimeoutError(fmt::format(
        "rank {}: checkpoint {} is still being written after {}; the filesystem of {} is stuck or "
        "too slow for this checkpoint frequency: check it, checkpoint less often, or raise "
        "CheckpointOptions::write_timeout",
        rank_, shared_->in_flight, deadline.describe(), options_.dir));
  if (shared_->writer.joinable()) shared_->writer.join();
  if (shared_->error) {
    auto error = std::exchange(shared_->error, nullptr);
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      throw InvalidArgumentError(fmt::format("rank {}: writing a checkpoint in {} failed: {}",
                                             rank_, options_.dir, e.what()));
    }
  }
}

void CheckpointManager::save(const torch::nn::Module& module,
                             const torch::optim::Optimizer* optimizer, TrainingProgress progress) {
  if (!is_writer()) return;
  if (progress.step < 0)
    throw InvalidArgumentError(
        fmt::format("rank {}: checkpoint: step {} is negative", rank_, progress.step));
  const auto blocked_start = Clock::now();
  wait();  // the previous write; rethrows its failure
  const double blocked_ms = ms_since(blocked_start);

  const auto snap_start = Clock::now();
  auto snap = std::make_shared<Snapshot>();
  snap->dir = options_.dir;
  snap->step = progress.step;
  snap->rank = rank_;
  snap->keep = options_.keep;
  snap->after_file = options_.after_file;
  std::map<std::string, at::Tensor> spare_model, spare_optimizer;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    spare_model = std::move(shared_->spare_model);
    spare_optimizer = std::move(shared_->spare_optimizer);
  }
  Copier copy_model(std::move(spare_model));
  Copier copy_optimizer(std::move(spare_optimizer));
  {
    c10::NoGradGuard no_grad;
    for (const auto& p : module.named_parameters(/*recurse=*/true))
      snap->model[p.key()] = copy_model(p.key(), p.value());
    for (const auto& b : module.named_buffers(/*recurse=*/true))
      snap->model[b.key()] = copy_model(b.key(), b.value());
  }
  progress.world_size = group_ ? group_->size() : 1;
  Json values = Json::object();
  for (const auto& [k, v] : progress.values) values[k] = v;
  Json& m = snap->manifest;
  m["format"] = kFormat;
  m["version"] = kVersion;
  m["step"] = progress.step;
  m["epoch"] = progress.epoch;
  m["epoch_consumed"] = progress.epoch_consumed;
  m["epoch_size"] = progress.epoch_size;
  m["world_size"] = progress.world_size;
  m["values"] = values;
  if (optimizer != nullptr)
    m["optimizer"] = snapshot_optimizer(*optimizer, module, copy_optimizer, snap->optimizer);
  snap->rng[kRngTensor] = rng_state();
  m["rng"] = {{"torch_cpu_generator", fmt::format("{}:{}", kRngFile, kRngTensor)}};
  m["saved_by"] = {{"rank", rank_}, {"host", hostname()}, {"pid", ::getpid()}};
  m["saved_at"] = utc_now();
  const double snapshot_ms = ms_since(snap_start);

  auto shared = shared_;
  const std::string where = checkpoint_path(options_.dir, progress.step);
  {
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->stats.snapshot_ms = snapshot_ms;
    shared->stats.blocked_ms = blocked_ms;
    shared->stats.total_snapshot_ms += snapshot_ms;
    shared->stats.total_blocked_ms += blocked_ms;
    shared->busy = true;
    shared->in_flight = where;
  }
  auto write = [shared, snap, where]() mutable {
    const auto start = Clock::now();
    std::exception_ptr error;
    uint64_t bytes = 0;
    try {
      bytes = write_snapshot(*snap);
      prune(snap->dir, snap->keep, snap->step);
    } catch (...) {
      error = std::current_exception();
    }
    const double write_ms = ms_since(start);
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        DTRAIN_LOG_ERROR("rank {}: writing checkpoint {} failed after {:.0f} ms: {}", snap->rank,
                         where, write_ms, e.what());
      }
    } else {
      DTRAIN_LOG_DEBUG("checkpoint {} written: {} bytes in {:.1f} ms", where, bytes, write_ms);
    }
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->spare_model = std::move(snap->model);
    shared->spare_optimizer = std::move(snap->optimizer);
    snap.reset();
    if (!error) {
      shared->stats.saves += 1;
      shared->stats.write_ms = write_ms;
      shared->stats.total_write_ms += write_ms;
      shared->stats.bytes = bytes;
    }
    shared->error = error;
    shared->busy = false;
    shared->idle.notify_all();
  };
  if (options_.async) {
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->writer = std::thread(std::move(write));
  } else {
    write();
    wait();  // rethrows a failure here
  }
}

std::optional<LoadedCheckpoint> CheckpointManager::load_latest(torch::nn::Module& module,
                                                               torch::optim::Optimizer* optimizer) {
  wait();  // never read our own write in flight
  const int world = group_ ? group_->size() : 1;
  LoadedCheckpoint loaded;
  Json manifest;
  int64_t chosen = kNone;
  std::vector<int64_t> steps;
  if (is_writer()) {
    remove_stale_temporaries(options_.dir);
    steps = list_steps(options_.dir);
    for (int64_t step : steps) {
      try {
        manifest = verify(checkpoint_path(options_.dir, step));
        chosen = step;
        break;
      } catch (const CorruptCheckpoint& e) {
        DTRAIN_LOG_WARN("rank {}: skipping checkpoint: {}; trying the previous one", rank_,
                        e.what());
        loaded.skipped.push_back(e.what());
      }
    }
    if (chosen == kNone && !steps.empty()) chosen = kAllBroken;
  }
  if (group_ && world > 1) {
    std::vector<int64_t> v = {chosen};
    BroadcastOptions o;
    o.root = options_.writer_rank;
    group_->broadcast(TensorView::of(v), o)->wait();
    chosen = v[0];
  }
  if (chosen == kNone) return std::nullopt;
  if (chosen == kAllBroken) {
    if (is_writer())
      throw InvalidArgumentError(fmt::format(
          "rank {}: none of the {} checkpoints in {} is usable: {}. Move them away to start from "
          "the beginning, or restore one from a backup",
          rank_, steps.size(), options_.dir, fmt::join(loaded.skipped, "; ")));
    throw InvalidArgumentError(fmt::format(
        "rank {}: rank {} found no usable checkpoint in {} (its log says why each was skipped)",
        rank_, options_.writer_rank, options_.dir));
  }

  loaded.path = checkpoint_path(options_.dir, chosen);
  std::string failure;
  try {
    if (!is_writer()) {
      try {
        manifest = verify(loaded.path);
      } catch (const CorruptCheckpoint& e) {
        throw InvalidArgumentError(fmt::format(
            "{} (rank {} verified it: checkpoints are written by rank {} only, so {} must be on a "
            "filesystem every rank sees)",
            e.what(), options_.writer_rank, options_.writer_rank, options_.dir));
      }
    }
    loaded.progress = progress_of(manifest);
    load_files(loaded.path, manifest, module, optimizer);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  // Every rank learns who failed, so none goes on training alone.
  std::vector<int> failed;
  if (group_ && world > 1) {
    std::vector<int32_t> status(static_cast<size_t>(world), 0);
    status[static_cast<size_t>(rank_)] = failure.empty() ? 0 : 1;
    group_->allreduce(TensorView::of(status))->wait();
    for (int r = 0; r < world; ++r)
      if (status[static_cast<size_t>(r)] != 0) failed.push_back(r);
  }
  if (!failure.empty())
    throw InvalidArgumentError(
        fmt::format("rank {}: loading checkpoint {} failed: {}", rank_, loaded.path, failure));
  if (!failed.empty())
    throw InvalidArgumentError(
        fmt::format("rank {}: rank(s) [{}] could not load checkpoint {} (their errors say why); no "
                    "rank resumes",
                    rank_, fmt::join(failed, ", "), loaded.path));
  if (is_writer()) {  // once per job; the other ranks at debug level
    DTRAIN_LOG_INFO(
        "loaded checkpoint {} (step {}, epoch {}, {} samples of the epoch done, saved "
        "at world size {})",
        loaded.path, loaded.progress.step, loaded.progress.epoch, loaded.progress.epoch_consumed,
        loaded.progress.world_size);
  } else {
    DTRAIN_LOG_DEBUG("rank {}: loaded checkpoint {}", rank_, loaded.path);
  }
  return loaded;
}

CheckpointManager::Found CheckpointManager::find_latest() {
  wait();  // never read our own write in flight
  Found found;
  verified_path_.clear();
  verified_manifest_.clear();
  if (is_writer()) remove_stale_temporaries(options_.dir);
  const std::vector<int64_t> steps = list_steps(options_.dir);
  found.count = steps.size();
  for (int64_t step : steps) {
    const std::string path = checkpoint_path(options_.dir, step);
    try {
      Json manifest = verify(path);
      LoadedCheckpoint c;
      c.path = path;
      c.progress = progress_of(manifest);
      c.skipped = found.skipped;
      found.newest = std::move(c);
      verified_path_ = path;
      verified_manifest_ = manifest.dump();
      break;
    } catch (const CorruptCheckpoint& e) {
      DTRAIN_LOG_WARN("rank {}: skipping checkpoint: {}; trying the previous one", rank_,
                      e.what());
      found.skipped.push_back(e.what());
    } catch (const nlohmann::json::exception& e) {  // progress_of: a field of the wrong type
      const std::string why = fmt::format("{}: {} has a bad entry: {}", path, kManifest, e.what());
      DTRAIN_LOG_WARN("rank {}: skipping checkpoint: {}; trying the previous one", rank_, why);
      found.skipped.push_back(why);
    }
  }
  return found;
}

LoadedCheckpoint CheckpointManager::load(const std::string& path, torch::nn::Module& module,
                                         torch::optim::Optimizer* optimizer) {
  Json manifest;
  try {
    manifest = path == verified_path_ && !verified_manifest_.empty()
                   ? Json::parse(verified_manifest_)
                   : verify(path);
  } catch (const CorruptCheckpoint& e) {
    throw InvalidArgumentError(fmt::format("rank {}: cannot load {}: {}", rank_, path, e.what()));
  }
  LoadedCheckpoint loaded;
  loaded.path = path;
  try {
    loaded.progress = progress_of(manifest);
    load_files(path, manifest, module, optimizer);
  } catch (const std::exception& e) {
    throw InvalidArgumentError(
        fmt::format("rank {}: loading checkpoint {} failed: {}", rank_, path, e.what()));
  }
  return loaded;
}

}  // namespace dtrain
