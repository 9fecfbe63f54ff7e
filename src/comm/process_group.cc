#include <unistd.h>

#include <fmt/format.h>

#include "comm/native_process_group.h"
#include "comm/p2p_work.h"
#include "common/env.h"
#include "common/log.h"
#include "dtrain/error.h"
#include "transport/tag.h"

namespace dtrain {

std::shared_ptr<ProcessGroup> ProcessGroup::create(std::shared_ptr<Store> store, int rank,
                                                   int size, const ProcessGroupOptions& options) {
  return std::make_shared<comm::NativeProcessGroup>(std::move(store), rank, size, options);
}

namespace comm {
namespace {

uint64_t fnv1a(std::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (char c : text) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

// The address peers should dial: explicit, DTRAIN_SOCKET_ADDR, the local end of the store
// connection (the interface that routes to the master), or this host's name.
std::string pick_advertise_addr(const ProcessGroupOptions& options, Store& store) {
  if (!options.advertise_addr.empty()) return options.advertise_addr;
  if (auto v = env::raw(env::kSocketAddr)) return *v;
  Store* s = &store;
  while (auto* prefix = dynamic_cast<PrefixStore*>(s)) s = prefix->base().get();
  if (auto* tcp = dynamic_cast<TcpStore*>(s)) return tcp->local_ip();
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0') return host;
  return "127.0.0.1";
}

}  // namespace

NativeProcessGroup::NativeProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                                       const ProcessGroupOptions& options)
    : store_(std::move(store)), rank_(rank), size_(size), name_(options.name) {
  if (size < 1)
    throw InvalidArgumentError(fmt::format("world size is {}: it must be at least 1", size));
  if (rank < 0 || rank >= size)
    throw InvalidArgumentError(
        fmt::format("rank {} is outside the group of size {}: use 0..{}", rank, size, size - 1));
  if (!store_) throw InvalidArgumentError("ProcessGroup::create needs a store; got null");
  timeout_ = options.timeout.count() > 0 ? options.timeout : env::get_seconds(env::kTimeout);

  transport::tcp::DeviceOptions d;
  d.rank = rank;
  d.size = size;
  d.group_name = name_;
  d.group_tag = fnv1a(fmt::format("{}/{}", name_, size));
  d.listen_host = options.listen_host;
  d.advertise_addr = pick_advertise_addr(options, *store_);
  d.handshake = net::HandshakeConfig::from_env();
  if (!options.job_id.empty()) d.handshake.job_id = options.job_id;
  if (!options.token.empty()) d.handshake.token = options.token;
  d.connect_timeout = options.connect_timeout.count() > 0 ? options.connect_timeout
                                                          : env::get_seconds(env::kConnectTimeout);
  d.spin = std::chrono::microseconds(env::get_int(env::kSpinUs).value_or(50));
  device_ = std::make_unique<transport::tcp::Device>(*store_, d);
}

NativeProcessGroup::~NativeProcessGroup() = default;

void NativeProcessGroup::check_peer(int peer, const TensorView& tensor, const char* op) const {
  if (peer < 0 || peer >= size_)
    throw InvalidArgumentError(fmt::format("rank {}: {} names rank {}, but group {} has ranks 0..{}",
                                           rank_, op, peer, name_, size_ - 1));
  if (peer == rank_)
    throw InvalidArgumentError(
        fmt::format("rank {}: {} names this rank itself; copy the tensor instead", rank_, op));
  if (tensor.device != Device::kCpu)
    throw InvalidArgumentError(fmt::format(
        "rank {}: {}: backend native does not support {} on CUDA tensors yet; copy to the CPU",
        rank_, op, op));
  if (tensor.data == nullptr && tensor.numel > 0)
    throw InvalidArgumentError(
        fmt::format("rank {}: {} of {} elements has a null data pointer", rank_, op, tensor.numel));
}

std::shared_ptr<Work> NativeProcessGroup::isend(const TensorView& tensor, int dst, int tag,
                                                const SendOptions& options) {
  check_peer(dst, tensor, "send");
  uint64_t t = transport::make_tag(transport::TagSpace::kPointToPoint, group_id_,
                                   static_cast<uint32_t>(tag));
  auto request = device_->pair(dst)->isend(t, tensor.data, tensor.nbytes(),
                                           deadline_for(options.timeout));
  return std::make_shared<PairWork>(std::move(request));
}

std::shared_ptr<Work> NativeProcessGroup::irecv(const TensorView& tensor, int src, int tag,
                                                const RecvOptions& options) {
  check_peer(src, tensor, "recv");
  uint64_t t = transport::make_tag(transport::TagSpace::kPointToPoint, group_id_,
                                   static_cast<uint32_t>(tag));
  auto request = device_->pair(src)->irecv(t, tensor.data, tensor.nbytes(),
                                           deadline_for(options.timeout));
  return std::make_shared<PairWork>(std::move(request));
}

void NativeProcessGroup::abort(const std::string& reason) {
  DTRAIN_LOG_WARN("rank {}: group {} aborted: {}", rank_, name_, reason);
  device_->abort(std::make_exception_ptr(AbortedError(
      fmt::format("rank {}: group {} was aborted: {}", rank_, name_, reason))));
}

}  // namespace comm
}  // namespace dtrain
