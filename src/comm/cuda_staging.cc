// The native backend's side of the CUDA seam: where the staging registers, and the refusal when
// none did. Part of dtrain_core; includes no CUDA header. CMake defines DTRAIN_HAVE_CUDA for this
// file alone when it built the CUDA support, so the refusal can say which of the two is missing.
#include "comm/cuda_staging.h"

#include <atomic>
#include <string>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::comm {
namespace {

std::atomic<CudaStaging*>& slot() {
  static std::atomic<CudaStaging*> s{nullptr};
  return s;
}

// Why this program cannot take CUDA tensors.
std::string why_not() {
#ifdef DTRAIN_HAVE_CUDA
  return "this program does not link dtrain's CUDA support: link the CMake target "
         "dtrain_backends (it registers the staging of CUDA tensors through pinned host "
         "memory), or copy the tensor to the CPU";
#else
  return "dtrain was built without CUDA: rebuild where CMake finds the CUDA toolkit "
         "(-DCUDAToolkit_ROOT=/usr/local/cuda) and link the CMake target dtrain_backends, or "
         "copy the tensor to the CPU";
#endif
}

}  // namespace

bool register_cuda_staging(CudaStaging* staging) {
  slot().store(staging, std::memory_order_release);
  return true;
}

CudaStaging* cuda_staging() { return slot().load(std::memory_order_acquire); }

std::shared_ptr<Work> stage_cuda(const GroupInfo& info, std::string_view op,
                                 std::initializer_list<StagedTensor> tensors,
                                 const Deadline& deadline, const IssueOnHost& issue) {
  CudaStaging* staging = cuda_staging();
  if (!staging) throw unsupported(info, op, op, "CUDA tensors", why_not());
  return staging->run(info, op, std::span<const StagedTensor>(tensors.begin(), tensors.size()),
                      deadline, issue);
}

void copy_cuda(std::string_view who, const TensorView& dst, const TensorView& src,
               const Deadline& deadline) {
  CudaStaging* staging = cuda_staging();
  if (!staging)
    throw InvalidArgumentError(fmt::format("{}: cannot copy a CUDA tensor: {}", who, why_not()));
  staging->copy(who, dst, src, deadline);
}

}  // namespace dtrain::comm
