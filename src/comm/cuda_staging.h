// How the native backend takes CUDA tensors without including a CUDA header.
//
// The native backend's collectives run on the CPU. Given a tensor on a GPU, NativeProcessGroup
// hands the call to stage_cuda(), which copies the tensor into pinned host memory, issues the
// same operation on the host copy, and copies the result back when it completes. The copying
// lives in src/comm/cuda/host_staging.cc, built only where CMake finds the CUDA toolkit and
// linked through the CMake target dtrain_backends, which registers it here at static
// initialisation; dtrain_core itself never links CUDA. Without it, a CUDA tensor fails with
// "backend native does not support OP on CUDA tensors: dtrain was built without CUDA: ...".
//
// Overlap: the copy to the host happens in the call (the caller's thread), the collective on the
// group's worker thread, the copy back in the Work's wait(). With several calls in flight (DDP's
// buckets), the copies of one bucket overlap the communication of the others. One call is never
// split into several collectives: a rank passing a CPU tensor to the same call must still meet
// exactly one collective.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string_view>

#include "comm/arguments.h"
#include "common/deadline.h"
#include "dtrain/tensor.h"
#include "dtrain/work.h"

namespace dtrain::comm {

// Which way a staged tensor's bytes go.
enum class Staging : uint8_t {
  kIn,     // read by the operation: copied to the host before it
  kOut,    // written by it: copied back to the GPU after it completes
  kInOut,  // both (in-place collectives)
};

struct StagedTensor {
  TensorView tensor;
  Staging staging;
};

// Issues the operation on host views of the tensors (same order as given; CPU tensors are passed
// through unchanged) with `timeout`, what is left of the call's limit, and returns its Work.
using IssueOnHost = std::function<std::shared_ptr<Work>(std::span<const TensorView> host,
                                                        std::chrono::milliseconds timeout)>;

class CudaStaging {
 public:
  virtual ~CudaStaging() = default;
  // Copies the kIn and kInOut CUDA tensors to the host (waiting for the copies, at most until
  // `deadline`), calls `issue`, and returns a Work that completes once the operation has and the
  // kOut and kInOut tensors are back on their GPUs.
  virtual std::shared_ptr<Work> run(const GroupInfo& info, std::string_view op,
                                    std::span<const StagedTensor> tensors, const Deadline& deadline,
                                    const IssueOnHost& issue) = 0;
  // dst = src (same byte size), either or both on a GPU; returns once the copy is done.
  virtual void copy(std::string_view who, const TensorView& dst, const TensorView& src,
                    const Deadline& deadline) = 0;
};

// Installs the CUDA staging (once, at static initialisation of the library that has it).
bool register_cuda_staging(CudaStaging* staging);
// The installed staging, or null in a build or program without CUDA.
CudaStaging* cuda_staging();

inline bool on_cuda(const TensorView& t) { return t.device == Device::kCuda; }

// For NativeProcessGroup: `issue` over host copies of the CUDA tensors among `tensors`, through
// the installed staging; throws InvalidArgumentError ("backend native does not support OP on
// CUDA tensors: dtrain was built without CUDA: ...") when there is none.
std::shared_ptr<Work> stage_cuda(const GroupInfo& info, std::string_view op,
                                 std::initializer_list<StagedTensor> tensors,
                                 const Deadline& deadline, const IssueOnHost& issue);

// dst = src where either is a CUDA tensor (the out-of-place all_reduce of every backend); `who`
// is "rank 0: all_reduce". Throws like stage_cuda without the staging.
void copy_cuda(std::string_view who, const TensorView& dst, const TensorView& src,
               const Deadline& deadline);

}  // namespace dtrain::comm
