// Broadcast of tensors (packed into one byte buffer), module state and optimizer state (through
// LibTorch's own serialization, so every optimizer type works).
#include "dtrain/torch/broadcast.h"

#include <cstring>
#include <sstream>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize.h>

#include "common/durable.h"
#include "dtrain/error.h"
#include "dtrain/torch/tensor_view.h"

namespace dtrain {

void broadcast_tensors(ProcessGroup& group, const std::vector<at::Tensor>& tensors, int root,
                       std::chrono::milliseconds timeout) {
  if (group.size() == 1 || tensors.empty()) return;
  int64_t bytes = 0;
  for (const auto& t : tensors) bytes += static_cast<int64_t>(t.nbytes());
  at::Tensor flat = at::empty({bytes}, at::kByte);
  auto* base = static_cast<uint8_t*>(flat.data_ptr());
  if (group.rank() == root) {
    int64_t at_byte = 0;
    for (const auto& t : tensors) {
      at::Tensor c = t.detach().contiguous();
      std::memcpy(base + at_byte, c.data_ptr(), c.nbytes());
      at_byte += static_cast<int64_t>(c.nbytes());
    }
  }
  BroadcastOptions o;
  o.root = root;
  o.timeout = timeout;
  group.broadcast(dtrain::view_of(flat), o)->wait();
  if (group.rank() == root) return;
  c10::NoGradGuard no_grad;
  int64_t at_byte = 0;
  for (const auto& t : tensors) {
    at::Tensor src = at::from_blob(base + at_byte, t.sizes(), t.options().requires_grad(false));
    at::Tensor(t).copy_(src);
    at_byte += static_cast<int64_t>(t.nbytes());
  }
}

void broadcast_parameters(torch::nn::Module& module, ProcessGroup& group, int root,
                          std::chrono::milliseconds timeout) {
  std::vector<at::Tensor> tensors;
  for (const auto& p : module.named_parameters(true)) tensors.push_back(p.value());
  for (const auto& b : module.named_buffers(true)) tensors.push_back(b.value());
  broadcast_tensors(group, tensors, root, timeout);
}

void broadcast_optimizer_state(torch::optim::Optimizer& optimizer, ProcessGroup& group, int root,
                               std::chrono::milliseconds timeout) {
  if (group.size() == 1) return;
  std::string bytes;
  if (group.rank() == root) {
    // The optimizer's own serialization carries the per-parameter state; the groups' options
    // (learning rate, momentum...) are added beside it, as LibTorch's load leaves them alone.
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
    bytes = out.str();
  }
  std::vector<int64_t> size = {static_cast<int64_t>(bytes.size())};
  BroadcastOptions o;
  o.root = root;
  o.timeout = timeout;
  group.broadcast(TensorView::of(size), o)->wait();
  bytes.resize(static_cast<size_t>(size[0]));
  group.broadcast(TensorView::raw(bytes.data(), bytes.size()), o)->wait();
  if (group.rank() == root) return;
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
        "rank {}: broadcast_optimizer_state: rank {}'s optimizer state ({} bytes) does not fit "
        "this rank's optimizer (same type over the same parameters on every rank?): {}",
        group.rank(), root, bytes.size(), e.what_without_backtrace()));
  }
}

void check_same_parameters(torch::nn::Module& module, ProcessGroup& group,
                           std::chrono::milliseconds timeout) {
  if (group.size() == 1) return;
  uint32_t crc = 0;
  auto add = [&](const at::Tensor& t) {
    const at::Tensor c = t.detach().cpu().contiguous();
    crc = durable::crc32_of(c.data_ptr(), c.nbytes(), crc);
  };
  for (const auto& p : module.parameters()) add(p);
  for (const auto& b : module.buffers()) add(b);
  std::vector<int64_t> mine = {static_cast<int64_t>(crc)};
  std::vector<int64_t> all(static_cast<size_t>(group.size()));
  AllgatherOptions o;
  o.timeout = timeout;
  group.allgather(TensorView::of(all), TensorView::of(mine), o)->wait();
  std::vector<int> differ;
  for (int r = 1; r < group.size(); ++r)
    if (all[static_cast<size_t>(r)] != all[0]) differ.push_back(r);
  if (!differ.empty())
    throw DataLossError(fmt::format(
        "rank {}: the parameters and buffers of rank(s) {} differ from rank 0's (CRC-32 of rank "
        "0's {:08x}; each rank's: {}) after they should have been made equal; the transfer of "
        "state lost or changed bytes",
        group.rank(), fmt::join(differ, ", "), static_cast<uint32_t>(all[0]),
        fmt::join(all, ", ")));
}

}  // namespace dtrain
