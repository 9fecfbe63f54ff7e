// In-memory commits and resuming from the newest state any rank holds (dtrain/torch/commit.h).
//
// Why broadcast rather than every rank reading the files (as CheckpointManager::load_latest
// does): commits live in one node's memory, so only that node's ranks can read them; and the
// newest state may be on any node (a restarted machine has none). One rank loads, the others
// receive it through the process group: model and buffers in one packed broadcast, the optimizer
// state through LibTorch's serialization, then the generator and the progress.
#include "dtrain/torch/commit.h"

#include <mutex>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/env.h"
#include "common/log.h"
#include "dtrain/error.h"
#include "dtrain/process_group.h"
#include "dtrain/torch/broadcast.h"
#include "torch/broadcast_text.h"
#include "torch/checkpoint_files.h"

namespace dtrain {
namespace {

using Json = nlohmann::json;

at::Tensor generator_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

std::vector<int64_t> allreduce(ProcessGroup& group, std::vector<int64_t> v, ReduceOp op,
                               std::chrono::milliseconds timeout) {
  AllreduceOptions o;
  o.op = op;
  o.timeout = timeout;
  group.allreduce(TensorView::of(v), o)->wait();
  return v;
}

}  // namespace

std::optional<CheckpointOptions> commit_options_from_env(const ProcessGroup* group) {
  auto dir = env::raw(env::kCommitDir);
  if (!dir) return std::nullopt;
  const int rank = group != nullptr ? group->rank() : 0;
  const int64_t local = env::get_int(env::kLocalRank).value_or(0);
  if (local < 0 || local > rank)
    throw InvalidArgumentError(fmt::format(
        "rank {}: LOCAL_RANK is {}, which cannot be (0 to the rank); the commit writer of this "
        "node would be rank {}. Set LOCAL_RANK correctly or unset DTRAIN_COMMIT_DIR",
        rank, local, rank - local));
  CheckpointOptions o;
  o.dir = *dir;
  o.keep = 2;  // the newest, and the one before while the newest is being written
  o.writer_rank = rank - static_cast<int>(local);
  return o;
}

std::optional<Resumed> resume_newest(const std::vector<ResumeSource>& sources,
                                     torch::nn::Module& module, torch::optim::Optimizer* optimizer,
                                     ProcessGroup* group, std::chrono::milliseconds timeout) {
  const int rank = group != nullptr ? group->rank() : 0;
  const int world = group != nullptr ? group->size() : 1;
  constexpr int64_t kNothing = -1;

  // What this rank holds: the newest verified state among the sources it writes (a later source
  // wins a tie: list the faster one last).
  int64_t best = kNothing;
  int best_source = -1;
  std::optional<LoadedCheckpoint> best_found;
  std::vector<std::string> broken;  // sources here holding checkpoints of which none verifies
  for (size_t i = 0; i < sources.size(); ++i) {
    CheckpointManager* m = sources[i].manager;
    if (m == nullptr || !m->is_writer()) continue;
    auto found = m->find_latest();
    if (!found.newest) {
      if (found.count > 0)
        broken.push_back(fmt::format("{} ({} {}(s), none usable: {})", m->dir(), found.count,
                                     sources[i].kind, fmt::join(found.skipped, "; ")));
      continue;
    }
    if (found.newest->progress.step >= best) {
      best = found.newest->progress.step;
      best_source = static_cast<int>(i);
      best_found = std::move(found.newest);
    }
  }

  // The newest step anyone holds, and whether any rank found only damaged state.
  int64_t newest = best;
  bool any_broken = !broken.empty();
  if (group != nullptr && world > 1) {
    auto v = allreduce(*group, {best, any_broken ? 1 : 0}, ReduceOp::kMax, timeout);
    newest = v[0];
    any_broken = v[1] != 0;
  }
  if (newest == kNothing) {
    if (!any_broken) return std::nullopt;
    if (!broken.empty())
      throw InvalidArgumentError(fmt::format(
          "rank {}: no usable checkpoint or commit on any rank: {}. Move them away to start from "
          "the beginning, or restore one from a backup",
          rank, fmt::join(broken, "; ")));
    throw InvalidArgumentError(fmt::format(
        "rank {}: no usable checkpoint or commit on any rank; another rank found only damaged "
        "ones (its log says why each was skipped). Move them away to start from the beginning, "
        "or restore one from a backup",
        rank));
  }

  // The lowest rank holding it loads it.
  int root = best == newest ? rank : world;
  if (group != nullptr && world > 1)
    root = static_cast<int>(allreduce(*group, {root}, ReduceOp::kMin, timeout)[0]);

  Resumed resumed;
  resumed.root = root;
  std::string failure;
  if (rank == root) {
    try {
      resumed.checkpoint = sources[static_cast<size_t>(best_source)].manager->load(
          best_found->path, module, optimizer);
      resumed.checkpoint.skipped = best_found->skipped;
      resumed.kind = sources[static_cast<size_t>(best_source)].kind;
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  if (group != nullptr && world > 1) {
    const bool failed =
        allreduce(*group, {failure.empty() ? 0 : 1}, ReduceOp::kMax, timeout)[0] != 0;
    if (failed && rank != root)
      throw InvalidArgumentError(fmt::format(
          "rank {}: rank {} could not load the newest state (step {}; its error says why); no "
          "rank resumes",
          rank, root, newest));
  }
  if (!failure.empty()) throw InvalidArgumentError(failure + "; no rank resumes");
  if (group == nullptr || world == 1) return resumed;

  // Everything else comes from root.
  broadcast_parameters(module, *group, root, timeout);
  if (optimizer != nullptr) broadcast_optimizer_state(*optimizer, *group, root, timeout);
  at::Tensor gen = generator_state();
  broadcast_tensors(*group, {gen}, root, timeout);
  if (rank != root) set_generator_state(gen);
  Json about;
  if (rank == root)
    about = {{"path", resumed.checkpoint.path},
             {"kind", resumed.kind},
             {"progress", checkpoint_files::progress_json(resumed.checkpoint.progress)}};
  about = Json::parse(broadcast_text(*group, rank == root ? about.dump() : "", root, timeout));
  if (rank != root) {
    resumed.checkpoint.path = about.at("path").get<std::string>();
    resumed.kind = about.at("kind").get<std::string>();
    resumed.checkpoint.progress = checkpoint_files::progress_of(about.at("progress"));
  }
  DTRAIN_LOG_DEBUG("rank {}: resumed from {} {} (step {}), loaded by rank {}", rank, resumed.kind,
                   resumed.checkpoint.path, resumed.checkpoint.progress.step, root);
  return resumed;
}

}  // namespace dtrain
