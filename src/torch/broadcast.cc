// Broadcast of tensors (packed into one byte buffer), module state and optimizer state (through
// LibTorch's own serialization, so every optimizer type works).
#include "dtrain/torch/broadcast.h"

#include <algorithm>
#include <functional>
#include <sstream>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize.h>

#include "common/memory_digest.h"
#include "dtrain/error.h"
#include "dtrain/identity.h"
#include "dtrain/torch/tensor_view.h"
#include "torch/broadcast_text.h"

namespace dtrain {

namespace {

// The bytes of a contiguous tensor, as a flat tensor of bytes on its device.
at::Tensor bytes_of(const at::Tensor& contiguous) {
  return contiguous.reshape({-1}).view(at::kByte);
}

// The tensors' bytes, one after the other, in one tensor on `device` (copied where `fill`).
// Torch's copies, not memcpy: the tensors, and the buffer, may be on a GPU.
at::Tensor packed(const std::vector<at::Tensor>& tensors, bool fill, at::Device device) {
  int64_t bytes = 0;
  for (const auto& t : tensors) bytes += static_cast<int64_t>(t.nbytes());
  at::Tensor flat = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device));
  if (!fill) return flat;
  c10::NoGradGuard no_grad;
  int64_t at_byte = 0;
  for (const auto& t : tensors) {
    const auto n = static_cast<int64_t>(t.nbytes());
    flat.narrow(0, at_byte, n).copy_(bytes_of(t.detach().contiguous()));
    at_byte += n;
  }
  return flat;
}

void unpack(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  c10::NoGradGuard no_grad;
  int64_t at_byte = 0;
  for (const auto& t : tensors) {
    const auto n = static_cast<int64_t>(t.nbytes());
    const at::Tensor piece = flat.narrow(0, at_byte, n);
    if (t.is_contiguous()) {
      bytes_of(t.detach()).copy_(piece);  // in place: t's version moves on, as with copy_
    } else {
      at::Tensor dense = at::empty(t.sizes(), t.options().requires_grad(false));
      bytes_of(dense).copy_(piece);
      at::Tensor(t).copy_(dense);
    }
    at_byte += n;
  }
}

// The holders' bytes (`bytes` at `base`, the same on every holder) into every rank's: holder k
// gives the k-th of equal pieces, and an all-gather-v puts them together; one holder broadcasts.
void share_bytes(ProcessGroup& group, void* base, size_t bytes, const std::vector<int>& holders,
                 std::chrono::milliseconds timeout) {
  const int n = group.size(), rank = group.rank();
  const size_t h = holders.size();
  if (h == 1) {
    BroadcastOptions o;
    o.root = holders.front();
    o.timeout = timeout;
    group.broadcast(TensorView::raw(base, bytes), o)->wait();
    return;
  }
  std::vector<size_t> counts(static_cast<size_t>(n), 0);
  size_t mine = 0, my_count = 0;
  for (size_t k = 0; k < h; ++k) {
    const size_t start = bytes * k / h, end = bytes * (k + 1) / h;
    counts[static_cast<size_t>(holders[k])] = end - start;
    if (holders[k] == rank) mine = start, my_count = end - start;
  }
  AllgatherOptions o;
  o.timeout = timeout;
  group
      .allgatherv(TensorView::raw(base, bytes),
                  TensorView::raw(static_cast<uint8_t*>(base) + mine, my_count), counts, o)
      ->wait();
}

void check_holders(const ProcessGroup& group, const std::vector<int>& holders) {
  if (holders.empty() || !std::is_sorted(holders.begin(), holders.end()) ||
      std::adjacent_find(holders.begin(), holders.end()) != holders.end() || holders.front() < 0 ||
      holders.back() >= group.size())
    throw InvalidArgumentError(fmt::format(
        "rank {}: sharing state: the holders must be distinct ranks of this group of {}, in "
        "ascending order; got [{}]",
        group.rank(), group.size(), fmt::join(holders, ", ")));
}

bool holds(const std::vector<int>& holders, int rank) {
  return std::find(holders.begin(), holders.end(), rank) != holders.end();
}

// Whether the holders' pieces beat a handing over from one of them: more than half the ranks
// hold the bytes (the all-gather-v's ring moves (N-1) M/h in all) and the group spans several
// nodes, where the links are the bound. On one node memory is, and a holder's bytes go straight
// to the ranks that lack them (hand_over) without moving through the others.
bool pieces_pay(ProcessGroup& group, const std::vector<int>& holders,
                std::chrono::milliseconds timeout) {
  if (2 * holders.size() <= static_cast<size_t>(group.size())) return false;
  std::vector<int64_t> mine = {resolve_identity().node_rank};
  std::vector<int64_t> nodes(static_cast<size_t>(group.size()));
  AllgatherOptions o;
  o.timeout = timeout;
  group.allgather(TensorView::of(nodes), TensorView::of(mine), o)->wait();
  return std::adjacent_find(nodes.begin(), nodes.end(), std::not_equal_to<>()) != nodes.end();
}

// Every rank's size and digest of its bytes (`digest` over `bytes`; a rank that holds none
// gives its size and an empty digest), all-gathered: three numbers a rank, by rank.
std::vector<int64_t> gather_digests(ProcessGroup& group, const MemoryDigest& digest, int64_t bytes,
                                    std::chrono::milliseconds timeout) {
  const auto value = digest.value();
  std::vector<int64_t> mine = {bytes, value[0], value[1]};
  std::vector<int64_t> all(3 * static_cast<size_t>(group.size()));
  AllgatherOptions o;
  o.timeout = timeout;
  group.allgather(TensorView::of(all), TensorView::of(mine), o)->wait();
  return all;
}

// The holders whose bytes to take: all of them when their sizes and digests (gather_digests)
// agree, else only the first, whose bytes then go to every other rank.
std::vector<int> agreeing(const std::vector<int64_t>& all, const std::vector<int>& holders) {
  const auto first = all.begin() + 3 * static_cast<ptrdiff_t>(holders.at(0));
  for (int r : holders)
    if (!std::equal(first, first + 3, all.begin() + 3 * static_cast<ptrdiff_t>(r)))
      return {holders[0]};
  return holders;
}

// The same, for bytes at `base` on the holders; every rank learns their size.
std::vector<int> agreeing(ProcessGroup& group, const void* base, size_t bytes,
                          const std::vector<int>& holders, std::chrono::milliseconds timeout,
                          size_t* size) {
  MemoryDigest digest;
  const bool holder = holds(holders, group.rank());
  if (holder) digest.add(base, bytes);
  const auto all = gather_digests(group, digest, holder ? static_cast<int64_t>(bytes) : 0, timeout);
  *size = static_cast<size_t>(all.at(3 * static_cast<size_t>(holders.at(0))));
  return agreeing(all, holders);
}

// The tensors' bytes as one stream: their total size, and their digest where `holder`.
int64_t digest_tensors(const std::vector<at::Tensor>& tensors, bool holder, MemoryDigest& digest) {
  int64_t bytes = 0;
  for (const auto& tensor : tensors) {
    if (holder) {
      const at::Tensor t = tensor.to(at::kCPU).contiguous();  // a GPU's tensor, read on the host
      digest.add(t.data_ptr(), t.nbytes());
    }
    bytes += static_cast<int64_t>(tensor.nbytes());
  }
  return bytes;
}

// A tag of its own for hand_over's messages, apart from the small tags programs use.
constexpr int kHandOverTag = 0x5348;  // "SH"

// Each rank outside `from` takes the tensors from one of them (in turn: the k-th such rank from
// from[k % size]), tensor by tensor: on shared memory a large message is one copy, by the
// receiver out of the sender's memory. Ranks in `from` receive nothing.
void hand_over(ProcessGroup& group, const std::vector<at::Tensor>& tensors,
               const std::vector<int>& from, std::chrono::milliseconds timeout) {
  const int rank = group.rank();
  std::vector<std::shared_ptr<Work>> works;
  std::vector<std::pair<at::Tensor, at::Tensor>> into;  // (where a receive lands, the tensor)
  std::vector<at::Tensor> sent;                         // dense copies kept until sent
  size_t lacking = 0;
  for (int r = 0; r < group.size(); ++r) {
    if (holds(from, r)) continue;
    const int giver = from[lacking++ % from.size()];
    if (rank == giver) {
      for (const auto& t : tensors) {
        sent.push_back(t.detach().contiguous());
        works.push_back(group.isend(view_of(sent.back()), r, kHandOverTag, {.timeout = timeout}));
      }
    } else if (rank == r) {
      for (const auto& t : tensors) {
        at::Tensor dense = t.is_contiguous() ? t.detach() : at::empty(t.sizes(), t.options());
        works.push_back(group.irecv(view_of(dense), giver, kHandOverTag, {.timeout = timeout}));
        into.emplace_back(dense, t);
      }
    }
  }
  // Every message ends (or fails, each within the timeout) before the buffers it reads or
  // writes go away.
  std::exception_ptr failed;
  for (auto& w : works) {
    try {
      w->wait();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
  c10::NoGradGuard no_grad;
  for (auto& [dense, t] : into) {
    if (dense.data_ptr() == t.data_ptr())
      t.unsafeGetTensorImpl()->bump_version();  // written in place, as copy_ would have
    else
      at::Tensor(t).copy_(dense);
  }
}

}  // namespace

void broadcast_tensors(ProcessGroup& group, const std::vector<at::Tensor>& tensors, int root,
                       std::chrono::milliseconds timeout) {
  if (group.size() == 1 || tensors.empty()) return;
  // On the tensors' device: a GPU's tensors go through the group's backend as they are.
  at::Tensor flat = packed(tensors, group.rank() == root, tensors.front().device());
  BroadcastOptions o;
  o.root = root;
  o.timeout = timeout;
  group.broadcast(dtrain::view_of(flat), o)->wait();
  if (group.rank() != root) unpack(flat, tensors);
}

void share_tensors(ProcessGroup& group, const std::vector<at::Tensor>& tensors,
                   const std::vector<int>& holders, std::chrono::milliseconds timeout) {
  check_holders(group, holders);
  if (group.size() == 1 || tensors.empty()) return;
  MemoryDigest digest;
  const int64_t bytes = digest_tensors(tensors, holds(holders, group.rank()), digest);
  const auto all = gather_digests(group, digest, bytes, timeout);
  for (int r = 0; r < group.size(); ++r)
    if (all[3 * static_cast<size_t>(r)] != all[3 * static_cast<size_t>(holders[0])])
      throw InvalidArgumentError(fmt::format(
          "rank {}: sharing state from rank {}: its tensors hold {} bytes, rank {}'s {} (the same "
          "model on every rank?)",
          group.rank(), holders[0], all[3 * static_cast<size_t>(holders[0])], r,
          all[3 * static_cast<size_t>(r)]));
  const auto from = agreeing(all, holders);
  // Every rank a holder and all agreeing (the survivors of a failure, at one commit): nothing to
  // send.
  if (from.size() == static_cast<size_t>(group.size())) return;
  if (!pieces_pay(group, from, timeout)) {
    hand_over(group, tensors, from, timeout);
    return;
  }
  // share_bytes moves host memory.
  at::Tensor flat = packed(tensors, holds(from, group.rank()), at::kCPU);
  share_bytes(group, flat.data_ptr(), static_cast<size_t>(flat.numel()), from, timeout);
  if (!holds(from, group.rank())) unpack(flat, tensors);
}

namespace {
std::vector<at::Tensor> parameters_and_buffers(torch::nn::Module& module) {
  std::vector<at::Tensor> tensors;
  for (const auto& p : module.named_parameters(true)) tensors.push_back(p.value());
  for (const auto& b : module.named_buffers(true)) tensors.push_back(b.value());
  return tensors;
}
}  // namespace

void broadcast_parameters(torch::nn::Module& module, ProcessGroup& group, int root,
                          std::chrono::milliseconds timeout) {
  broadcast_tensors(group, parameters_and_buffers(module), root, timeout);
}

void share_parameters(torch::nn::Module& module, ProcessGroup& group,
                      const std::vector<int>& holders, std::chrono::milliseconds timeout) {
  // Data parallelism keeps the parameters equal, not the buffers (each rank's batch norm counts
  // its own batches): the buffers, small, come whole from the first holder.
  std::vector<at::Tensor> parameters, buffers;
  for (const auto& p : module.named_parameters(true)) parameters.push_back(p.value());
  for (const auto& b : module.named_buffers(true)) buffers.push_back(b.value());
  share_tensors(group, parameters, holders, timeout);
  broadcast_tensors(group, buffers, holders.at(0), timeout);
}

namespace {

// The optimizer's own serialization carries the per-parameter state; the groups' options
// (learning rate, momentum...) are added beside it, as LibTorch's load leaves them alone.
std::string serialized(torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive state;
  optimizer.save(state);
  archive.write("state", state);
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    torch::serialize::OutputArchive options;
    optimizer.param_groups()[g].options().serialize(options);
    archive.write(fmt::format("group_{}", g), options);
  }
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void load_serialized(torch::optim::Optimizer& optimizer, const std::string& bytes, int rank,
                     int from) {
  std::istringstream in(bytes);
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    torch::serialize::InputArchive state;
    archive.read("state", state);
    optimizer.load(state);
    for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
      torch::serialize::InputArchive options;
      archive.read(fmt::format("group_{}", g), options);
      optimizer.param_groups()[g].options().serialize(options);
    }
  } catch (const c10::Error& e) {
    throw InvalidArgumentError(fmt::format(
        "rank {}: rank {}'s optimizer state ({} bytes) does not fit this rank's optimizer (same "
        "type over the same parameters on every rank?): {}",
        rank, from, bytes.size(), e.what_without_backtrace()));
  }
}

}  // namespace

void broadcast_optimizer_state(torch::optim::Optimizer& optimizer, ProcessGroup& group, int root,
                               std::chrono::milliseconds timeout) {
  if (group.size() == 1) return;
  const std::string bytes = broadcast_text(
      group, group.rank() == root ? serialized(optimizer) : std::string(), root, timeout);
  if (group.rank() != root) load_serialized(optimizer, bytes, group.rank(), root);
}

void share_optimizer_state(torch::optim::Optimizer& optimizer, ProcessGroup& group,
                           const std::vector<int>& holders, std::chrono::milliseconds timeout) {
  check_holders(group, holders);
  if (group.size() == 1) return;
  std::string bytes = holds(holders, group.rank()) ? serialized(optimizer) : std::string();
  size_t size = 0;
  const auto from = agreeing(group, bytes.data(), bytes.size(), holders, timeout, &size);
  // Every rank a holder and all agreeing (the survivors of a failure, at one commit): nothing to
  // send, nothing to load.
  if (from.size() == static_cast<size_t>(group.size())) return;
  bytes.resize(size);  // where the holders' bytes land on the others
  if (pieces_pay(group, from, timeout)) {
    share_bytes(group, bytes.data(), bytes.size(), from, timeout);
  } else {
    hand_over(group, {at::from_blob(bytes.data(), {static_cast<int64_t>(size)}, at::kByte)}, from,
              timeout);
  }
  if (!holds(from, group.rank())) load_serialized(optimizer, bytes, group.rank(), from[0]);
}

void check_same_parameters(torch::nn::Module& module, ProcessGroup& group,
                           std::chrono::milliseconds timeout) {
  if (group.size() == 1) return;
  std::vector<at::Tensor> tensors;
  for (const auto& p : module.parameters()) tensors.push_back(p.detach().cpu());
  for (const auto& b : module.buffers()) tensors.push_back(b.detach().cpu());
  MemoryDigest digest;
  const auto all = gather_digests(group, digest, digest_tensors(tensors, true, digest), timeout);
  std::vector<int> differ;
  std::vector<std::string> each;
  for (int r = 0; r < group.size(); ++r) {
    const auto at = all.begin() + 3 * r;
    if (!std::equal(at, at + 3, all.begin())) differ.push_back(r);
    each.push_back(fmt::format("{:016x}", static_cast<uint64_t>(at[1])));
  }
  if (!differ.empty())
    throw DataLossError(fmt::format(
        "rank {}: the parameters and buffers of rank(s) {} differ from rank 0's (a digest of "
        "each rank's, in rank order: {}) after they should have been made equal; the transfer of "
        "state lost or changed bytes",
        group.rank(), fmt::join(differ, ", "), fmt::join(each, ", ")));
}

}  // namespace dtrain
