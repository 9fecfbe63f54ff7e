#include "comm/cuda/cuda_runtime.h"

#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::cuda {

std::string error_text(cudaError_t error) {
  return fmt::format("{} ({}): {}", cudaGetErrorName(error), static_cast<int>(error),
                     cudaGetErrorString(error));
}

void fail(cudaError_t error, std::string_view what) {
  // Clears the error where it is not sticky, so that it does not resurface in a later call.
  cudaGetLastError();
  const std::string text = fmt::format("{}: {}", what, error_text(error));
  switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
      throw InvalidArgumentError(text +
                                 " (no usable GPU: the NVIDIA driver is missing or older "
                                 "than this CUDA runtime, or no device is visible)");
    case cudaErrorInitializationError:
      throw InvalidArgumentError(text +
                                 " (a process forked after CUDA was initialised cannot "
                                 "use CUDA: initialise it after the fork)");
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorMemoryAllocation:
      throw InvalidArgumentError(text);
    default:
      throw PeerFailureError(text +
                             " (the GPU failed; its CUDA context may be unusable: restart "
                             "the process)");
  }
}

DeviceCount device_count() {
  DeviceCount d;
  d.error = cudaGetDeviceCount(&d.count);
  if (d.error != cudaSuccess) {
    d.count = 0;
    cudaGetLastError();
  }
  return d;
}

std::string DeviceCount::describe() const {
  if (error != cudaSuccess) {
    std::string text = "cudaGetDeviceCount returned " + error_text(error);
    if (error == cudaErrorInsufficientDriver || error == cudaErrorStubLibrary)
      text += " (no NVIDIA driver is loaded, or it is older than this CUDA runtime)";
    return text;
  }
  return fmt::format("cudaGetDeviceCount found {} devices", count);
}

DeviceGuard::DeviceGuard(int device) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device) check(cudaSetDevice(device), fmt::format("cudaSetDevice({})", device));
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

Stream::Stream() {
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
}

Stream::~Stream() {
  if (stream_) cudaStreamDestroy(stream_);  // returns at once; pending work still completes
}

Event::Event() {
  check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
}

Event::~Event() {
  if (event_) cudaEventDestroy(event_);
}

void Event::record(cudaStream_t stream, std::string_view what) {
  check(cudaEventRecord(event_, stream), what);
}

bool Event::done(std::string_view what) const {
  const cudaError_t e = cudaEventQuery(event_);
  if (e == cudaSuccess) return true;
  if (e == cudaErrorNotReady) return false;
  fail(e, what);
}

std::shared_ptr<Event> EventPool::take() {
  std::unique_ptr<Event> event;
  {
    std::lock_guard lock(mu_);
    if (!free_.empty()) {
      event = std::move(free_.back());
      free_.pop_back();
    }
  }
  if (!event) event = std::make_unique<Event>();
  return std::shared_ptr<Event>(event.release(), [pool = weak_from_this()](Event* e) {
    std::unique_ptr<Event> owned(e);
    if (auto p = pool.lock()) {
      std::lock_guard lock(p->mu_);
      p->free_.push_back(std::move(owned));
    }
  });
}

void order_after(cudaStream_t stream, void* producer, Event& scratch, std::string_view what) {
  cudaStream_t from = producer ? static_cast<cudaStream_t>(producer) : cudaStreamLegacy;
  if (from == stream) return;
  scratch.record(from, what);
  check(cudaStreamWaitEvent(stream, scratch.get(), 0), what);
}

bool wait_event(const Event& event, const Deadline& deadline, std::string_view what) {
  for (int spins = 0;; ++spins) {
    if (event.done(what)) return true;
    if (deadline.expired()) return false;
    if (spins < 100)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(spins < 1000 ? 20 : 200));
  }
}

PinnedBuffer::PinnedBuffer(size_t bytes) : size_(bytes) {
  void* p = nullptr;
  check(cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocPortable),
        fmt::format("cudaHostAlloc of {} bytes of pinned host memory", bytes));
  data_ = static_cast<std::byte*>(p);
}

PinnedBuffer::~PinnedBuffer() {
  if (data_) cudaFreeHost(data_);
}

DeviceMemory::DeviceMemory(size_t bytes) {
  check(cudaMalloc(&data_, std::max<size_t>(bytes, 1)),
        fmt::format("cudaMalloc of {} bytes", bytes));
}

DeviceMemory::~DeviceMemory() {
  if (data_) cudaFree(data_);
}

void check_device_tensor(const TensorView& t, std::string_view who, std::string_view which) {
  if (t.numel == 0) return;
  if (t.data == nullptr)
    throw InvalidArgumentError(fmt::format("{}: {} (cuda:{}, {} elements) has a null data pointer",
                                           who, which, t.device_index, t.numel));
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, t.data);
  if (e != cudaSuccess)
    fail(e, fmt::format("{}: {} says cuda:{}, but CUDA cannot tell what {} is "
                        "(cudaPointerGetAttributes)",
                        who, which, t.device_index, t.data));
  const bool on_device = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  if (!on_device)
    throw InvalidArgumentError(fmt::format(
        "{}: {} says cuda:{}, but its pointer {} is {} memory: label host tensors Device::kCpu",
        who, which, t.device_index, t.data,
        a.type == cudaMemoryTypeHost ? "pinned host" : "ordinary host"));
  if (a.type == cudaMemoryTypeDevice && a.device != t.device_index)
    throw InvalidArgumentError(fmt::format(
        "{}: {} says cuda:{}, but its memory is on cuda:{}: set TensorView::device_index to the "
        "GPU that holds it",
        who, which, t.device_index, a.device));
}

}  // namespace dtrain::cuda
