// Broadcasting LibTorch state from one rank to all: tensors, a module's parameters and buffers,
// an optimizer's state (Horovod's broadcast_parameters and broadcast_optimizer_state); or from
// several ranks that hold the same state, each sending a piece (share_*: live recovery's way of
// handing the state to a replacement).
//
//   dtrain::broadcast_parameters(*model, *pg, /*root=*/0);      // before training starts
//   dtrain::broadcast_optimizer_state(optimizer, *pg, 0);      // e.g. after loading a checkpoint
#pragma once

#include <chrono>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dtrain/process_group.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace dtrain {

// Copies root's tensors into every rank's tensors (same shapes and dtypes everywhere), packed
// into one buffer so that it costs one broadcast.
void broadcast_tensors(ProcessGroup& group, const std::vector<at::Tensor>& tensors, int root,
                       std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

// Copies the holders' tensors into every other rank's. Across nodes, when more than half the
// ranks hold them, each holder sends its share of the bytes (an all-gather of the holders'
// pieces): a rank receives them in pieces from several peers, no holder's link carries more than
// its share, and it takes up to half a broadcast's time. Otherwise each rank that lacks them
// takes them whole from one holder (the holders in turn), tensor by tensor, and the holders
// receive nothing. When the holders' bytes differ (a digest of each, all-gathered) the first
// holder's go to every other rank. Either way every rank ends with the same bytes. `holders`:
// ascending. When every rank holds them (the survivors of a failure, all at one commit) nothing
// is sent once the digests say every rank's bytes are the same. Tensors of another total size
// on any rank fail every rank.
void share_tensors(ProcessGroup& group, const std::vector<at::Tensor>& tensors,
                   const std::vector<int>& holders,
                   std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

// Every parameter and buffer of `module`, from root.
void broadcast_parameters(torch::nn::Module& module, ProcessGroup& group, int root = 0,
                          std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

// The same, the parameters in pieces from the holders (share_tensors), the buffers (which data
// parallelism leaves to each rank) from the first holder.
void share_parameters(torch::nn::Module& module, ProcessGroup& group,
                      const std::vector<int>& holders,
                      std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

// root's optimizer state (per-parameter state such as momentum buffers, and the parameter
// groups' options such as the learning rate) replaces every other rank's. The optimizers must
// be of the same type over the same parameters.
void broadcast_optimizer_state(torch::optim::Optimizer& optimizer, ProcessGroup& group,
                               int root = 0,
                               std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

// The same, from the holders as share_tensors: each serializes its own state; across nodes in
// pieces, on one node whole from a holder to each rank that lacks it; when their bytes differ
// the first holder's go to every rank, and when every rank holds the same nothing is sent.
void share_optimizer_state(torch::optim::Optimizer& optimizer, ProcessGroup& group,
                           const std::vector<int>& holders,
                           std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

// Collective: whether every rank's parameters and buffers of `module` hold the same bits (a
// size and digest of each rank's, all-gathered: MemoryDigest), as after broadcast_parameters;
// throws DataLossError naming the ranks whose bits differ from rank 0's. Live recovery checks a
// newcomer with it.
void check_same_parameters(torch::nn::Module& module, ProcessGroup& group,
                           std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

}  // namespace dtrain
