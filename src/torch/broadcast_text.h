// root's text (or any bytes) on every rank of a group: its length, then the bytes. Shared by the
// state that travels as text (optimizer archives, commits' descriptions, snapshots' manifests).
// Internal to dtrain_torch.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/process_group.h"

namespace dtrain {

inline std::string broadcast_text(ProcessGroup& group, std::string text, int root,
                                  std::chrono::milliseconds timeout) {
  BroadcastOptions o;
  o.root = root;
  o.timeout = timeout;
  std::vector<int64_t> size = {static_cast<int64_t>(text.size())};
  group.broadcast(TensorView::of(size), o)->wait();
  text.resize(static_cast<size_t>(size[0]));
  group.broadcast(TensorView::raw(text.data(), text.size()), o)->wait();
  return text;
}

}  // namespace dtrain
