// Sharded checkpoints (format and guarantees in dtrain/torch/sharded_checkpoint.h).
//
// Why pieces of parameters rather than units' flat shards: a flat shard depends on the world
// size (its padding, its bounds) and on how the model was cut into units; a piece, "elements
// [start, start + count) of parameter p", does not. Every rank's file holds the pieces its
// shards overlap, and a loader at any world size, stage or layout copies the elements it needs
// from the pieces that hold them.
#include "dtrain/torch/sharded_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "common/json_integer.h"
#include "common/log.h"
#include "dtrain/error.h"
#include "dtrain/torch/safetensors.h"
#include "dtrain/torch/sharded_data_parallel.h"
#include "torch/checkpoint_files.h"
#include "torch/optimizer_state.h"
#include "torch/shard_pieces.h"

namespace dtrain {

namespace {

using namespace checkpoint_files;
using namespace optimizer_state;
using namespace shard_pieces;
namespace fs = std::filesystem;

constexpr const char* kFormat = "dtrain-sharded-checkpoint";
constexpr int kVersion = 1;
constexpr const char* kManifest = "manifest.json";
constexpr const char* kRngFile = "rng.safetensors";
constexpr const char* kRngTensor = "torch.cpu_generator";
constexpr int64_t kNone = -1;           // load: DIR holds no checkpoint
constexpr int64_t kAllBroken = -2;      // load: DIR holds checkpoints, none verifies
constexpr size_t kMessageBytes = 4096;  // of an error told to every rank

std::string shard_file(int rank, int n) {
  return fmt::format("shard-{:05d}-of-{:05d}.safetensors", rank, n);
}

std::string message_from(ProcessGroup& group, int root, const std::string& mine,
                         std::chrono::milliseconds timeout) {
  std::vector<uint8_t> buf(kMessageBytes, 0);
  if (group.rank() == root)
    std::copy_n(mine.begin(), std::min(mine.size(), kMessageBytes - 1), buf.begin());
  BroadcastOptions o;
  o.root = root;
  o.timeout = timeout;
  group.broadcast(TensorView::of(buf), o)->wait();
  return std::string(reinterpret_cast<const char*>(buf.data()));
}

// Collective: when any rank's `error` is set, every rank throws the first failing rank's text.
void agree(ProcessGroup& group, const std::string& error, std::chrono::milliseconds timeout) {
  std::vector<int64_t> mine = {error.empty() ? 0 : 1};
  std::vector<int64_t> all(static_cast<size_t>(group.size()));
  AllgatherOptions o;
  o.timeout = timeout;
  group.allgather(TensorView::of(all), TensorView::of(mine), o)->wait();
  for (int r = 0; r < group.size(); ++r)
    if (all[static_cast<size_t>(r)] != 0) {
      const std::string text = message_from(group, r, error, timeout);
      if (r == group.rank()) throw InvalidArgumentError(text);
      throw InvalidArgumentError(fmt::format("rank {}: rank {} failed: {}", group.rank(), r, text));
    }
}

Json verify(const std::string& path) {
  return verify_checkpoint(path, kManifest, kFormat, kVersion);
}

// verify() for a caller that gets no older checkpoint instead: the damage is its error.
Json verified(const std::string& path) {
  try {
    return verify(path);
  } catch (const CorruptCheckpoint& e) {
    throw InvalidArgumentError(fmt::format("sharded checkpoint: {}", e.what()));
  }
}

// Reads a checkpoint's pieces: files opened once, on first use.
class Pieces {
 public:
  Pieces(std::string path, const Json& manifest) : path_(std::move(path)), manifest_(manifest) {
    saved_world_ = json_integer<int>(manifest.at("world_size"));
    for (const auto& p : manifest.at("parameters")) entries_[p.at("name").get<std::string>()] = &p;
  }
  const Json* entry(const std::string& name) const {
    auto it = entries_.find(name);
    return it == entries_.end() ? nullptr : it->second;
  }
  const std::map<std::string, const Json*>& entries() const { return entries_; }
  int saved_world() const { return saved_world_; }

  // Copies elements [a, b) of tensor `key` (of parameter `param`'s pieces) into dst (b - a).
  void fill(const at::Tensor& dst, const std::string& param, const std::string& key, int64_t a,
            int64_t b) {
    int64_t filled = 0;
    for (const auto& piece : entries_.at(param)->at("pieces")) {
      const int q = json_integer<int>(piece.at(0));
      const int64_t start = json_integer<int64_t>(piece.at(1)),
                    count = json_integer<int64_t>(piece.at(2));
      const int64_t s = std::max(a, start), e = std::min(b, start + count);
      if (s >= e) continue;
      const at::Tensor& src = tensor(q, key, count);
      dst.narrow(0, s - a, e - s).copy_(src.narrow(0, s - start, e - s));
      filled += e - s;
    }
    if (filled != b - a)
      throw InvalidArgumentError(
          fmt::format("sharded checkpoint {}: the pieces of '{}' cover {} of its elements [{}, {})",
                      path_, key, filled, a, b));
  }

  const at::Tensor& tensor(int q, const std::string& key, int64_t count) {
    if (q < 0 || q >= saved_world_)
      throw InvalidArgumentError(
          fmt::format("sharded checkpoint {}: a piece of '{}' names rank "
                      "{} of {}",
                      path_, key, q, saved_world_));
    auto& file = file_of(q);
    auto it = file.find(key);
    if (it == file.end())
      throw InvalidArgumentError(fmt::format("sharded checkpoint {}: {} has no tensor '{}'", path_,
                                             shard_file(q, saved_world_), key));
    if (count >= 0 && it->second.numel() != count)
      throw InvalidArgumentError(
          fmt::format("sharded checkpoint {}: '{}' in {} has {} elements, the manifest says {}",
                      path_, key, shard_file(q, saved_world_), it->second.numel(), count));
    return it->second;
  }

  std::map<std::string, at::Tensor>& file_of(int q) {
    auto it = files_.find(q);
    if (it == files_.end())
      it = files_.emplace(q, load_safetensors(path_ + "/" + shard_file(q, saved_world_))).first;
    return it->second;
  }

 private:
  std::string path_;
  const Json& manifest_;
  int saved_world_ = 0;
  std::map<std::string, const Json*> entries_;
  std::map<int, std::map<std::string, at::Tensor>> files_;
};

void load_buffers(Pieces& pieces, const Json& manifest, torch::nn::Module& module,
                  const std::string& path) {
  std::map<std::string, at::Tensor> buffers;
  for (const auto& b : module.named_buffers(true)) buffers[b.key()] = b.value();
  c10::NoGradGuard no_grad;
  for (const auto& b : manifest.at("buffers")) {
    const std::string name = b.get<std::string>();
    auto it = buffers.find(name);
    if (it == buffers.end())
      throw InvalidArgumentError(fmt::format(
          "sharded checkpoint {}: buffer '{}' is not a buffer of the model", path, name));
    const at::Tensor& src = pieces.tensor(0, name, -1);
    if (src.sizes() != it->second.sizes())
      throw InvalidArgumentError(
          fmt::format("sharded checkpoint {}: buffer '{}' has shape {}, "
                      "the model's {}",
                      path, name, src.sizes().vec(), it->second.sizes().vec()));
    it->second.copy_(src);
  }
}

void load_rng(const std::string& path) {
  auto rng = load_safetensors(path + "/" + kRngFile);
  auto it = rng.find(kRngTensor);
  if (it == rng.end())
    throw InvalidArgumentError(
        fmt::format("sharded checkpoint {}: {} has no {}", path, kRngFile, kRngTensor));
  set_rng_state(it->second);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

ShardedCheckpoint::ShardedCheckpoint(ShardedCheckpointOptions options,
                                     std::shared_ptr<ProcessGroup> group)
    : options_(std::move(options)), group_(std::move(group)) {
  if (group_ == nullptr) throw InvalidArgumentError("ShardedCheckpoint: the group must be set");
  if (options_.dir.empty()) throw InvalidArgumentError("ShardedCheckpoint: dir must be set");
}

void ShardedCheckpoint::save(ShardedDataParallel& sdp, const torch::optim::Optimizer* optimizer,
                             TrainingProgress progress) {
  ProcessGroup& g = *group_;
  const int rank = g.rank(), n = g.size();
  const auto timeout = options_.timeout;
  if (sdp.group()->size() != n)
    throw InvalidArgumentError(
        fmt::format("rank {}: ShardedCheckpoint: its group has {} ranks, the model's {}", rank, n,
                    sdp.group()->size()));
  if (optimizer != nullptr && optimizer->param_groups().size() != 1)
    throw InvalidArgumentError(fmt::format(
        "rank {}: ShardedCheckpoint: the optimizer has {} param groups; sharded checkpoints hold "
        "one",
        rank, optimizer->param_groups().size()));
  progress.world_size = n;
  const std::string name = step_name(progress.step);
  const std::string final_path = checkpoint_path(options_.dir, progress.step);

  // Rank 0 makes the temporary directory; its name carries rank 0's pid.
  std::string error;
  std::vector<int64_t> pid = {static_cast<int64_t>(::getpid())};
  if (rank == 0) {
    try {
      std::error_code ec;
      fs::create_directories(options_.dir, ec);
      if (ec)
        throw InvalidArgumentError(fmt::format("cannot create {}: {}", options_.dir, ec.message()));
      remove_stale_temporaries(options_.dir);
      const std::string tmp = fmt::format("{}/.{}.tmp-{}", options_.dir, name, pid[0]);
      fs::remove_all(tmp, ec);
      if (!fs::create_directories(tmp, ec) || ec)
        throw InvalidArgumentError(fmt::format("cannot create {}: {}", tmp, ec.message()));
    } catch (const std::exception& e) {
      error = fmt::format("rank 0: saving a sharded checkpoint: {}", e.what());
    }
  }
  agree(g, error, timeout);
  BroadcastOptions bo;
  bo.timeout = timeout;
  g.broadcast(TensorView::of(pid), bo)->wait();
  const std::string tmp = fmt::format("{}/.{}.tmp-{}", options_.dir, name, pid[0]);
  auto abandon = [&] {  // rank 0 removes what a failed save left
    std::error_code ec;
    if (rank == 0) fs::remove_all(tmp, ec);
  };

  // Every rank writes its pieces.
  const auto units = sdp.units();
  const auto shards = sdp.parameters();
  std::map<std::string, at::Tensor> state;
  Json optimizer_json;
  std::vector<int64_t> sum = {0, 0};
  const std::string file = shard_file(rank, n);
  try {
    c10::NoGradGuard no_grad;
    if (optimizer != nullptr)
      optimizer_json = snapshot_optimizer(
          *optimizer, shard_names(shards),
          [](const std::string&, const at::Tensor& t) { return t.detach(); }, state);
    std::map<std::string, at::Tensor> tensors = pieces_of(units, shards, state, rank);
    if (rank == 0)
      for (const auto& b : sdp.module().named_buffers(true))
        tensors[b.key()] = b.value().detach().contiguous();
    const std::string path = tmp + "/" + file;
    save_safetensors(path, tensors);
    const FileSum s = sum_file(path, /*sync=*/true);
    sum = {static_cast<int64_t>(s.bytes), static_cast<int64_t>(s.crc)};
  } catch (const std::exception& e) {
    error = fmt::format("rank {}: writing its shard {} of the sharded checkpoint {} failed: {}",
                        rank, file, final_path, e.what());
  }
  try {
    agree(g, error, timeout);
  } catch (...) {
    abandon();
    throw;
  }
  std::vector<int64_t> sums(2 * static_cast<size_t>(n));
  AllgatherOptions ao;
  ao.timeout = timeout;
  g.allgather(TensorView::of(sums), TensorView::of(sum), ao)->wait();

  // Rank 0: the generator, the manifest, the rename.
  if (rank == 0) {
    try {
      Json files = Json::object();
      for (int q = 0; q < n; ++q)
        files[shard_file(q, n)] = {{"bytes", sums[2 * q]},
                                   {"crc32", hex32(static_cast<uint32_t>(sums[2 * q + 1]))}};
      save_safetensors(tmp + "/" + kRngFile, {{kRngTensor, rng_state()}});
      const FileSum rng = sum_file(tmp + "/" + kRngFile, /*sync=*/true);
      files[kRngFile] = {{"bytes", rng.bytes}, {"crc32", hex32(rng.crc)}};

      const Json parameters = parameters_entry(units, state, n);
      Json buffers = Json::array();
      for (const auto& b : sdp.module().named_buffers(true)) buffers.push_back(b.key());
      Json m = {{"format", kFormat}, {"version", kVersion}};
      m.update(progress_json(progress));  // progress.world_size is n
      m["stage"] = sdp.options().stage;
      m["saved_at"] = utc_now();
      m["saved_by"] = {{"rank", 0}, {"host", hostname()}, {"pid", ::getpid()}};
      m["parameters"] = parameters;
      m["buffers"] = buffers;
      if (optimizer != nullptr)
        m["optimizer"] = {{"type", optimizer_json.at("type")},
                          {"options", optimizer_json.at("param_groups").at(0).at("options")}};
      m["files"] = files;
      durable::write_file(tmp + "/" + kManifest, manifest_text(m));
      install(tmp, final_path, options_.dir);  // durable: both directories synced
      prune(options_.dir, options_.keep, progress.step);
    } catch (const std::exception& e) {
      error = fmt::format("rank 0: finishing the sharded checkpoint {} failed: {}", final_path,
                          e.what());
      abandon();
    }
  }
  agree(g, error, timeout);
}

std::optional<LoadedCheckpoint> ShardedCheckpoint::load_latest(ShardedDataParallel& sdp,
                                                               torch::optim::Optimizer* optimizer) {
  ProcessGroup& g = *group_;
  const int rank = g.rank();
  const auto timeout = options_.timeout;
  // Rank 0 picks: the newest checkpoint that verifies.
  std::vector<int64_t> chosen = {kNone};
  std::vector<std::string> skipped;
  if (rank == 0) {
    const auto steps = list_steps(options_.dir);
    for (int64_t step : steps) {
      try {
        verify(checkpoint_path(options_.dir, step));
        chosen[0] = step;
        break;
      } catch (const CorruptCheckpoint& e) {
        DTRAIN_LOG_WARN("sharded checkpoint: skipping {}", e.what());
        skipped.push_back(e.what());
      }
    }
    if (chosen[0] == kNone && !steps.empty()) chosen[0] = kAllBroken;
  }
  BroadcastOptions bo;
  bo.timeout = timeout;
  g.broadcast(TensorView::of(chosen), bo)->wait();
  if (chosen[0] == kNone) return std::nullopt;
  if (chosen[0] == kAllBroken) {
    const std::string why =
        message_from(g, 0, fmt::format("{}", fmt::join(skipped, "; ")), timeout);
    throw InvalidArgumentError(fmt::format(
        "rank {}: no checkpoint in {} verifies ({}); remove the damaged ones or start afresh", rank,
        options_.dir, why));
  }

  LoadedCheckpoint loaded;
  loaded.path = checkpoint_path(options_.dir, chosen[0]);
  loaded.skipped = skipped;
  std::string error;
  try {
    const std::string& path = loaded.path;
    Json manifest = read_manifest(path, kManifest);
    Pieces pieces(path, manifest);
    const auto units = sdp.units();
    const auto shards = sdp.parameters();
    const std::string what = "sharded checkpoint " + path;
    check_fits(manifest.at("parameters"), unit_parameters(units), what);
    const bool with_optimizer = optimizer != nullptr;
    if (with_optimizer && !manifest.contains("optimizer"))
      throw InvalidArgumentError(fmt::format(
          "sharded checkpoint {} holds no optimizer state (it was saved without an optimizer); "
          "load it without one",
          path));
    c10::NoGradGuard no_grad;
    ShardFiller filler(manifest.at("parameters"), units, rank, with_optimizer, what);
    for (int q = 0; q < pieces.saved_world(); ++q)  // only the files this rank needs are read
      if (filler.needs(q))
        filler.fill(q, [&](const std::string& key, int64_t count) -> at::Tensor {
          return pieces.tensor(q, key, count);
        });
    std::vector<at::Tensor> filled;
    std::map<std::string, at::Tensor> state;
    filler.finish(filled, state);
    for (size_t u = 0; u < shards.size(); ++u) shards[u].detach().copy_(filled[u]);
    if (with_optimizer) {
      const auto names = shard_names(shards);
      restore_optimizer(optimizer_entry(manifest.at("optimizer"), *optimizer, names, what), state,
                        *optimizer, names, path);
    }
    load_buffers(pieces, manifest, sdp.module(), path);
    load_rng(path);
    loaded.progress = progress_of(manifest);
  } catch (const std::exception& e) {
    error = fmt::format("rank {}: loading the sharded checkpoint {} failed: {}", rank, loaded.path,
                        e.what());
  }
  agree(g, error, timeout);
  sdp.shards_changed();
  return loaded;
}

LoadedCheckpoint load_sharded_checkpoint(const std::string& path, torch::nn::Module& module,
                                         torch::optim::Optimizer* optimizer) {
  const Json manifest = verified(path);
  Pieces pieces(path, manifest);
  std::vector<std::pair<std::string, std::vector<int64_t>>> model;
  for (const auto& p : module.named_parameters(true))
    model.emplace_back(p.key(), p.value().sizes().vec());
  check_fits(manifest.at("parameters"), model, "sharded checkpoint " + path);
  c10::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> state;
  for (const auto& p : module.named_parameters(true)) {
    const int64_t numel = p.value().numel();
    at::Tensor full = at::empty({numel}, at::kFloat);
    pieces.fill(full, p.key(), p.key(), 0, numel);
    p.value().detach().copy_(full.view(p.value().sizes()));
    const Json& e = *pieces.entry(p.key());
    if (optimizer == nullptr || e.at("optimizer_step").is_null()) continue;
    const std::string prefix = "optimizer." + p.key() + ".";
    state[prefix + "step"] = at::tensor(json_integer<int64_t>(e.at("optimizer_step")), at::kLong);
    for (const auto& s : e.at("optimizer_states")) {
      at::Tensor t = at::empty({numel}, at::kFloat);
      pieces.fill(t, p.key(), prefix + s.get<std::string>(), 0, numel);
      state[prefix + s.get<std::string>()] = t.view(p.value().sizes());
    }
  }
  if (optimizer != nullptr) {
    if (!manifest.contains("optimizer"))
      throw InvalidArgumentError(fmt::format(
          "sharded checkpoint {} holds no optimizer state (it was saved without an optimizer); "
          "load it without one",
          path));
    const auto names = parameter_names(module);
    restore_optimizer(
        optimizer_entry(manifest.at("optimizer"), *optimizer, names, "sharded checkpoint " + path),
        state, *optimizer, names, path);
  }
  load_buffers(pieces, manifest, module, path);
  load_rng(path);
  LoadedCheckpoint loaded;
  loaded.path = path;
  loaded.progress = progress_of(manifest);
  return loaded;
}

void export_sharded_checkpoint(const std::string& path, const std::string& safetensors_file) {
  const Json manifest = verified(path);
  Pieces pieces(path, manifest);
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [name, e] : pieces.entries()) {
    const auto shape = e->at("shape").get<std::vector<int64_t>>();
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    at::Tensor full = at::empty({numel}, at::kFloat);
    pieces.fill(full, name, name, 0, numel);
    tensors[name] = full.view(shape);
  }
  for (const auto& b : manifest.at("buffers")) {
    const std::string name = b.get<std::string>();
    tensors[name] = pieces.tensor(0, name, -1);
  }
  save_safetensors(safetensors_file, tensors, {{"format", "pt"}});
}

std::optional<std::string> latest_sharded_checkpoint(const std::string& dir) {
  for (int64_t step : list_steps(dir)) {
    try {
      verify(checkpoint_path(dir, step));
      return checkpoint_path(dir, step);
    } catch (const CorruptCheckpoint& e) {
      DTRAIN_LOG_WARN("sharded checkpoint: skipping {}", e.what());
    }
  }
  return std::nullopt;
}

}  // namespace dtrain
