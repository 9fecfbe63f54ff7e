// The few pieces of the CUDA runtime dtrain uses, with RAII and dtrain's errors: the current
// device (restored on scope exit), streams, events, pinned host memory, bounded waits on events,
// and the check that a tensor labelled CUDA really is GPU memory on the device it names.
// Built only where CMake finds the CUDA toolkit (src/backends/CMakeLists.txt): the native
// backend's staging (host_staging.cc) and the nccl backend use it; nothing else includes CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/deadline.h"
#include "dtrain/tensor.h"

namespace dtrain::cuda {

// "cudaErrorNoDevice (100): no CUDA-capable device is detected"
std::string error_text(cudaError_t error);

// Throws the dtrain error for a failed CUDA call: InvalidArgumentError for what the caller can
// fix (a bad pointer or device, no GPU, no driver), PeerFailureError for a failed device (the
// CUDA context is then unusable: restart the process). `what` says what was being done.
[[noreturn]] void fail(cudaError_t error, std::string_view what);
inline void check(cudaError_t error, std::string_view what) {
  if (error != cudaSuccess) fail(error, what);
}

// The GPUs this process sees, as cudaGetDeviceCount says (count 0 with the error when there is
// no driver or no device). It never throws: callers word the refusal.
struct DeviceCount {
  int count = 0;
  cudaError_t error = cudaSuccess;
  // "cudaGetDeviceCount returned cudaErrorNoDevice (100): no CUDA-capable device is detected"
  std::string describe() const;
};
DeviceCount device_count();

// Makes `device` current for this thread until the end of the scope, then restores the device
// that was current (the caller's choice of device is never changed behind its back).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

class Stream {
 public:
  // A stream on the current device. Non-blocking: it never waits on the legacy default stream
  // implicitly; work is ordered after the caller's explicitly (order_after).
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  Event();  // on the current device, without timing
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }
  void record(cudaStream_t stream, std::string_view what);
  // True once everything recorded before it has run; throws a CUDA error it reports.
  bool done(std::string_view what) const;

 private:
  cudaEvent_t event_ = nullptr;
};

// Events of one device, reused: creating one per call cost more than the rest of an NCCL call's
// own work on the host. An event taken goes back to the pool when its last holder (a Work) lets
// go, or is destroyed if the pool has gone by then.
class EventPool : public std::enable_shared_from_this<EventPool> {
 public:
  static std::shared_ptr<EventPool> create() { return std::shared_ptr<EventPool>(new EventPool); }
  // An event of the current device, which must be the device of every event of this pool.
  std::shared_ptr<Event> take();

 private:
  EventPool() = default;
  std::mutex mu_;  // guards free_
  std::vector<std::unique_ptr<Event>> free_;
};

// Makes `stream` wait (on the GPU, without blocking this thread) for the work queued so far on
// `producer`: the stream a tensor's view names (TensorView::stream), where its producer wrote
// it; null is the legacy default stream, where LibTorch computes unless told otherwise.
void order_after(cudaStream_t stream, void* producer, Event& scratch, std::string_view what);

// Polls `event` until it has completed (true) or `deadline` passes (false), yielding at first
// and then sleeping in short steps, so a long wait costs little CPU.
bool wait_event(const Event& event, const Deadline& deadline, std::string_view what);

// Page-locked host memory: cudaMemcpyAsync to and from it is truly asynchronous.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes);  // portable: usable with every device
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// Memory on the current device, for dtrain's own small buffers (a barrier's one element).
class DeviceMemory {
 public:
  explicit DeviceMemory(size_t bytes);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
};

// Checks that `t` (device kCuda) is memory of GPU t.device_index that CUDA knows, so that a host
// pointer labelled CUDA fails here with a message instead of faulting on the GPU. `who` names
// the rank and operation ("rank 0: all_reduce"), `which` the tensor ("the input").
void check_device_tensor(const TensorView& t, std::string_view who, std::string_view which);

}  // namespace dtrain::cuda
