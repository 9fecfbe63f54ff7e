#include "comm/per_device_group.h"

#include <fmt/format.h>

#include "comm/cuda_staging.h"
#include "dtrain/error.h"

namespace dtrain::comm {
namespace {

// Whether a view says where its call goes: a view labelled CUDA does, even empty; a host view
// only with memory (an unused output, such as a non-root's in gather, is a default view).
bool says_where(const TensorView& t) { return on_cuda(t) || t.data != nullptr || t.numel > 0; }

std::string where(const TensorView& t) {
  return on_cuda(t) ? fmt::format("cuda:{}", t.device_index) : std::string("the host");
}

}  // namespace

PerDeviceGroup::PerDeviceGroup(std::shared_ptr<ProcessGroup> cuda,
                               std::shared_ptr<ProcessGroup> host)
    : cuda_(std::move(cuda)), host_(std::move(host)) {
  if (!cuda_ || !host_) throw InternalError("PerDeviceGroup: a group is null");
  if (cuda_->rank() != host_->rank() || cuda_->size() != host_->size())
    throw InternalError(
        fmt::format("PerDeviceGroup: the CUDA group is rank {} of {}, the host group rank {} of {}",
                    cuda_->rank(), cuda_->size(), host_->rank(), host_->size()));
}

ProcessGroup& PerDeviceGroup::route(std::string_view op,
                                    std::initializer_list<const TensorView*> tensors) {
  const TensorView* first = nullptr;
  for (const TensorView* t : tensors) {
    if (!says_where(*t)) continue;
    if (first == nullptr) {
      first = t;
    } else if (on_cuda(*t) != on_cuda(*first)) {
      throw InvalidArgumentError(fmt::format(
          "rank {}: {} of group {}: one tensor is on {}, another on {}; this group takes CUDA "
          "tensors through its GPU backend and host tensors through the native backend, one or "
          "the other in a call: pass the call's tensors on one device",
          rank(), op, name(), where(*first), where(*t)));
    }
  }
  return first != nullptr && on_cuda(*first) ? *cuda_ : *host_;
}

std::shared_ptr<Work> PerDeviceGroup::isend(const TensorView& tensor, int dst, int tag,
                                            const SendOptions& options) {
  return route("send", {&tensor}).isend(tensor, dst, tag, options);
}

std::shared_ptr<Work> PerDeviceGroup::irecv(const TensorView& tensor, int src, int tag,
                                            const RecvOptions& options) {
  return route("recv", {&tensor}).irecv(tensor, src, tag, options);
}

std::shared_ptr<Work> PerDeviceGroup::irecv_any(const TensorView& tensor, int tag,
                                                const RecvOptions& options) {
  return route("recv from any source", {&tensor}).irecv_any(tensor, tag, options);
}

std::shared_ptr<Work> PerDeviceGroup::broadcast(const TensorView& tensor,
                                                const BroadcastOptions& options) {
  return route("broadcast", {&tensor}).broadcast(tensor, options);
}

std::shared_ptr<Work> PerDeviceGroup::allreduce(const TensorView& tensor,
                                                const AllreduceOptions& options) {
  return route("all_reduce", {&tensor, &options.error}).allreduce(tensor, options);
}

std::shared_ptr<Work> PerDeviceGroup::reduce(const TensorView& tensor,
                                             const ReduceOptions& options) {
  return route("reduce", {&tensor}).reduce(tensor, options);
}

std::shared_ptr<Work> PerDeviceGroup::allgather(const TensorView& output, const TensorView& input,
                                                const AllgatherOptions& options) {
  return route("all_gather", {&output, &input}).allgather(output, input, options);
}

std::shared_ptr<Work> PerDeviceGroup::allgatherv(const TensorView& output, const TensorView& input,
                                                 const std::vector<size_t>& counts,
                                                 const AllgatherOptions& options) {
  return route("all_gather_v", {&output, &input}).allgatherv(output, input, counts, options);
}

std::shared_ptr<Work> PerDeviceGroup::gather(const TensorView& output, const TensorView& input,
                                             const GatherOptions& options) {
  return route("gather", {&output, &input}).gather(output, input, options);
}

std::shared_ptr<Work> PerDeviceGroup::scatter(const TensorView& output, const TensorView& input,
                                              const ScatterOptions& options) {
  return route("scatter", {&output, &input}).scatter(output, input, options);
}

std::shared_ptr<Work> PerDeviceGroup::reduce_scatter(const TensorView& output,
                                                     const TensorView& input,
                                                     const ReduceScatterOptions& options) {
  return route("reduce_scatter", {&output, &input}).reduce_scatter(output, input, options);
}

std::shared_ptr<Work> PerDeviceGroup::alltoall(const TensorView& output, const TensorView& input,
                                               const AlltoallOptions& options) {
  return route("all_to_all", {&output, &input}).alltoall(output, input, options);
}

std::shared_ptr<Work> PerDeviceGroup::alltoallv(const TensorView& output,
                                                const std::vector<size_t>& output_counts,
                                                const TensorView& input,
                                                const std::vector<size_t>& input_counts,
                                                const AlltoallOptions& options) {
  return route("all_to_all_v", {&output, &input})
      .alltoallv(output, output_counts, input, input_counts, options);
}

std::shared_ptr<Work> PerDeviceGroup::barrier(const BarrierOptions& options) {
  return host_->barrier(options);
}

std::shared_ptr<ProcessGroup> PerDeviceGroup::new_group(const std::vector<int>& ranks) {
  auto cuda = cuda_->new_group(ranks);
  auto host = host_->new_group(ranks);
  if (!cuda || !host) return nullptr;
  return std::make_shared<PerDeviceGroup>(std::move(cuda), std::move(host));
}

void PerDeviceGroup::abort(const std::string& reason) {
  cuda_->abort(reason);
  host_->abort(reason);
}

}  // namespace dtrain::comm
