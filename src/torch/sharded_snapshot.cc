// Sharded snapshots in memory (what and why in dtrain/torch/sharded_snapshot.h).
//
// A snapshot taken at W ranks is W + 1 blobs: blob q < W holds rank q's pieces (shard_pieces.h),
// blob W the extras (rank 0's buffers and generator). Every rank keeps its own blobs and the
// blobs of the ranks whose neighbour it is. The layout of every blob, which tensors at which
// bytes, follows from the snapshot's description (`meta`, the same on every rank), so only raw
// bytes travel and any member can read any blob.
#include "dtrain/torch/sharded_snapshot.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "common/json_integer.h"
#include "dtrain/error.h"
#include "dtrain/identity.h"
#include "dtrain/torch/sharded_data_parallel.h"
#include "dtrain/torch/tensor_view.h"
#include "torch/broadcast_text.h"
#include "torch/checkpoint_files.h"
#include "torch/optimizer_state.h"
#include "torch/shard_pieces.h"

namespace dtrain {

namespace {

using namespace shard_pieces;
using checkpoint_files::progress_of;

constexpr int kTag = 0x5AF5;     // the point-to-point messages of take() and restore()
constexpr size_t kMaxHeld = 64;  // blobs a rank declares in restore()
constexpr int64_t kAlign = 64;   // every tensor of a blob starts on a cache line
constexpr const char* kRng = "torch.cpu_generator";

struct Entry {
  at::ScalarType dtype;
  int64_t numel, offset;
};
using Layout = std::map<std::string, Entry>;  // key -> where in the blob

int64_t aligned(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

int64_t bytes_of(const Layout& layout) {
  int64_t end = 0;
  for (const auto& [key, e] : layout)
    end = std::max(end,
                   e.offset + aligned(e.numel * static_cast<int64_t>(c10::elementSize(e.dtype))));
  return end;
}

// Blob b of the snapshot `meta` describes (b < world: rank b's pieces; b == world: the extras).
Layout layout_of(const Json& meta, int b) {
  const int world = json_integer<int>(meta.at("world_size"));
  std::map<std::string, std::pair<at::ScalarType, int64_t>> tensors;
  if (b < world) {
    for (const auto& p : meta.at("parameters"))
      for (const auto& piece : p.at("pieces")) {
        if (json_integer<int>(piece.at(0)) != b) continue;
        const auto count = json_integer<int64_t>(piece.at(2));
        const std::string name = p.at("name").get<std::string>();
        tensors[name] = {at::kFloat, count};
        for (const auto& s : p.at("optimizer_states"))
          tensors["optimizer." + name + "." + s.get<std::string>()] = {at::kFloat, count};
      }
  } else {
    for (const auto& buffer : meta.at("buffers"))
      tensors[buffer.at("name").get<std::string>()] = {
          static_cast<at::ScalarType>(json_integer<int>(buffer.at("dtype"))),
          json_integer<int64_t>(buffer.at("numel"))};
    tensors[kRng] = {at::kByte, json_integer<int64_t>(meta.at("rng_bytes"))};
  }
  Layout layout;
  int64_t offset = 0;
  for (const auto& [key, t] : tensors) {
    layout[key] = {t.first, t.second, offset};
    offset += aligned(t.second * static_cast<int64_t>(c10::elementSize(t.first)));
  }
  return layout;
}

// `tensors` packed into `blob` (reused when it has the size).
void pack(const Layout& layout, const std::map<std::string, at::Tensor>& tensors,
          at::Tensor& blob) {
  const int64_t bytes = bytes_of(layout);
  if (!blob.defined() || blob.numel() != bytes) blob = at::empty({bytes}, at::kByte);
  auto* base = static_cast<uint8_t*>(blob.data_ptr());
  for (const auto& [key, e] : layout) {
    const at::Tensor t = tensors.at(key).to(at::kCPU).contiguous();  // a GPU's shards too
    if (t.numel() != e.numel || t.scalar_type() != e.dtype)
      throw InternalError(
          fmt::format("sharded snapshot: '{}' has {} elements of {}, its layout {} of {}", key,
                      t.numel(), c10::toString(t.scalar_type()), e.numel, c10::toString(e.dtype)));
    std::memcpy(base + e.offset, t.data_ptr(), static_cast<size_t>(t.nbytes()));
  }
}

at::Tensor view(const Layout& layout, const at::Tensor& blob, const std::string& key) {
  auto it = layout.find(key);
  if (it == layout.end())
    throw InternalError(fmt::format("sharded snapshot: no '{}' in its blob", key));
  return at::from_blob(static_cast<uint8_t*>(blob.data_ptr()) + it->second.offset,
                       {it->second.numel}, at::TensorOptions().dtype(it->second.dtype));
}

// Where each rank's copy goes: to the rank at its place on the next node (cyclically), or to
// the next rank when every rank is on one node. Ranks are ordered within a node by rank.
std::vector<int> neighbours(const std::vector<int64_t>& nodes) {
  const int n = static_cast<int>(nodes.size());
  std::map<int64_t, std::vector<int>> by_node;
  for (int q = 0; q < n; ++q) by_node[nodes[q]].push_back(q);
  std::vector<int> to(n);
  if (by_node.size() == 1) {
    for (int q = 0; q < n; ++q) to[q] = (q + 1) % n;
    return to;
  }
  std::vector<const std::vector<int>*> order;
  for (const auto& [node, ranks] : by_node) order.push_back(&ranks);
  for (size_t k = 0; k < order.size(); ++k) {
    const auto& next = *order[(k + 1) % order.size()];
    for (size_t j = 0; j < order[k]->size(); ++j) to[(*order[k])[j]] = next[j % next.size()];
  }
  return to;
}

// Waits for every transfer (blob b received, or -1: sent), then rethrows the first failure: a
// dead peer's error, while the transfers with live peers still finish. `done`: the blobs
// received whole.
void wait_all(std::vector<std::pair<int, std::shared_ptr<Work>>>& works, std::set<int>* done) {
  std::exception_ptr first;
  for (auto& [b, w] : works) {
    try {
      w->wait();
      if (done != nullptr && b >= 0) done->insert(b);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

// The copies of a snapshot on their way to and from the neighbours.
struct ShardedSnapshot::Exchange {
  int slot = 0;
  std::vector<std::pair<int, std::shared_ptr<Work>>> works;  // blob received, or -1: sent
  std::map<int, at::Tensor> incoming;                        // blob -> where it is received
  std::future<double> copying;  // this rank's blob being packed (copy_in_background); ms
  std::shared_ptr<ProcessGroup> group;
  int to = -1;                     // the neighbour this rank's blobs go to (-1: none)
  std::vector<at::Tensor> unsent;  // this rank's blobs, sent once copied (wait_copied())
};

struct ShardedSnapshot::Held {
  int64_t sequence = 0;  // 0: holds nothing usable
  int world = 0;
  Json meta;
  std::map<int, at::Tensor> blobs;  // blob index -> bytes; only blobs held whole
};

ShardedSnapshot::ShardedSnapshot(ShardedSnapshotOptions options) : options_(options) {
  node_ = options_.node >= 0 ? options_.node : resolve_identity().node_rank;
  slots_[0] = std::make_unique<Held>();
  slots_[1] = std::make_unique<Held>();
}

ShardedSnapshot::~ShardedSnapshot() { settle(/*rethrow=*/false); }  // the transfers use its memory

int64_t ShardedSnapshot::bytes_held() const {
  int64_t bytes = 0;
  for (const auto& slot : slots_)
    for (const auto& [b, blob] : slot->blobs) bytes += blob.numel();
  return bytes;
}

void ShardedSnapshot::take(ShardedDataParallel& sdp, const torch::optim::Optimizer* optimizer,
                           TrainingProgress progress) {
  const auto started = std::chrono::steady_clock::now();
  ProcessGroup& g = *sdp.group();
  const int rank = g.rank(), n = g.size();
  if (optimizer != nullptr && optimizer->param_groups().size() != 1)
    throw InvalidArgumentError(fmt::format(
        "rank {}: ShardedSnapshot: the optimizer has {} param groups; sharded snapshots hold one",
        rank, optimizer->param_groups().size()));

  // The copies of the previous snapshot, which travelled while training went on.
  settle(/*rethrow=*/true);
  // Every rank's node, and the snapshot's number: above any a member has seen. That every rank
  // came here also says that each holds the previous snapshot's copies whole: if this rank does
  // (`whole_`), that snapshot is held whole everywhere, and counts.
  std::vector<int64_t> mine = {node_, sequence_};
  std::vector<int64_t> all(2 * static_cast<size_t>(n));
  AllgatherOptions ao;
  ao.timeout = options_.timeout;
  ao.async_op = false;
  const auto gathering = std::chrono::steady_clock::now();
  g.allgather(TensorView::of(all), TensorView::of(mine), ao)->wait();
  const double peers_ms = milliseconds_since(gathering);
  std::vector<int64_t> nodes(static_cast<size_t>(n));
  int64_t sequence = 0;
  for (int q = 0; q < n; ++q) {
    nodes[static_cast<size_t>(q)] = all[2 * static_cast<size_t>(q)];
    sequence = std::max(sequence, all[2 * static_cast<size_t>(q) + 1]);
  }
  sequence += 1;
  if (whole_ >= 0) current_ = whole_;
  whole_ = -1;

  // This rank's copy, into the slot that is not the current snapshot (its buffers reused).
  const int into = current_ == 0 ? 1 : 0;
  Held& held = *slots_[into];
  held.sequence = 0;
  std::map<int, at::Tensor> spare = std::move(held.blobs);
  held.blobs.clear();
  auto reuse = [&](int b) {  // the spare buffer of blob b, else any (pack() resizes it)
    auto it = spare.find(b);
    if (it == spare.end()) it = spare.begin();
    if (it == spare.end()) return at::Tensor();
    at::Tensor t = std::move(it->second);
    spare.erase(it);
    return t;
  };

  const auto units = sdp.units();
  const auto shards = sdp.parameters();
  std::map<std::string, at::Tensor> state;
  Json optimizer_json;
  {
    c10::NoGradGuard no_grad;
    if (optimizer != nullptr)
      optimizer_json = optimizer_state::snapshot_optimizer(
          *optimizer, shard_names(shards),
          [](const std::string&, const at::Tensor& t) { return t.detach(); }, state);
  }
  Json buffers = Json::array();
  std::map<std::string, at::Tensor> extras;
  for (const auto& b : sdp.module().named_buffers(true)) {
    buffers.push_back({{"name", b.key()},
                       {"dtype", static_cast<int>(b.value().scalar_type())},
                       {"numel", b.value().numel()},
                       {"shape", b.value().sizes().vec()}});
    if (rank == 0) extras[b.key()] = b.value().detach();
  }
  const at::Tensor rng = checkpoint_files::rng_state();
  if (rank == 0) extras[kRng] = rng;
  progress.world_size = n;
  Json meta = checkpoint_files::progress_json(progress);
  meta["stage"] = sdp.options().stage;
  meta["parameters"] = parameters_entry(units, state, n);
  meta["buffers"] = buffers;
  meta["rng_bytes"] = rng.numel();
  if (optimizer != nullptr)
    meta["optimizer"] = {{"type", optimizer_json.at("type")},
                         {"options", optimizer_json.at("param_groups").at(0).at("options")}};
  held.world = n;
  held.meta = meta;
  // This rank's pieces: packed here, or by a thread while the next forward and backward passes
  // (which only read them) run. Its blob is made here, so that the thread only copies.
  std::future<double> copying;  // its time in ms
  {
    const Layout layout = layout_of(meta, rank);
    at::Tensor blob = reuse(rank);
    if (!blob.defined() || blob.numel() != bytes_of(layout))
      blob = at::empty({bytes_of(layout)}, at::kByte);
    held.blobs[rank] = blob;
    auto copy = [layout, blob, pieces = pieces_of(units, shards, state, rank)]() mutable {
      const auto start = std::chrono::steady_clock::now();
      c10::NoGradGuard no_grad;
      pack(layout, pieces, blob);
      return milliseconds_since(start);
    };
    if (options_.copy_in_background)
      copying = std::async(std::launch::async, std::move(copy));
    else
      stats_.copy_ms = copy();
  }
  if (rank == 0) {
    at::Tensor blob = reuse(n);
    pack(layout_of(meta, n), extras, blob);
    held.blobs[n] = blob;
  }

  // The copies to and from the neighbours.
  const std::vector<int> to = neighbours(nodes);
  std::vector<std::pair<int, std::shared_ptr<Work>>> works;
  RecvOptions ro;
  ro.timeout = options_.timeout;
  SendOptions so;
  so.timeout = options_.timeout;
  std::map<int, at::Tensor> incoming;
  for (int q = 0; q < n; ++q) {
    if (q == rank || to[static_cast<size_t>(q)] != rank) continue;
    for (int b : q == 0 ? std::vector<int>{q, n} : std::vector<int>{q}) {
      at::Tensor blob = reuse(b);
      const int64_t bytes = bytes_of(layout_of(meta, b));
      if (!blob.defined() || blob.numel() != bytes) blob = at::empty({bytes}, at::kByte);
      incoming[b] = blob;
      works.emplace_back(b, g.irecv(view_of(blob), q, kTag, ro));
    }
  }
  auto exchange = std::make_unique<Exchange>();
  exchange->slot = into;
  exchange->works = std::move(works);
  exchange->incoming = std::move(incoming);
  exchange->copying = std::move(copying);
  exchange->group = sdp.group();
  if (const int dst = to[static_cast<size_t>(rank)]; dst != rank) {
    exchange->to = dst;
    for (const auto& [b, blob] : held.blobs) exchange->unsent.push_back(blob);
  }
  // Its own blobs are whole once copied (restore() waits for that): restore() may use them.
  held.sequence = sequence;
  sequence_ = sequence;
  in_flight_ = std::move(exchange);
  finish_copy(/*wait=*/false);
  ++stats_.takes;
  stats_.peers_ms = peers_ms;
  stats_.total_peers_ms += peers_ms;
  stats_.stall_ms = milliseconds_since(started) - peers_ms;
  stats_.total_stall_ms += stats_.stall_ms;
}

void ShardedSnapshot::wait_copied() {
  const auto started = std::chrono::steady_clock::now();
  finish_copy(/*wait=*/true);
  const double ms = milliseconds_since(started);
  stats_.stall_ms += ms;
  stats_.total_stall_ms += ms;
}

void ShardedSnapshot::finish_copy(bool wait) {
  if (Exchange* e = in_flight_.get()) {
    if (e->copying.valid() && wait) stats_.copy_ms = e->copying.get();
    if (!e->copying.valid() && !e->unsent.empty()) {
      SendOptions so;
      so.timeout = options_.timeout;
      const std::vector<at::Tensor> blobs = std::move(e->unsent);
      e->unsent.clear();
      for (const auto& blob : blobs)
        e->works.emplace_back(-1, e->group->isend(view_of(blob), e->to, kTag, so));
    }
  }
}

void ShardedSnapshot::settle(bool rethrow) {
  if (!in_flight_) return;
  std::exception_ptr failed;
  try {
    // This rank's copies go out now if they have not (the neighbour waits for them, at the end
    // of training too); on a group aborted after a failure that fails at once.
    finish_copy(/*wait=*/true);
  } catch (...) {
    failed = std::current_exception();
  }
  const std::unique_ptr<Exchange> exchange = std::move(in_flight_);
  Held& held = *slots_[exchange->slot];
  std::set<int> received;
  try {
    if (exchange->copying.valid()) exchange->copying.get();  // the thread uses the blob
    wait_all(exchange->works, &received);
  } catch (...) {
    if (!failed) failed = std::current_exception();
  }
  for (int b : received) held.blobs[b] = exchange->incoming.at(b);
  if (!failed)
    whole_ = exchange->slot;  // counts at the next take(), once every rank is known to have it
  else if (failed && rethrow)
    std::rethrow_exception(failed);
}

std::optional<TrainingProgress> ShardedSnapshot::restore(ShardedDataParallel& sdp,
                                                         torch::optim::Optimizer* optimizer) {
  ProcessGroup& g = *sdp.group();
  const int rank = g.rank(), m = g.size();
  const auto timeout = options_.timeout;
  settle(/*rethrow=*/false);  // what came of the last copies (from a peer now dead: nothing)

  // What every member holds: (sequence, world, blob, step) per blob.
  std::vector<int64_t> mine(4 * kMaxHeld, 0);
  size_t k = 0;
  for (const auto& slot : slots_) {
    if (slot->sequence == 0) continue;
    for (const auto& [b, blob] : slot->blobs) {
      if (k == kMaxHeld) break;
      mine[4 * k] = slot->sequence;
      mine[4 * k + 1] = slot->world;
      mine[4 * k + 2] = b;
      mine[4 * k + 3] = json_integer<int64_t>(slot->meta.at("step"));
      ++k;
    }
  }
  std::vector<int64_t> all(4 * kMaxHeld * static_cast<size_t>(m));
  AllgatherOptions ao;
  ao.timeout = timeout;
  g.allgather(TensorView::of(all), TensorView::of(mine), ao)->wait();

  struct Candidate {
    int world = 0;
    int64_t step = 0;
    std::map<int, int> holder;  // blob -> the lowest member holding it
  };
  std::map<int64_t, Candidate, std::greater<>> candidates;  // newest first
  for (int j = 0; j < m; ++j)
    for (size_t i = 0; i < kMaxHeld; ++i) {
      const int64_t* d = &all[(static_cast<size_t>(j) * kMaxHeld + i) * 4];
      if (d[0] == 0) continue;
      auto& c = candidates[d[0]];
      c.world = static_cast<int>(d[1]);
      c.step = d[3];
      c.holder.emplace(static_cast<int>(d[2]), j);  // j ascends: the first is the lowest
    }
  const Candidate* chosen = nullptr;
  int64_t sequence = 0;
  for (const auto& [s, c] : candidates)
    if (static_cast<int>(c.holder.size()) == c.world + 1) {
      chosen = &c;
      sequence = s;
      break;
    }
  if (chosen == nullptr && candidates.empty()) return std::nullopt;
  if (chosen == nullptr) {
    const Candidate& newest = candidates.begin()->second;
    std::vector<int> missing;
    for (int q = 0; q < newest.world; ++q)
      if (!newest.holder.count(q)) missing.push_back(q);
    throw DataLossError(fmt::format(
        "rank {}: the members hold no whole snapshot in memory: the newest (step {}, taken at {} "
        "ranks) lacks the shard(s) of rank(s) {} of that world, each lost together with the rank "
        "holding its copy, and no older one is whole; go on from a sharded checkpoint on disk "
        "(ShardedCheckpoint), which keeps what losses of neighbours take from memory",
        rank, newest.step, newest.world, fmt::join(missing, ", ")));
  }
  const int world = chosen->world;
  int here = -1;  // this rank's slot holding the chosen snapshot
  for (int s = 0; s < 2; ++s)
    if (slots_[s]->sequence == sequence) here = s;

  // Its description, from the lowest member holding a blob of it.
  int describer = m;
  for (const auto& [b, j] : chosen->holder) describer = std::min(describer, j);
  const Json meta = Json::parse(
      broadcast_text(g, here >= 0 && rank == describer ? slots_[here]->meta.dump() : std::string(),
                     describer, timeout));

  const std::string what = fmt::format("sharded snapshot of step {}", chosen->step);
  const auto units = sdp.units();
  check_fits(meta.at("parameters"), unit_parameters(units), what);
  if (optimizer != nullptr && !meta.contains("optimizer"))
    throw InvalidArgumentError(
        fmt::format("rank {}: the {} holds no optimizer state (it was taken without an optimizer)",
                    rank, what));
  c10::NoGradGuard no_grad;
  ShardFiller filler(meta.at("parameters"), units, rank, optimizer != nullptr, what);

  // Which blobs each member needs (the extras: all), each sent by its holder to those.
  std::vector<int64_t> need(static_cast<size_t>(world) + 1, 1);
  for (int q = 0; q < world; ++q) need[static_cast<size_t>(q)] = filler.needs(q) ? 1 : 0;
  std::vector<int64_t> needs(need.size() * static_cast<size_t>(m));
  g.allgather(TensorView::of(needs), TensorView::of(need), ao)->wait();
  std::map<int, at::Tensor> blobs;
  std::vector<std::pair<int, std::shared_ptr<Work>>> works;
  RecvOptions ro;
  ro.timeout = timeout;
  SendOptions so;
  so.timeout = timeout;
  for (int b = 0; b <= world; ++b) {
    const int holder = chosen->holder.at(b);
    if (holder == rank) {
      const at::Tensor& blob = slots_[here]->blobs.at(b);
      blobs[b] = blob;
      for (int j = 0; j < m; ++j)
        if (j != rank && needs[static_cast<size_t>(j) * need.size() + static_cast<size_t>(b)])
          works.emplace_back(b, g.isend(view_of(blob), j, kTag, so));
    } else if (need[static_cast<size_t>(b)]) {
      blobs[b] = at::empty({bytes_of(layout_of(meta, b))}, at::kByte);
      works.emplace_back(b, g.irecv(view_of(blobs[b]), holder, kTag, ro));
    }
  }
  wait_all(works, nullptr);

  for (const auto& [b, blob] : blobs) {
    if (b == world) continue;
    const Layout layout = layout_of(meta, b);
    filler.fill(b, [&](const std::string& key, int64_t count) {
      at::Tensor t = view(layout, blob, key);
      if (t.numel() != count)
        throw InternalError(fmt::format("{}: '{}' of rank {} has {} elements, its pieces say {}",
                                        what, key, b, t.numel(), count));
      return t;
    });
  }
  std::vector<at::Tensor> filled;
  std::map<std::string, at::Tensor> state;
  filler.finish(filled, state);
  const auto shards = sdp.parameters();
  for (size_t u = 0; u < shards.size(); ++u) shards[u].detach().copy_(filled[u]);
  if (optimizer != nullptr) {
    const auto names = shard_names(shards);
    optimizer_state::restore_optimizer(
        optimizer_entry(meta.at("optimizer"), *optimizer, names, what), state, *optimizer, names,
        what);
  }
  const Layout extras = layout_of(meta, world);
  for (const auto& b : sdp.module().named_buffers(true)) {
    at::Tensor saved = view(extras, blobs.at(world), b.key());
    if (saved.numel() != b.value().numel() || saved.scalar_type() != b.value().scalar_type())
      throw InvalidArgumentError(
          fmt::format("{}: buffer '{}' does not fit the model's", what, b.key()));
    b.value().detach().copy_(saved.view(b.value().sizes()));
  }
  checkpoint_files::set_rng_state(view(extras, blobs.at(world), kRng).clone());
  sdp.shards_changed();
  current_ = here;
  whole_ = -1;
  sequence_ = std::max(sequence_, sequence);
  TrainingProgress progress = progress_of(meta);
  return progress;
}

}  // namespace dtrain
