// The native backend's CUDA tensors: staged through pinned host memory (see comm/cuda_staging.h
// for where this sits and how calls overlap).
//
// One call: the CUDA tensors it reads are copied into pinned buffers on a stream of their GPU
// (ordered after the work queued so far on the streams their views name, where the caller
// computed them: TensorView::stream), the call waits for
// those copies (bounded by its deadline), then the same operation is issued on the host copies.
// The returned Work completes when that operation has and the tensors it writes are copied back.
// Pinned buffers are pooled: pinning pages costs milliseconds per call, so buffers are reused,
// and one goes back to the pool only once nothing (an operation, a copy) can still touch it.
#include <algorithm>
#include <bit>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "comm/cuda/cuda_runtime.h"
#include "comm/cuda_staging.h"
#include "common/completion.h"
#include "dtrain/error.h"

namespace dtrain::comm {
namespace {

using namespace std::chrono_literals;

// Buffers are allocated in powers of two from 64 KiB, so that buckets of similar sizes share
// them; at most this much pinned memory is kept for reuse (the rest is freed when returned).
constexpr size_t kMinPinned = size_t{64} << 10;
constexpr size_t kMaxCachedPinned = size_t{1} << 30;

size_t round_up(size_t bytes) { return std::bit_ceil(std::max(bytes, kMinPinned)); }

// Whether a returned buffer may still be read or written (by an operation or a copy).
using BusyCheck = std::function<bool()>;

// Busy while `inner` (the operation on the buffers) or `copy` (a copy to or from them) runs. A
// failed query counts as idle: a CUDA context that reports errors runs no more copies.
BusyCheck busy_while(std::shared_ptr<Work> inner, std::shared_ptr<cuda::Event> copy) {
  return [inner = std::move(inner), copy = std::move(copy)]() noexcept {
    try {
      return (inner && !inner->is_completed()) || (copy && !copy->done("a staging copy"));
    } catch (...) {
      return false;
    }
  };
}

class PinnedPool {
 public:
  std::unique_ptr<cuda::PinnedBuffer> acquire(size_t bytes) {
    const size_t want = round_up(bytes);
    {
      std::lock_guard lock(mu_);
      for (auto it = parked_.begin(); it != parked_.end(); ++it) {
        if (it->buffer->size() != want || (it->busy && it->busy())) continue;
        auto b = std::move(it->buffer);
        cached_ -= b->size();
        parked_.erase(it);
        return b;
      }
    }
    return std::make_unique<cuda::PinnedBuffer>(want);
  }

  void release(std::unique_ptr<cuda::PinnedBuffer> buffer, BusyCheck busy) {
    std::vector<std::unique_ptr<cuda::PinnedBuffer>> to_free;  // freed outside the lock
    {
      std::lock_guard lock(mu_);
      cached_ += buffer->size();
      parked_.push_back({std::move(buffer), std::move(busy)});
      // Over the cap: free idle buffers, largest first.
      while (cached_ > kMaxCachedPinned) {
        auto victim = parked_.end();
        for (auto it = parked_.begin(); it != parked_.end(); ++it)
          if (!(it->busy && it->busy()) &&
              (victim == parked_.end() || it->buffer->size() > victim->buffer->size()))
            victim = it;
        if (victim == parked_.end()) break;  // all busy: keep them until they are not
        cached_ -= victim->buffer->size();
        to_free.push_back(std::move(victim->buffer));
        parked_.erase(victim);
      }
    }
  }

 private:
  struct Parked {
    std::unique_ptr<cuda::PinnedBuffer> buffer;
    BusyCheck busy;
  };
  std::mutex mu_;  // guards parked_, cached_
  std::vector<Parked> parked_;
  size_t cached_ = 0;
};

// One staged CUDA tensor of a call.
struct Item {
  TensorView device;  // the caller's tensor
  Staging staging;
  std::unique_ptr<cuda::PinnedBuffer> host;
};

class HostStaging;

class StagedWork : public Work {
 public:
  StagedWork(HostStaging& staging, std::shared_ptr<Work> inner, std::vector<Item> items, int device,
             std::string what, Deadline deadline)
      : staging_(staging),
        inner_(std::move(inner)),
        items_(std::move(items)),
        device_(device),
        what_(std::move(what)),
        deadline_(deadline) {}
  ~StagedWork() override;

  bool is_completed() override;
  void wait_until_done(std::optional<std::chrono::milliseconds> timeout) override;
  std::exception_ptr exception() const override { return completion_.error(); }

 private:
  // Once the operation succeeded: queues the copies back to the GPU (once). Caller holds mu_.
  void start_copy_back_locked();
  // Ends the Work; returns the buffers to the pool. Caller holds mu_.
  void finish_locked(std::exception_ptr error);
  size_t bytes_back() const;

  HostStaging& staging_;
  std::shared_ptr<Work> inner_;  // the operation on the host copies
  std::vector<Item> items_;
  int device_;
  std::string what_;  // "rank 0: all_reduce of 4096 bytes on cuda:0 (staged through the host)"
  Deadline deadline_;
  std::mutex mu_;                      // guards items_, back_
  std::shared_ptr<cuda::Event> back_;  // recorded after the copies back; null until queued
  Completion completion_;
};

class HostStaging final : public CudaStaging {
 public:
  std::shared_ptr<Work> run(const GroupInfo& info, std::string_view op,
                            std::span<const StagedTensor> tensors, const Deadline& deadline,
                            const IssueOnHost& issue) override;
  void copy(std::string_view who, const TensorView& dst, const TensorView& src,
            const Deadline& deadline) override;

  PinnedPool& pool() { return pool_; }
  // This device's copy stream (created on first use; the caller has made `device` current).
  cudaStream_t stream(int device) {
    std::lock_guard lock(mu_);
    auto& s = streams_[device];
    if (!s) s = std::make_unique<cuda::Stream>();
    return s->get();
  }
  // Orders `stream` after the work queued so far on the streams the tensors on `device` name
  // (TensorView::stream), each once (one scratch event per device).
  void order_after(int device, cudaStream_t stream, std::span<const TensorView> tensors,
                   std::string_view what) {
    std::lock_guard lock(mu_);
    auto& e = order_events_[device];
    if (!e) e = std::make_unique<cuda::Event>();
    std::vector<void*> ordered;
    for (const auto& t : tensors) {
      if (!on_cuda(t) || t.device_index != device ||
          std::find(ordered.begin(), ordered.end(), t.stream) != ordered.end())
        continue;
      cuda::order_after(stream, t.stream, *e, what);
      ordered.push_back(t.stream);
    }
  }
  // An event of `device` (current), from the device's pool.
  std::shared_ptr<cuda::Event> event(int device) {
    std::lock_guard lock(mu_);
    auto& pool = events_[device];
    if (!pool) pool = cuda::EventPool::create();
    return pool->take();
  }

 private:
  PinnedPool pool_;
  std::mutex mu_;  // guards streams_, order_events_ (and the use of an order event), events_
  std::map<int, std::unique_ptr<cuda::Stream>> streams_;
  std::map<int, std::unique_ptr<cuda::Event>> order_events_;
  std::map<int, std::shared_ptr<cuda::EventPool>> events_;
};

std::string_view which(Staging s) {
  switch (s) {
    case Staging::kIn:
      return "the input";
    case Staging::kOut:
      return "the output";
    case Staging::kInOut:
      return "the tensor";
  }
  return "the tensor";
}

std::vector<TensorView> tensors_on_host(std::span<const StagedTensor> tensors) {
  std::vector<TensorView> host;
  for (const auto& st : tensors) host.push_back(st.tensor);
  return host;
}

bool reads(Staging s) { return s != Staging::kOut; }
bool writes(Staging s) { return s != Staging::kIn; }

std::shared_ptr<Work> HostStaging::run(const GroupInfo& info, std::string_view op,
                                       std::span<const StagedTensor> tensors,
                                       const Deadline& deadline, const IssueOnHost& issue) {
  const std::string who = fmt::format("rank {}: {}", info.rank, op);
  int device = -1;
  for (const auto& st : tensors) {
    if (!on_cuda(st.tensor)) continue;
    if (device >= 0 && st.tensor.device_index != device)
      throw InvalidArgumentError(fmt::format(
          "{}: {} is on cuda:{} but another tensor of the call on cuda:{}; pass the tensors of "
          "one call on one GPU",
          who, which(st.staging), st.tensor.device_index, device));
    device = st.tensor.device_index;
    // First of all: without a GPU, or with a host pointer labelled CUDA, this is what fails,
    // and its message names the rank, the operation and the tensor.
    cuda::check_device_tensor(st.tensor, who, which(st.staging));
  }
  if (device < 0)
    return issue(tensors_on_host(tensors), std::max(deadline.remaining(), 1ms));  // none on a GPU
  cuda::DeviceGuard guard(device);
  std::vector<Item> items;
  std::vector<TensorView> host;
  size_t bytes_in = 0;
  // Buffers of a call that fails before its Work exists go back to the pool, once the copies
  // to them (if any were queued) have finished.
  std::shared_ptr<cuda::Event> copied;
  auto park = [&] {
    for (auto& item : items)
      if (item.host) pool_.release(std::move(item.host), busy_while(nullptr, copied));
  };
  try {
    for (const auto& st : tensors) {
      if (!on_cuda(st.tensor)) {
        host.push_back(st.tensor);
        continue;
      }
      Item item{st.tensor, st.staging, pool_.acquire(st.tensor.nbytes())};
      host.push_back(
          TensorView{item.host->data(), st.tensor.numel, st.tensor.dtype, Device::kCpu, 0});
      items.push_back(std::move(item));
    }
    cudaStream_t s = stream(device);
    const auto views = tensors_on_host(tensors);  // the callers' views, as given
    order_after(device, s, views, who + ": ordering the copy after the tensors' producers");
    for (const auto& item : items) {
      if (!reads(item.staging) || item.device.nbytes() == 0) continue;
      cuda::check(cudaMemcpyAsync(item.host->data(), item.device.data, item.device.nbytes(),
                                  cudaMemcpyDeviceToHost, s),
                  fmt::format("{}: copying {} ({} bytes) from cuda:{} to the host", who,
                              which(item.staging), item.device.nbytes(), device));
      bytes_in += item.device.nbytes();
    }
    copied = event(device);
    copied->record(s, who + ": cudaEventRecord after the copies to the host");
    if (!cuda::wait_event(*copied, deadline, who))
      throw TimeoutError(fmt::format(
          "{}: copying {} bytes from cuda:{} to the host did not finish within {}: the GPU is "
          "still busy with the work queued before the call, or hung; nothing was sent",
          who, bytes_in, device, deadline.describe()));
  } catch (...) {
    park();
    throw;
  }
  std::shared_ptr<Work> inner;
  try {
    inner = issue(host, std::max(deadline.remaining(), 1ms));
  } catch (...) {
    park();
    throw;
  }
  size_t bytes = 0;
  for (const auto& item : items) bytes += item.device.nbytes();
  return std::make_shared<StagedWork>(
      *this, std::move(inner), std::move(items), device,
      fmt::format("{} of {} bytes on cuda:{} (staged through host memory)", who, bytes, device),
      deadline);
}

void HostStaging::copy(std::string_view who, const TensorView& dst, const TensorView& src,
                       const Deadline& deadline) {
  if (dst.nbytes() != src.nbytes())
    throw InvalidArgumentError(
        fmt::format("{}: copying {} bytes into {} bytes", who, src.nbytes(), dst.nbytes()));
  if (dst.nbytes() == 0 || dst.data == src.data) return;
  if (on_cuda(dst)) cuda::check_device_tensor(dst, who, "the output");
  if (on_cuda(src)) cuda::check_device_tensor(src, who, "the input");
  const int device = on_cuda(dst) ? dst.device_index : src.device_index;
  cuda::DeviceGuard guard(device);
  cudaStream_t s = stream(device);
  const TensorView both[] = {dst, src};
  order_after(device, s, both,
              fmt::format("{}: ordering the copy after the tensors' producers", who));
  // cudaMemcpyDefault: unified addressing tells host from device memory, on either side.
  cuda::check(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDefault, s),
              fmt::format("{}: copying {} bytes from the input to the output", who, src.nbytes()));
  auto done = event(device);
  done->record(s, fmt::format("{}: cudaEventRecord after the copy", who));
  if (!cuda::wait_event(*done, deadline, who))
    throw TimeoutError(fmt::format("{}: copying {} bytes on cuda:{} did not finish within {}", who,
                                   src.nbytes(), device, deadline.describe()));
}

// ---- StagedWork ----

StagedWork::~StagedWork() {
  // The operation or the copy back may still use the buffers: park them until neither does.
  std::lock_guard lock(mu_);
  for (auto& item : items_)
    if (item.host) staging_.pool().release(std::move(item.host), busy_while(inner_, back_));
}

size_t StagedWork::bytes_back() const {
  size_t n = 0;
  for (const auto& item : items_)
    if (writes(item.staging)) n += item.device.nbytes();
  return n;
}

void StagedWork::start_copy_back_locked() {
  if (back_) return;
  cuda::DeviceGuard guard(device_);
  cudaStream_t s = staging_.stream(device_);
  for (const auto& item : items_) {
    if (!writes(item.staging) || item.device.nbytes() == 0) continue;
    cuda::check(cudaMemcpyAsync(item.device.data, item.host->data(), item.device.nbytes(),
                                cudaMemcpyHostToDevice, s),
                fmt::format("{}: copying {} ({} bytes) back to cuda:{}", what_, which(item.staging),
                            item.device.nbytes(), device_));
  }
  auto back = staging_.event(device_);
  back->record(s, what_ + ": cudaEventRecord after the copies back");
  back_ = std::move(back);
}

void StagedWork::finish_locked(std::exception_ptr error) {
  if (error)
    completion_.fail(std::move(error));
  else
    completion_.succeed();
  // Whatever failed, nothing touches the buffers once the operation and the copy back are done.
  for (auto& item : items_)
    if (item.host) staging_.pool().release(std::move(item.host), busy_while(inner_, back_));
}

bool StagedWork::is_completed() {
  std::lock_guard lock(mu_);
  if (completion_.done()) return true;
  try {
    if (!inner_->is_completed()) return false;
    if (auto e = inner_->exception()) {
      finish_locked(e);
      return true;
    }
    start_copy_back_locked();
    if (back_->done(what_)) {
      finish_locked(nullptr);
      return true;
    }
    if (deadline_.expired())
      finish_locked(std::make_exception_ptr(
          TimeoutError(fmt::format("{}: copying {} bytes back to cuda:{} did not finish within {}",
                                   what_, bytes_back(), device_, deadline_.describe()))));
  } catch (...) {
    finish_locked(std::current_exception());
  }
  return completion_.done();
}

void StagedWork::wait_until_done(std::optional<std::chrono::milliseconds> timeout) {
  const Deadline limit = timeout ? Deadline::after(*timeout) : deadline_;
  if (!completion_.done()) {
    try {
      // The operation's own wait enforces its deadline (and cancels it on a timeout).
      inner_->wait(timeout ? std::optional(limit.remaining()) : std::nullopt);
    } catch (...) {
      std::lock_guard lock(mu_);
      if (!completion_.done()) finish_locked(std::current_exception());
      std::rethrow_exception(completion_.error());
    }
    std::shared_ptr<cuda::Event> back;
    {
      std::lock_guard lock(mu_);
      if (!completion_.done()) {
        try {
          start_copy_back_locked();
          back = back_;
        } catch (...) {
          finish_locked(std::current_exception());
        }
      }
    }
    if (back) {
      bool done = false;
      std::exception_ptr error;
      try {
        done = cuda::wait_event(*back, limit, what_);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard lock(mu_);
      if (!completion_.done()) {
        if (!error && !done)
          error = std::make_exception_ptr(TimeoutError(fmt::format(
              "{}: copying {} bytes back to cuda:{} did not finish within {}: the GPU is busy or "
              "hung",
              what_, bytes_back(), device_, limit.describe())));
        finish_locked(error);
      }
    }
  }
  if (auto e = completion_.error()) std::rethrow_exception(e);
}

// Never destroyed: the CUDA runtime may already be torn down when static destructors run, and
// the pinned memory goes with the process anyway.
HostStaging& instance() {
  static HostStaging* staging = new HostStaging;
  return *staging;
}

const bool kRegistered = register_cuda_staging(&instance());

}  // namespace
}  // namespace dtrain::comm
