#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/algorithms/algorithm.h"
#include "comm/algorithms/algorithms.h"
#include "comm/any_source_work.h"
#include "comm/arguments.h"
#include "comm/backend_registry.h"
#include "comm/cuda_staging.h"
#include "comm/failure_record.h"
#include "comm/native_process_group.h"
#include "comm/p2p_work.h"
#include "comm/per_device_group.h"
#include "comm/quantized_allreduce.h"
#include "comm/recorded_process_group.h"
#include "common/deadline.h"
#include "common/env.h"
#include "common/error_message.h"
#include "common/log.h"
#include "common/reduce.h"
#include "common/socket.h"
#include "dtrain/error.h"
#include "transport/host.h"
#include "transport/tag.h"

namespace dtrain {

std::shared_ptr<ProcessGroup> ProcessGroup::create(std::shared_ptr<Store> store, int rank, int size,
                                                   const ProcessGroupOptions& options) {
  // Another backend's group records its calls through a wrapper (the native one records its own).
  if (auto other = backends::create_registered(store, rank, size, options)) {
    std::shared_ptr<ProcessGroup> recorded =
        std::make_shared<comm::RecordedProcessGroup>(std::move(other), true);
    if (!backends::find_backend(backends::selected_backend(options))->device_memory_only)
      return recorded;
    // Host tensors through a native group of the same ranks, named apart in the store.
    ProcessGroupOptions host = options;
    host.backend = "native";
    host.name = options.name + "-host";
    return std::make_shared<comm::PerDeviceGroup>(
        std::move(recorded),
        std::make_shared<comm::NativeProcessGroup>(std::move(store), rank, size, host));
  }
  auto pg = std::make_shared<comm::NativeProcessGroup>(std::move(store), rank, size, options);
  return pg;
}

std::shared_ptr<Work> ProcessGroup::irecv_any(const TensorView&, int tag, const RecvOptions&) {
  throw InvalidArgumentError(fmt::format(
      "rank {}: recv from any source (tag {}) is served by the native backend only; name the "
      "source rank",
      rank(), tag));
}

std::shared_ptr<Work> ProcessGroup::allreduce(const TensorView& input, const TensorView& output,
                                              const AllreduceOptions& options) {
  if (input.numel != output.numel || input.dtype != output.dtype)
    throw InvalidArgumentError(
        fmt::format("rank {}: all_reduce: output ({} x {}) must match input ({} x {})", rank(),
                    output.numel, to_string(output.dtype), input.numel, to_string(input.dtype)));
  if (input.nbytes() > 0 && input.data != output.data) {
    if (comm::on_cuda(input) || comm::on_cuda(output))
      comm::copy_cuda(fmt::format("rank {}: all_reduce", rank()), output, input,
                      Deadline::after(options.timeout.count() > 0 ? options.timeout : timeout()));
    else
      std::memcpy(output.data, input.data, input.nbytes());
  }
  return allreduce(output, options);
}

namespace comm {
namespace {

using transport::make_tag;
using transport::TagSpace;

uint64_t fnv1a(std::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (char c : text) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

// The address peers should dial: explicit, DTRAIN_SOCKET_ADDR, the local end of the store
// connection (the interface that routes to the master), the interface that routes to
// MASTER_ADDR (a store we cannot look inside: torch's), or this host's name, which need not
// resolve to an address the peers can reach.
std::string pick_advertise_addr(const ProcessGroupOptions& options, Store& store) {
  if (!options.advertise_addr.empty()) return options.advertise_addr;
  if (auto v = env::raw(env::kSocketAddr)) return *v;
  Store* s = &store;
  while (auto* prefix = dynamic_cast<PrefixStore*>(s)) s = prefix->base().get();
  if (auto* tcp = dynamic_cast<TcpStore*>(s)) return tcp->local_ip();
  if (auto master = env::raw(env::kMasterAddr); master && !master->empty())
    if (std::string ip = net::route_source(*master); !ip.empty()) return ip;
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0') return host;
  return "127.0.0.1";
}

// The options of a call staged through host memory (cuda_staging.h), with what is left of its
// limit once the tensors are on the host.
template <typename Options>
Options with_timeout(Options options, std::chrono::milliseconds left) {
  options.timeout = left;
  return options;
}

}  // namespace

NativeProcessGroup::NativeProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                                       const ProcessGroupOptions& options)
    : store_(std::move(store)), rank_(rank), size_(size), name_(options.name) {
  check_rank_and_size(rank, size);
  if (!store_) throw InvalidArgumentError("ProcessGroup::create needs a store; got null");
  timeout_ = options.timeout.count() > 0 ? options.timeout : env::get_seconds(env::kTimeout);
  async_grace_ = options.async_grace;
  members_.resize(size);
  for (int i = 0; i < size; ++i) members_[i] = i;

  transport::DeviceOptions d;
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
  // Ranks sharing this host (LOCAL_WORLD_SIZE from the launcher, else the whole group when it
  // is on loopback) beyond its cores must not burn them polling.
  const int local = env::get_int(env::kLocalWorldSize)
                        .value_or(d.advertise_addr.rfind("127.", 0) == 0 ? size : 1);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  d.oversubscribed = local > cores;
  oversubscription_ = std::max(1.0, static_cast<double>(local) / cores);
  d.transport = options.transport.empty() ? env::get_string(env::kTransport) : options.transport;
  if (d.transport != "auto" && d.transport != "tcp" && d.transport != "shm")
    throw InvalidArgumentError(fmt::format(
        "transport '{}' is not one of auto, tcp, shm (ProcessGroupOptions::transport or "
        "DTRAIN_TRANSPORT)",
        d.transport));
  device_ = std::make_shared<transport::Device>(*store_, d);
  FlightRecorder::global().set_rank(rank, size);
  start();
  if (size_ > 1 && env::raw(env::kCostFile)) agree_on_costs();
}

NativeProcessGroup::NativeProcessGroup(const NativeProcessGroup& parent, std::vector<int> members,
                                       uint32_t group_id, std::string name, Split split)
    : store_(parent.store_),
      device_(parent.device_),
      rank_(-1),
      size_(static_cast<int>(members.size())),
      name_(std::move(name)),
      members_(std::move(members)),
      group_id_(group_id),
      timeout_(parent.timeout_),
      async_grace_(parent.async_grace_),
      cost_model_(parent.cost_model_),
      oversubscription_(parent.oversubscription_),
      split_(split) {
  for (int i = 0; i < size_; ++i)
    if (members_[i] == device_->rank()) rank_ = i;
  start();
}

void NativeProcessGroup::start() {
  if (internal()) {
    history_ = std::make_shared<CallHistory>(0);
  } else {
    flight_group_ = FlightRecorder::global().group_id(name_);
    history_ = FlightRecorder::global().history(flight_group_);
  }
  pairs_.assign(size_, nullptr);
  for (int i = 0; i < size_; ++i)
    if (i != rank_) pairs_[i] = device_->pair(members_[i]).get();
  topology_.local = size_ > 1;
  topology_.can_read_all = size_ > 1;
  topology_.oversubscription = oversubscription_;
  topology_.one_machine = true;
  const std::string machine = transport::machine_of(device_->host_of(members_[rank_]));
  for (int i = 0; i < size_; ++i) {
    topology_.one_machine &= transport::machine_of(device_->host_of(members_[i])) == machine;
    if (i == rank_) continue;
    auto& p = *device_->pair(members_[i]);
    topology_.local &= p.shared_memory();
    topology_.can_read_all &= p.can_read_peer();
  }
  watchdog_ = std::make_unique<Watchdog>(*store_, name_, rank_, size_,
                                         env::get_seconds(env::kStragglerSeconds));
  build_hierarchy();
  executor_ = std::make_shared<Executor>(
      [this](std::exception_ptr e) {
        // A wait that timed out: the collective stuck is the first one not completed here.
        on_collective_failed(history_->first_unfinished(), e);
      },
      ExecutorOptions{.spin = device_->spin(),
                      .spin_inside_collectives = !device_->oversubscribed()});
  executor_->start();
  transport::Device::GroupHandlers handlers;
  handlers.mark = [this](uint32_t seq, std::exception_ptr e) {
    std::lock_guard lock(mu_);
    if (!failure_) {
      failure_ = e;
      failed_seq_ = seq;
      failed_.store(true, std::memory_order_release);
    }
  };
  handlers.handle = [this](uint32_t seq, std::exception_ptr error) {
    // The hierarchy's groups run inside this group's collectives. One before #seq, running
    // here, goes on (the reporter completed it; see Pair::fail_group), its inner collectives
    // too; later ones fail at their start.
    if (static_cast<int32_t>(history_->first_unfinished() - seq) >= 0 || seq == 0)
      fail_internal_groups(error);
    // Arrived before the statement ("called ..."), as in run_collective's failure: a peer that
    // finds the statement must not count this rank among those that never came (failure records'
    // `silent`).
    if (size_ > 1 && seq != 0 && history_->call(seq)) watchdog_->publish_called(seq);
    publish_postmortem(*store_, name_, rank_, seq, history_->describe(seq));
  };
  handlers.mismatch = [this](uint32_t seq, int peer, uint64_t theirs, uint64_t ours) {
    int group_peer = peer;
    for (int i = 0; i < size_; ++i)
      if (members_[i] == peer) group_peer = i;
    const CollectiveCall their_call = CollectiveCall::from_fingerprint(theirs);
    const std::string where = fmt::format("collective #{} of group {}", seq, name_);
    std::string text;
    if (ours != 0) {
      text = mismatch_message(rank_, where, group_peer, their_call,
                              "called " + CollectiveCall::from_fingerprint(ours).describe());
    } else if (auto mine = history_->call(seq); mine && mine->fingerprint() == theirs) {
      text = fmt::format(
          "rank {}: {}, {}: rank {} sent a message this rank never received: the two ran it with "
          "different algorithms; DTRAIN_ALGO and the `algorithm` option must be the same on "
          "every rank",
          rank_, where, their_call.describe(), group_peer);
    } else {
      // The collective is over here: without this check both ranks would have gone on.
      text = mismatch_message(rank_, where, group_peer, their_call, history_->describe(seq));
      DTRAIN_LOG_ERROR("{} (the next collective of the group fails here)", text);
    }
    auto error = std::make_exception_ptr(InvalidArgumentError(text));
    std::lock_guard lock(mu_);
    if (!mismatch_) {
      mismatch_ = error;
      mismatch_seq_ = seq;
    }
    return error;
  };
  device_->register_group(group_id_, std::move(handlers));
}

void NativeProcessGroup::build_hierarchy() {
  std::vector<std::string> hosts, racks;
  for (int m : members_) {
    hosts.push_back(device_->host_of(m));
    racks.push_back(device_->rack_of(m));
  }
  const HierarchyPlan plan = plan_hierarchy(hosts, racks, rank_, split_);
  // What the cost model needs to know even of a group that does not split.
  topology_.spans_racks = plan.spans_racks;
  if (plan.parts.empty()) return;

  auto& h = hierarchy_;
  h.part = plan.part;
  h.index = plan.index;
  h.uniform = plan.uniform;
  h.my_part = plan.my_part;
  h.order.clear();
  if (!plan.in_order)
    for (const auto& p : plan.parts) h.order.insert(h.order.end(), p.begin(), p.end());
  topology_.level = plan.level;
  topology_.hosts = static_cast<int>(plan.parts.size());
  topology_.per_host = plan.per_part;
  topology_.uniform = plan.uniform;
  topology_.host_contiguous = plan.in_order && plan.uniform;
  if (plan.level == Topology::Level::kHosts) {
    topology_.racks = plan.racks;
    topology_.hosts_per_rack = plan.hosts_per_rack;
  }

  std::vector<int> local, cross;
  for (int r : plan.parts[plan.my_part]) local.push_back(members_[r]);
  for (int r : plan.cross) cross.push_back(members_[r]);
  auto id = [&](const std::string& what) {
    uint32_t v = static_cast<uint32_t>(fnv1a(fmt::format("{}/{}", group_id_, what)) & 0xffffffu);
    return v == 0 ? 1u : v;
  };
  const char* unit = plan.level == Topology::Level::kHosts ? "host" : "rack";
  local_group_ = std::make_shared<NativeProcessGroup>(
      *this, std::move(local), id(fmt::format("local{}", plan.my_part)),
      fmt::format("{}.{}{}", name_, unit, plan.my_part), Split::kNone);
  if (!cross.empty()) {
    // A split by host leaves its cross groups to split by rack.
    cross_group_ = std::make_shared<NativeProcessGroup>(
        *this, std::move(cross), id(fmt::format("cross{}", plan.cross_index)),
        fmt::format("{}.cross{}", name_, plan.cross_index),
        plan.level == Topology::Level::kHosts ? Split::kRacks : Split::kNone);
    share_links(topology_.nic_sharers);
  }
  h.local = local_group_.get();
  h.cross = cross_group_.get();
  DTRAIN_LOG_DEBUG(
      "rank {}: group {} spans {} {}s ({} ranks on the largest{}): hierarchical "
      "collectives available",
      rank_, name_, plan.parts.size(), unit, plan.per_part, h.uniform ? ", all alike" : "");
}

std::string NativeProcessGroup::hierarchy() const {
  if (!local_group_) return "split=none";
  std::string text =
      fmt::format("split={} parts={} per_part={} {}",
                  topology_.level == Topology::Level::kHosts ? "hosts" : "racks", topology_.hosts,
                  topology_.per_host, hierarchy_.uniform ? "uniform" : "uneven");
  if (cross_group_) text += "; cross: " + cross_group_->hierarchy();
  return text;
}

void NativeProcessGroup::share_links(int groups) {
  topology_.nic_sharers = groups;
  // The cross groups of uniform parts run at once over the same links.
  if (cross_group_)
    cross_group_->share_links(groups * (hierarchy_.uniform ? topology_.per_host : 1));
}

std::string NativeProcessGroup::postmortem(uint32_t seq, const std::string& entry) {
  publish_postmortem(*store_, name_, rank_, seq, entry);
  // Under `dtrain run`, how a peer whose connection broke ended (it failed, rather than left),
  // waited for once and for all of them together: a peer that is alive (it aborted the group)
  // or on another node leaves no word here. Under --live the survivors re-form at once, and
  // their agreement waits for the launchers' words itself.
  const Deadline words = Deadline::after(env::get_bool(env::kLive) ? std::chrono::milliseconds(0)
                                                                   : std::chrono::seconds(2));
  std::map<int, std::string> word_of;
  // Ranks whose connection broke will never write: the wait is for the live ones only.
  return collect_postmortem(
      *store_, name_, size_, seq, std::chrono::seconds(3),
      [this, &words, &word_of](int r) -> std::optional<std::string> {
        if (r == rank_) return std::nullopt;
        switch (device_->pair(members_[r])->broken_by()) {
          case transport::Pair::BrokenBy::kNothing:
            return std::nullopt;
          case transport::Pair::BrokenBy::kPeer: {
            std::string& word = word_of[r];
            if (word.empty()) word = launcher_exit_word(members_[r], words.remaining());
            if (!word.empty()) return fmt::format("gone: its process {} (dtrain run)", word);
            return "gone (its connection broke)";
          }
          case transport::Pair::BrokenBy::kTimeout:
            // A stopped (SIGSTOP) or stuck rank: alive, silent, its connection closed by us.
            return "did not answer within the limit (stopped or stuck: the connection was "
                   "closed here when a message to or from it was cut short)";
          case transport::Pair::BrokenBy::kUs:
            return "its connection was closed here";
        }
        return std::nullopt;
      });
}

std::string NativeProcessGroup::peers_failed() const {
  std::string out;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || pairs_[r]->broken_by() != transport::Pair::BrokenBy::kPeer) continue;
    // The post-mortem waited for the launcher's word already.
    const std::string word = launcher_exit_word(members_[r], std::chrono::milliseconds(0));
    if (!word.empty() && word != "exited with code 0")
      out += fmt::format("{} rank {}'s process {} (dtrain run)", out.empty() ? ":" : ";", r, word);
  }
  return out;
}

NativeProcessGroup::~NativeProcessGroup() {
  auto error = std::make_exception_ptr(
      AbortedError(fmt::format("rank {}: group {} was destroyed", rank_, name_)));
  device_->unregister_group(group_id_);
  // Fail what is pending here (without telling the peers: they see the goodbye), so that the
  // worker thread can be joined.
  device_->fail_group(group_id_, 0, {}, error, {});
  executor_->shutdown(error);
}

std::string NativeProcessGroup::algorithm_for(CollectiveKind kind, std::string_view requested,
                                              size_t bytes) const {
  return std::string(choose(kind, requested, bytes).name);
}

void NativeProcessGroup::on_collective_failed(uint32_t seq, std::exception_ptr error) {
  {
    std::lock_guard lock(mu_);
    if (failure_) return;
    failure_ = error;
    failed_.store(true, std::memory_order_release);
    // A mismatch found once its collective was over is what the peers are told to explain.
    failed_seq_ = seq = mismatch_seq_ != 0 ? mismatch_seq_ : seq;
  }
  const std::string text =
      fmt::format("rank {} (world rank {}) reports: {}", rank_, members_[rank_], message_of(error));
  DTRAIN_LOG_ERROR("{}", message_of(error));
  std::vector<int> peers;
  for (int m : members_)
    if (m != device_->rank()) peers.push_back(m);
  device_->fail_group(group_id_, make_tag(TagSpace::kCollective, group_id_, seq), peers,
                      std::make_exception_ptr(PeerFailureError(text)), text);
  fail_internal_groups(std::make_exception_ptr(PeerFailureError(text)));
}

std::exception_ptr NativeProcessGroup::failure_from(uint32_t seq) {
  if (!failed_.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard lock(mu_);
  if (!failure_ || (failed_seq_ != 0 && static_cast<int32_t>(seq - failed_seq_) < 0))
    return nullptr;
  return failure_;
}

void NativeProcessGroup::fail_internal_groups(std::exception_ptr error) {
  // The hierarchy's groups run inside this group's collectives: a rank waiting in one of them
  // must not wait for a peer that has given up on the whole group.
  for (const auto& g : {local_group_, cross_group_}) {
    if (!g) continue;
    {
      std::lock_guard lock(g->mu_);
      if (!g->failure_) g->failure_ = error;
      g->failed_.store(true, std::memory_order_release);
    }
    device_->fail_group(g->group_id_, 0, {}, error, {});
    g->fail_internal_groups(error);  // a cross group split again by rack
  }
}

// ---- point to point ----

uint64_t NativeProcessGroup::record_p2p(FlightCall::Kind kind, size_t bytes, int peer, int tag,
                                        const void* caller, const Deadline& deadline) {
  if (internal()) return 0;
  FlightCall call{.kind = kind,
                  .group = flight_group_,
                  .peer = peer,
                  .tag = tag,
                  .caller = caller,
                  .enqueued = deadline.start()};
  call.call.count = bytes;
  return FlightRecorder::global().record(call);
}

std::shared_ptr<Work> NativeProcessGroup::isend(const TensorView& tensor, int dst, int tag,
                                                const SendOptions& options) {
  if (on_cuda(tensor))
    return stage_cuda(
        info(), "send", {{tensor, Staging::kIn}}, deadline_for(options.timeout),
        [&](auto h, auto left) { return isend(h[0], dst, tag, with_timeout(options, left)); });
  check_peer(info(), dst, tensor, "send");
  uint64_t t = make_tag(TagSpace::kPointToPoint, group_id_, static_cast<uint32_t>(tag));
  const Deadline deadline = deadline_for(options.timeout);
  const uint64_t flight = record_p2p(FlightCall::Kind::kSend, tensor.nbytes(), dst, tag,
                                     __builtin_return_address(0), deadline);
  return std::make_shared<PairWork>(pair_of(dst).isend(t, tensor.data, tensor.nbytes(), deadline),
                                    flight);
}

std::shared_ptr<Work> NativeProcessGroup::irecv(const TensorView& tensor, int src, int tag,
                                                const RecvOptions& options) {
  if (on_cuda(tensor))
    return stage_cuda(
        info(), "recv", {{tensor, Staging::kOut}}, deadline_for(options.timeout),
        [&](auto h, auto left) { return irecv(h[0], src, tag, with_timeout(options, left)); });
  check_peer(info(), src, tensor, "recv");
  uint64_t t = make_tag(TagSpace::kPointToPoint, group_id_, static_cast<uint32_t>(tag));
  const Deadline deadline = deadline_for(options.timeout);
  const uint64_t flight = record_p2p(FlightCall::Kind::kRecv, tensor.nbytes(), src, tag,
                                     __builtin_return_address(0), deadline);
  return std::make_shared<PairWork>(pair_of(src).irecv(t, tensor.data, tensor.nbytes(), deadline),
                                    flight);
}

std::shared_ptr<Work> NativeProcessGroup::irecv_any(const TensorView& tensor, int tag,
                                                    const RecvOptions& options) {
  if (on_cuda(tensor))
    return stage_cuda(
        info(), "recv", {{tensor, Staging::kOut}}, deadline_for(options.timeout),
        [&](auto h, auto left) { return irecv_any(h[0], tag, with_timeout(options, left)); });
  check_tensor(info(), tensor, "recv from any source", "the tensor");
  std::vector<AnySourceWork::Peer> peers;
  for (int r = 0; r < size_; ++r)
    if (r != rank_) peers.push_back({r, device_->pair(members_[r])});
  uint64_t t = make_tag(TagSpace::kPointToPoint, group_id_, static_cast<uint32_t>(tag));
  return std::make_shared<AnySourceWork>(
      std::move(peers), t, tensor, deadline_for(options.timeout),
      fmt::format("rank {}: recv from any source of group {}, tag {}, {} bytes", rank_, name_, tag,
                  tensor.nbytes()));
}

// ---- collectives ----

NativeProcessGroup::Blocks NativeProcessGroup::Blocks::equal(int ranks, size_t block) {
  Blocks b{std::vector<size_t>(ranks), std::vector<size_t>(ranks, block)};
  for (int i = 0; i < ranks; ++i) b.offsets[i] = i * block;
  return b;
}

NativeProcessGroup::Blocks NativeProcessGroup::Blocks::of(const std::vector<size_t>& counts,
                                                          size_t element_size) {
  Blocks b{std::vector<size_t>(counts.size()), std::vector<size_t>(counts.size())};
  size_t off = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    b.offsets[i] = off;
    b.sizes[i] = counts[i] * element_size;
    off += b.sizes[i];
  }
  return b;
}

const algo::Algorithm& NativeProcessGroup::choose(CollectiveKind kind, std::string_view requested,
                                                  size_t bytes) const {
  if (!requested.empty()) return cost_model_.choose(kind, requested, bytes, size_, topology_);
  // The model's answer for a (kind, size) does not change: remember the recent ones.
  const auto all = algo::registry();
  static_assert(sizeof(CollectiveKind) == 1);
  constexpr int kBytesBits = 48;
  const uint64_t key = (uint64_t{static_cast<uint8_t>(kind)} << kBytesBits) | bytes;
  const bool cached = bytes < (uint64_t{1} << kBytesBits);
  auto& slot = choices_[(static_cast<size_t>(kind) * 31 + std::bit_width(bytes) * 7 + bytes) %
                        choices_.size()];
  const uint64_t c = slot.load(std::memory_order_relaxed);
  if (cached && c != 0 && (c & ((uint64_t{1} << (kBytesBits + 8)) - 1)) == key)
    return *all[(c >> (kBytesBits + 8)) - 1];
  const algo::Algorithm& chosen = cost_model_.choose(kind, {}, bytes, size_, topology_);
  const auto at = std::find(all.begin(), all.end(), &chosen) - all.begin();
  if (cached && at < 255)
    slot.store((static_cast<uint64_t>(at + 1) << (kBytesBits + 8)) | key,
               std::memory_order_relaxed);
  return chosen;
}

void NativeProcessGroup::forget_choices() {
  for (auto& c : choices_) c.store(0, std::memory_order_relaxed);
}

namespace {

// Where a failure's flight record went, for its error: "" when none was written.
std::string flight_record_note(const std::string& record) {
  if (record.empty()) return "";
  return fmt::format(". Flight record: {} (`dtrain doctor {}` reads every rank's)", record,
                     std::filesystem::path(record).parent_path().string());
}

// What a synchronous collective that ran inline and succeeded returns: done, no error. One for
// every such call (it never changes), so that the call allocates nothing.
class FinishedWork final : public Work {
 public:
  bool is_completed() override { return true; }
  std::exception_ptr exception() const override { return nullptr; }

 protected:
  void wait_until_done(std::optional<std::chrono::milliseconds>) override {}
};

const std::shared_ptr<Work>& finished_work() {
  static const std::shared_ptr<Work> done = std::make_shared<FinishedWork>();
  return done;
}

}  // namespace

void NativeProcessGroup::tell_launcher(const std::exception_ptr& error, const std::string& context,
                                       const std::vector<int>& not_arrived) const {
  FailureRecord r{.rank = members_[rank_]};
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    r.kind = to_string(e.kind());
    r.peer_caused = e.kind() == ErrorKind::kPeerFailure;
    r.what = context + ": " + e.what();
  } catch (const std::exception& e) {
    r.kind = to_string(ErrorKind::kInternal);
    r.what = context + ": " + e.what();
  } catch (...) {
    r.kind = to_string(ErrorKind::kInternal);
    r.what = context;
  }
  // Silent: ranks whose connection this rank closed when they stopped answering, and those that
  // never arrived at the collective (behind: stuck in compute, or gone).
  for (int g = 0; g < size_; ++g)
    if (g != rank_ && (pairs_[g]->broken_by() == transport::Pair::BrokenBy::kTimeout ||
                       std::find(not_arrived.begin(), not_arrived.end(), g) != not_arrived.end()))
      r.silent.push_back(members_[g]);
  write_failure_record(r);
}

template <typename Body>
void NativeProcessGroup::run_collective(const CollectiveWork::Label& label, Deadline deadline,
                                        std::string_view algorithm,
                                        const std::exception_ptr& mismatched, Body& body,
                                        bool queued) {
  const CollectiveCall& call = label.call;
  const uint32_t seq = label.seq;
  CollectiveContext ctx(rank_, size_, pairs_, make_tag(TagSpace::kCollective, group_id_, seq), call,
                        deadline, name_, seq);
  ctx.set_buffers(&scratch_, &workspace_);
  ctx.set_persistent(&persistent_);
  device_->expect(group_id_, seq, call.fingerprint());
  DTRAIN_LOG_DEBUG("{} via {}", label.describe(), algorithm);
  watchdog_->enter(seq, call, deadline);
  FlightRecorder& recorder = FlightRecorder::global();
  // A call run inline starts as it is recorded: marking it would only cost the call.
  if (queued) recorder.started(*history_, seq);
  try {
    if (mismatched) std::rethrow_exception(mismatched);
    if (auto failed = failure_from(seq)) std::rethrow_exception(failed);
    const Agreement agreement = size_ > 1 ? agreement_of(call.kind) : Agreement::kNone;
    if (agreement == Agreement::kBefore) algo::barrier_dissemination(ctx);
    body(ctx);
    if (agreement == Agreement::kAfter) algo::barrier_dissemination(ctx);
  } catch (...) {
    // Tell the peers first (they fail at once), then ask everyone what they called.
    on_collective_failed(seq, std::current_exception());
    recorder.finished(*history_, seq, false);
    const std::string record = recorder.dump_on_failure(label.describe() + " failed");
    // When a peer reported an earlier collective failed, that one is what to explain.
    uint32_t failed_seq;
    {
      std::lock_guard lock(mu_);
      failed_seq = failed_seq_ != 0 ? failed_seq_ : seq;
    }
    const std::string entry = failed_seq == seq
                                  ? fmt::format("called {} and failed", call.describe())
                                  : history_->describe(failed_seq);
    // Arrived before the statement: a peer that waits for the statement finds the arrival, and
    // does not call this rank "not arrived" beside "rank R called ... and failed".
    if (size_ > 1 && failed_seq == seq) watchdog_->publish_arrival(seq);
    std::string after = postmortem(failed_seq, entry);
    Watchdog::Arrivals arrived;
    if (size_ > 1 && failed_seq == seq) {
      arrived = watchdog_->arrivals(seq);
      after += "; " + arrived.text;
    }
    watchdog_->leave();
    after += flight_record_note(record);
    const std::string context = label.describe() + " failed" + peers_failed();
    tell_launcher(std::current_exception(), context + ". Post-mortem: " + after,
                  arrived.not_arrived);
    rethrow_with_context(std::current_exception(), context, "Post-mortem: " + after);
  }
  watchdog_->leave();
  recorder.finished(*history_, seq, true);
}

template <typename Body>
std::shared_ptr<Work> NativeProcessGroup::submit(const CollectiveCall& call,
                                                 std::string_view algorithm,
                                                 std::chrono::milliseconds timeout, bool async_op,
                                                 Body body, const void* caller) {
  const Deadline deadline = deadline_for(timeout);
  FlightRecorder& recorder = FlightRecorder::global();
  uint32_t seq, failed_seq;
  std::exception_ptr failed, mismatched;
  {
    std::lock_guard lock(mu_);
    seq = ++next_seq_;
    failed = failure_;
    failed_seq = failed_seq_;
    mismatched = mismatch_;
    if (internal())
      history_->called(seq, call);
    else
      recorder.called(*history_, flight_group_, seq, call, algorithm.data(), caller,
                      deadline.start());
  }
  // Described only when something goes wrong: formatting costs more than a small collective.
  CollectiveWork::Label label{rank_, call, seq, name_};
  if (failed) {
    recorder.finished(*history_, seq, false);
    if (size_ > 1 && failed_seq == seq) watchdog_->publish_call(seq);
    const std::string since =
        failed_seq == seq ? std::string("a peer failed it")
        : failed_seq == 0
            ? std::string("the group is unusable")
            : fmt::format("the group is unusable since collective #{} failed", failed_seq);
    // A peer's failure, heard before this call: the record says what this rank was calling, for
    // `dtrain doctor` to put beside the others'.
    const std::string record = recorder.dump_on_failure(label.describe() + " cannot start");
    auto work = std::make_shared<CollectiveWork>(nullptr, deadline, label, executor_);
    work->fail(std::make_exception_ptr(
        PeerFailureError(fmt::format("{} cannot start: {}: {}{}", label.describe(), since,
                                     message_of(failed), flight_record_note(record)))));
    return work;
  }
  if (!async_op) {
    std::exception_ptr error;
    if (executor_->run_inline(
            [&] { run_collective(label, deadline, algorithm, mismatched, body, false); }, error)) {
      if (!error) return finished_work();
      auto work = std::make_shared<CollectiveWork>(nullptr, deadline, label, executor_);
      work->fail(error);
      return work;
    }
  }
  auto work = std::make_shared<CollectiveWork>(
      [this, label, deadline, algorithm, mismatched, body = std::move(body)]() mutable {
        run_collective(label, deadline, algorithm, mismatched, body, true);
      },
      deadline, label, executor_);
  if (async_op)
    executor_->submit(work, async_grace_);
  else
    executor_->run_here(work);
  return work;
}

template <typename Options, typename Again>
std::shared_ptr<Work> NativeProcessGroup::on_host(std::string_view op,
                                                  std::initializer_list<StagedTensor> tensors,
                                                  const Options& o, Again again) {
  return stage_cuda(info(), op, tensors, deadline_for(o.timeout),
                    [&](std::span<const TensorView> host, std::chrono::milliseconds left) {
                      return again(host, with_timeout(o, left));
                    });
}

template <typename Options>
std::shared_ptr<Work> NativeProcessGroup::collective(const CollectiveCall& call, const Options& o,
                                                     size_t bytes, Args args, const void* caller) {
  std::string_view requested;
  if constexpr (requires { o.algorithm; }) requested = o.algorithm;
  const algo::Algorithm* a = &choose(call.kind, requested, bytes);
  // The average divides where the result lands: every rank, or the root of a reduce.
  const bool average = call.op == ReduceOp::kAvg;
  const int root_only = call.kind == CollectiveKind::kReduce ? call.root : -1;
  return submit(
      call, a->name, o.timeout, o.async_op,
      [this, a, args = std::move(args), average, root_only](CollectiveContext& ctx) {
        a->run({.ctx = ctx,
                .out = args.out,
                .in = args.in,
                .op = args.op,
                .root = args.root,
                .hierarchy = &hierarchy_,
                .out_offsets = args.out_blocks.offsets,
                .out_sizes = args.out_blocks.sizes,
                .in_offsets = args.in_blocks.offsets,
                .in_sizes = args.in_blocks.sizes});
        if (average && !a->averages && (root_only < 0 || ctx.rank() == root_only))
          scale_down(args.out.data, args.out.numel, args.out.dtype,
                     static_cast<size_t>(ctx.size()));
      },
      caller);
}

std::shared_ptr<Work> NativeProcessGroup::broadcast(const TensorView& t,
                                                    const BroadcastOptions& o) {
  if (on_cuda(t))
    return on_host("broadcast", {{t, Staging::kInOut}}, o,
                   [&](auto h, const auto& left) { return broadcast(h[0], left); });
  check_tensor(info(), t, "broadcast", "the tensor");
  check_root(info(), o.root, "broadcast");
  return collective({CollectiveKind::kBroadcast, t.dtype, ReduceOp::kSum, o.root, t.numel}, o,
                    t.nbytes(), {.out = t, .root = o.root}, __builtin_return_address(0));
}

std::shared_ptr<Work> NativeProcessGroup::allreduce(const TensorView& t,
                                                    const AllreduceOptions& o) {
  if (on_cuda(o.error))
    return on_host("all_reduce", {{t, Staging::kInOut}, {o.error, Staging::kInOut}}, o,
                   [&](auto h, auto left) {
                     left.error = h[1];
                     return allreduce(h[0], left);
                   });
  if (on_cuda(t))
    return on_host("all_reduce", {{t, Staging::kInOut}}, o,
                   [&](auto h, const auto& left) { return allreduce(h[0], left); });
  check_tensor(info(), t, "all_reduce", "the tensor");
  check_wire(info(), t, o);
  if (o.wire != Wire::kExact) {
    auto* error = o.error.numel > 0 ? static_cast<float*>(o.error.data) : nullptr;
    return submit(
        {collective_of(o.wire), t.dtype, o.op, 0, t.numel}, to_string(o.wire), o.timeout,
        o.async_op,
        [t, error, wire = o.wire, average = o.op == ReduceOp::kAvg](CollectiveContext& ctx) {
          quantized_allreduce(ctx, wire, static_cast<float*>(t.data), error, t.numel, average);
        },
        __builtin_return_address(0));
  }
  check_reduce_op(t.dtype, o.op);
  return collective({CollectiveKind::kAllreduce, t.dtype, o.op, 0, t.numel}, o, t.nbytes(),
                    {.out = t, .op = o.op}, __builtin_return_address(0));
}

std::shared_ptr<Work> NativeProcessGroup::reduce(const TensorView& t, const ReduceOptions& o) {
  if (on_cuda(t))
    return on_host("reduce", {{t, Staging::kInOut}}, o,
                   [&](auto h, const auto& left) { return reduce(h[0], left); });
  check_tensor(info(), t, "reduce", "the tensor");
  check_root(info(), o.root, "reduce");
  check_reduce_op(t.dtype, o.op);
  return collective({CollectiveKind::kReduce, t.dtype, o.op, o.root, t.numel}, o, t.nbytes(),
                    {.out = t, .op = o.op, .root = o.root}, __builtin_return_address(0));
}

std::shared_ptr<Work> NativeProcessGroup::allgather(const TensorView& out, const TensorView& in,
                                                    const AllgatherOptions& o) {
  if (on_cuda(out) || on_cuda(in))
    return on_host("all_gather", {{out, Staging::kOut}, {in, Staging::kIn}}, o,
                   [&](auto h, const auto& left) { return allgather(h[0], h[1], left); });
  check_allgather(info(), out, in);
  return collective({CollectiveKind::kAllgather, in.dtype, ReduceOp::kSum, 0, in.numel}, o,
                    in.nbytes(),
                    {.out = out, .in = in, .out_blocks = Blocks::equal(size_, in.nbytes())},
                    __builtin_return_address(0));
}

std::shared_ptr<Work> NativeProcessGroup::allgatherv(const TensorView& out, const TensorView& in,
                                                     const std::vector<size_t>& counts,
                                                     const AllgatherOptions& o) {
  if (on_cuda(out) || on_cuda(in))
    return on_host("all_gather_v", {{out, Staging::kOut}, {in, Staging::kIn}}, o,
                   [&](auto h, const auto& left) { return allgatherv(h[0], h[1], counts, left); });
  check_allgatherv(info(), out, in, counts);
  return collective(
      {CollectiveKind::kAllgatherv, in.dtype, ReduceOp::kSum, 0, digest_counts(counts)}, o,
      in.nbytes(), {.out = out, .in = in, .out_blocks = Blocks::of(counts, element_size(in.dtype))},
      __builtin_return_address(0));
}

std::shared_ptr<Work> NativeProcessGroup::gather(const TensorView& out, const TensorView& in,
                                                 const GatherOptions& o) {
  if (on_cuda(out) || on_cuda(in))
    return on_host("gather", {{out, Staging::kOut}, {in, Staging::kIn}}, o,
                   [&](auto h, const auto& left) { return gather(h[0], h[1], left); });
  check_gather(info(), out, in, o.root);
  return collective({CollectiveKind::kGather, in.dtype, ReduceOp::kSum, o.root, in.numel}, o,
                    in.nbytes(), {.out = out, .in = in}, __builtin_return_address(0));
}

std::shared_ptr<Work> NativeProcessGroup::scatter(const TensorView& out, const TensorView& in,
                                                  const ScatterOptions& o) {
  if (on_cuda(out) || on_cuda(in))
    return on_host("scatter", {{out, Staging::kOut}, {in, Staging::kIn}}, o,
                   [&](auto h, const auto& left) { return scatter(h[0], h[1], left); });
  check_scatter(info(), out, in, o.root);
  return collective({CollectiveKind::kScatter, out.dtype, ReduceOp::kSum, o.root, out.numel}, o,
                    out.nbytes(), {.out = out, .in = in}, __builtin_return_address(0));
}

std::shared_ptr<Work> NativeProcessGroup::reduce_scatter(const TensorView& out,
                                                         const TensorView& in,
                                                         const ReduceScatterOptions& o) {
  if (on_cuda(out) || on_cuda(in))
    return on_host("reduce_scatter", {{out, Staging::kOut}, {in, Staging::kIn}}, o,
                   [&](auto h, const auto& left) { return reduce_scatter(h[0], h[1], left); });
  check_reduce_scatter(info(), out, in);
  check_reduce_op(in.dtype, o.op);
  return collective({CollectiveKind::kReduceScatter, out.dtype, o.op, 0, out.numel}, o, in.nbytes(),
                    {.out = out, .in = in, .op = o.op}, __builtin_return_address(0));
}

std::shared_ptr<Work> NativeProcessGroup::alltoall(const TensorView& out, const TensorView& in,
                                                   const AlltoallOptions& o) {
  if (on_cuda(out) || on_cuda(in))
    return on_host("all_to_all", {{out, Staging::kOut}, {in, Staging::kIn}}, o,
                   [&](auto h, const auto& left) { return alltoall(h[0], h[1], left); });
  check_alltoall(info(), out, in);
  Blocks blocks = Blocks::equal(size_, in.nbytes() / size_);
  return collective({CollectiveKind::kAlltoall, in.dtype, ReduceOp::kSum, 0, in.numel}, o,
                    in.nbytes() / size_,
                    {.out = out, .in = in, .out_blocks = blocks, .in_blocks = blocks},
                    __builtin_return_address(0));
}

std::shared_ptr<Work> NativeProcessGroup::alltoallv(const TensorView& out,
                                                    const std::vector<size_t>& out_counts,
                                                    const TensorView& in,
                                                    const std::vector<size_t>& in_counts,
                                                    const AlltoallOptions& o) {
  if (on_cuda(out) || on_cuda(in))
    return on_host("all_to_all_v", {{out, Staging::kOut}, {in, Staging::kIn}}, o,
                   [&](auto h, const auto& left) {
                     return alltoallv(h[0], out_counts, h[1], in_counts, left);
                   });
  check_alltoallv(info(), out, out_counts, in, in_counts);
  const size_t element = element_size(in.dtype);
  return collective({CollectiveKind::kAlltoallv, in.dtype, ReduceOp::kSum, 0, 0}, o,
                    in.nbytes() / size_,
                    {.out = out,
                     .in = in,
                     .out_blocks = Blocks::of(out_counts, element),
                     .in_blocks = Blocks::of(in_counts, element)},
                    __builtin_return_address(0));
}

std::shared_ptr<Work> NativeProcessGroup::barrier(const BarrierOptions& o) {
  return collective({CollectiveKind::kBarrier, DType::kU8, ReduceOp::kSum, 0, 0}, o, 0, {},
                    __builtin_return_address(0));
}

std::shared_ptr<ProcessGroup> NativeProcessGroup::new_group(const std::vector<int>& ranks) {
  check_new_group(info(), ranks);
  uint32_t child;
  {
    std::lock_guard lock(mu_);
    child = ++children_;
  }
  // Every rank of this group computes the same id: from this group's id, the call's ordinal
  // and the member list. 0 is the world's.
  const std::string key = fmt::format("{}/{}/{}", group_id_, child, fmt::join(ranks, ","));
  uint32_t id = static_cast<uint32_t>(fnv1a(key) & 0xffffffu);
  if (id == 0) id = 1;
  if (std::find(ranks.begin(), ranks.end(), rank_) == ranks.end()) return nullptr;
  std::vector<int> world;
  for (int r : ranks) world.push_back(members_[r]);
  auto name = fmt::format("{}.{}", name_, child);
  return std::make_shared<NativeProcessGroup>(*this, std::move(world), id, std::move(name));
}

void NativeProcessGroup::abort(const std::string& reason) {
  DTRAIN_LOG_WARN("rank {}: group {} aborted: {}", rank_, name_, reason);
  auto error = std::make_exception_ptr(
      AbortedError(fmt::format("rank {}: group {} was aborted: {}", rank_, name_, reason)));
  {
    std::lock_guard lock(mu_);
    if (!failure_) failure_ = error;
    failed_.store(true, std::memory_order_release);
  }
  if (group_id_ == 0) {
    device_->abort(error);
  } else {
    std::vector<int> peers;
    for (int m : members_)
      if (m != device_->rank()) peers.push_back(m);
    device_->fail_group(group_id_, make_tag(TagSpace::kCollective, group_id_, 0), peers, error,
                        fmt::format("rank {} aborted group {}: {}", rank_, name_, reason));
  }
}

}  // namespace comm
}  // namespace dtrain
