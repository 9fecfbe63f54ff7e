// Checkpoints (format and guarantees in dtrain/torch/checkpoint.h).
//
// Why the steps are in this order: a checkpoint directory is valid only once its manifest, which
// carries every file's size and CRC-32, is in it, and it only gets its final name by a rename
// after everything in it was fsync'ed. So after a crash DIR holds complete checkpoints and at most
// a temporary directory; a checkpoint damaged later (a bad disk, a truncating copy) fails its
// checksums at load and the previous one is used.
#include "dtrain/torch/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "common/deadline.h"
#include "common/json_integer.h"
#include "common/log.h"
#include "dtrain/error.h"
#include "dtrain/process_group.h"
#include "dtrain/torch/safetensors.h"
#include "torch/checkpoint_files.h"
#include "torch/optimizer_state.h"

namespace dtrain {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

using namespace checkpoint_files;
using namespace optimizer_state;

constexpr const char* kFormat = "dtrain-checkpoint";
constexpr int kVersion = 1;
constexpr const char* kManifest = "manifest.json";
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kRngFile = "rng.safetensors";
constexpr const char* kRngTensor = "torch.cpu_generator";
constexpr int64_t kNone = -1;       // load: DIR holds no checkpoint
constexpr int64_t kAllBroken = -2;  // load: DIR holds checkpoints, none verifies

at::Tensor snapshot(const at::Tensor& t) {
  return t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
}

// Copies tensors into the buffers of the previous snapshot where they fit: a save then costs a
// memcpy, not fresh pages (page faults are most of a large first copy's time).
class Copier {
 public:
  // single_thread: a plain memcpy for CPU tensors, where ATen would split a large copy over its
  // threads (the writing thread's copy must leave the training's threads their cores).
  Copier(std::map<std::string, at::Tensor> spare, bool single_thread)
      : spare_(std::move(spare)), single_thread_(single_thread) {}
  at::Tensor operator()(const std::string& name, const at::Tensor& t) {
    auto node = spare_.extract(name);
    at::Tensor into;
    if (!node.empty() && node.mapped().sizes() == t.sizes() &&
        node.mapped().scalar_type() == t.scalar_type())
      into = std::move(node.mapped());
    if (single_thread_ && t.is_cpu() && t.is_contiguous()) {
      if (!into.defined()) into = at::empty(t.sizes(), t.options());
      std::memcpy(into.data_ptr(), t.data_ptr(), t.nbytes());
      return into;
    }
    if (!into.defined()) return snapshot(t);
    into.copy_(t.detach());
    return into;
  }
  // The buffers this copier did not use (for another copier).
  std::map<std::string, at::Tensor> rest() && { return std::move(spare_); }

 private:
  std::map<std::string, at::Tensor> spare_;
  bool single_thread_;
};

// ---- the manifest --------------------------------------------------------------------------

// Checks that `path` is a complete checkpoint: its manifest parses and matches its checksum,
// and every file it lists has the recorded size and CRC-32. Throws CorruptCheckpoint saying
// which file and what was expected and found.
Json verify(const std::string& path) {
  Json manifest = verify_checkpoint(path, kManifest, kFormat, kVersion);
  if (!manifest.at("files").contains(kModelFile))
    throw CorruptCheckpoint(fmt::format("{}: the manifest lists no {}", path, kModelFile));
  return manifest;
}

// Everything a save writes, copied on the training thread (or on the writing thread: the
// `deferred` entries hold the live tensors until then).
struct Snapshot {
  std::string dir;
  int64_t step = 0;
  int rank = 0;
  int keep = 3;
  std::map<std::string, at::Tensor> model, optimizer, rng;
  std::vector<std::string> deferred_model, deferred_optimizer;
  std::map<std::string, at::Tensor> spare_model, spare_optimizer;  // buffers to copy them into
  Json manifest;  // without "files" and the checksum
  std::function<void(const std::string&)> after_file;
};

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
    durable::write_file(tmp + "/" + kManifest, text);
    bytes += text.size();
    install(tmp, final_path, s.dir);  // durable: both directories synced
    return bytes;
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
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
                      *optimizer, parameter_names(module), path);
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
  bool copying = false;      // its tensors are being copied (copy_in_background)
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
  const auto start = Clock::now();
  const auto deadline = Deadline::after(options_.write_timeout);
  const bool idle = shared_->idle.wait_until(lock, deadline.at(), [&] { return !shared_->busy; });
  shared_->stats.total_blocked_ms += ms_since(start);
  if (!idle)
    throw TimeoutError(fmt::format(
        "rank {}: checkpoint {} is still being written after {}; the filesystem of {} is stuck or "
        "too slow for this checkpoint frequency: check it, checkpoint less often, or raise "
        "CheckpointOptions::write_timeout",
        rank_, shared_->in_flight, deadline.describe(), options_.dir));
  if (shared_->writer.joinable()) shared_->writer.join();
  if (shared_->error) {
    // Its kind stays: a full disk is a ResourceExhaustedError, a failed fsync a DataLossError.
    rethrow_with_context(
        std::exchange(shared_->error, nullptr),
        fmt::format("rank {}: writing a checkpoint in {} failed", rank_, options_.dir));
  }
}

void CheckpointManager::wait_copied() {
  std::unique_lock<std::mutex> lock(shared_->mu);
  const auto start = Clock::now();
  const auto deadline = Deadline::after(options_.write_timeout);
  const bool copied =
      shared_->idle.wait_until(lock, deadline.at(), [&] { return !shared_->copying; });
  shared_->stats.total_blocked_ms += ms_since(start);
  if (!copied)
    throw TimeoutError(fmt::format(
        "rank {}: the tensors of checkpoint {} are still being copied after {}; the writing "
        "thread is starved or stuck: check the machine's load, or raise "
        "CheckpointOptions::write_timeout",
        rank_, shared_->in_flight, deadline.describe()));
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
  // In the background, CPU parameters and optimizer state are copied by the writing thread;
  // buffers (which a forward pass may change) and the rest are copied here.
  const bool background = options_.async && options_.copy_in_background;
  Copier copy_model(std::move(spare_model), /*single_thread=*/false);
  Copier copy_optimizer(std::move(spare_optimizer), /*single_thread=*/false);
  auto take = [&](Copier& copy, std::vector<std::string>& deferred, const std::string& name,
                  const at::Tensor& t) {
    if (!background || !t.is_cpu()) return copy(name, t);
    deferred.push_back(name);
    return t.detach();  // the live tensor, until the writing thread copies it
  };
  {
    c10::NoGradGuard no_grad;
    for (const auto& p : module.named_parameters(/*recurse=*/true))
      snap->model[p.key()] = take(copy_model, snap->deferred_model, p.key(), p.value());
    for (const auto& b : module.named_buffers(/*recurse=*/true))
      snap->model[b.key()] = copy_model(b.key(), b.value());
  }
  progress.world_size = group_ ? group_->size() : 1;
  Json& m = snap->manifest;
  m["format"] = kFormat;
  m["version"] = kVersion;
  m.update(progress_json(progress));
  if (optimizer != nullptr)
    m["optimizer"] = snapshot_optimizer(
        *optimizer, parameter_names(module),
        [&](const std::string& name, const at::Tensor& t) {
          return take(copy_optimizer, snap->deferred_optimizer, name, t);
        },
        snap->optimizer);
  snap->spare_model = std::move(copy_model).rest();
  snap->spare_optimizer = std::move(copy_optimizer).rest();
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
    shared->busy = true;
    shared->copying = background;
    shared->in_flight = where;
  }
  auto write = [shared, snap, where]() mutable {
    auto start = Clock::now();
    std::exception_ptr error;
    uint64_t bytes = 0;
    double copy_ms = 0;
    try {
      if (!snap->deferred_model.empty() || !snap->deferred_optimizer.empty()) {
        auto copy_deferred = [](std::map<std::string, at::Tensor>& tensors,
                                const std::vector<std::string>& names,
                                std::map<std::string, at::Tensor> spare) {
          Copier copy(std::move(spare), /*single_thread=*/true);
          for (const auto& name : names) tensors[name] = copy(name, tensors[name]);
        };
        try {
          copy_deferred(snap->model, snap->deferred_model, std::move(snap->spare_model));
          copy_deferred(snap->optimizer, snap->deferred_optimizer,
                        std::move(snap->spare_optimizer));
        } catch (...) {
          // The snapshot may still hold live tensors: drop it before training changes them.
          snap->model.clear();
          snap->optimizer.clear();
          throw;
        }
      }
      copy_ms = ms_since(start);
      {
        std::lock_guard<std::mutex> lock(shared->mu);
        shared->copying = false;
        shared->idle.notify_all();
      }
      start = Clock::now();
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
      shared->stats.copy_ms = copy_ms;
      shared->stats.total_copy_ms += copy_ms;
      shared->stats.write_ms = write_ms;
      shared->stats.total_write_ms += write_ms;
      shared->stats.bytes = bytes;
    }
    shared->error = error;
    shared->copying = false;
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
      throw DataLossError(fmt::format(
          "rank {}: none of the {} checkpoints in {} is usable: {}. Move them away to start from "
          "the beginning, or restore one from a backup",
          rank_, steps.size(), options_.dir, fmt::join(loaded.skipped, "; ")));
    throw DataLossError(fmt::format(
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
      DTRAIN_LOG_WARN("rank {}: skipping checkpoint: {}; trying the previous one", rank_, e.what());
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
