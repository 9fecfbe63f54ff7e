#include "transport/device.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/log.h"
#include "dtrain/error.h"
#include "transport/full_mesh.h"
#include "transport/host.h"
#include "transport/shm/setup.h"
#include "transport/tag.h"

namespace dtrain::transport {

Device::Device(Store& store, const DeviceOptions& options)
    : options_(options),
      loop_(std::make_shared<Loop>([this] { process_notices(); },
                                   [this] {
                                     for (auto& p : pairs_)
                                       if (p) p->unpark();
                                   })) {
  const int rank = options_.rank;
  const int size = options_.size;
  pairs_.resize(size);
  hosts_.assign(size, host_identity());
  racks_.assign(size, rack_identity(options_.advertise_addr));
  if (size == 1) return;

  const auto deadline = Deadline::after(options_.connect_timeout);
  FullMesh mesh(store,
                {.rank = rank,
                 .size = size,
                 .group_name = options_.group_name,
                 .group_tag = options_.group_tag,
                 .listen_host = options_.listen_host,
                 .advertise_addr = options_.advertise_addr,
                 .handshake = options_.handshake},
                deadline, hosts_[rank] + '\n' + racks_[rank]);
  address_ = mesh.address();
  std::vector<net::Fd> fds = mesh.connect();
  learn_locations(mesh);
  note_oversubscription();
  std::vector<shm::Segment> segments = share_memory(fds, deadline);
  make_pairs(mesh, fds, segments);
  // Nobody starts before everybody is connected: a fast rank must not run ahead, fail, and take
  // the store (or itself) away from ranks still connecting.
  mesh.wait_for_all();
  DTRAIN_LOG_DEBUG("rank {}: group {} connected to {} peers in {:.1f} ms", rank,
                   options_.group_name, size - 1, deadline.elapsed().count() * 1.0);
}

void Device::learn_locations(FullMesh& mesh) {
  for (int peer = 0; peer < options_.size; ++peer) {
    if (peer == options_.rank) continue;
    const std::string where = mesh.location_of(peer);
    const auto cut = where.find('\n');
    hosts_[peer] = where.substr(0, cut);
    racks_[peer] = cut == std::string::npos ? "" : where.substr(cut + 1);
  }
}

void Device::note_oversubscription() {
  // Ranks in other network namespaces of this machine (containers, pods of one node, emulated
  // hosts) are other "hosts" but share its cores: counted with this host's, they can make it
  // oversubscribed, where a waiting rank must yield rather than spin.
  const std::string& self = hosts_[options_.rank];
  const auto on_machine = std::count_if(hosts_.begin(), hosts_.end(), [&](const std::string& h) {
    return machine_of(h) == machine_of(self);
  });
  if (on_machine > static_cast<long>(std::max(1u, std::thread::hardware_concurrency())) &&
      !options_.oversubscribed) {
    options_.oversubscribed = true;
    DTRAIN_LOG_DEBUG("rank {}: {} ranks share this machine's {} cores: waits yield", options_.rank,
                     on_machine, std::thread::hardware_concurrency());
  }
}

std::vector<shm::Segment> Device::share_memory(std::vector<net::Fd>& fds,
                                               const Deadline& deadline) {
  const int rank = options_.rank;
  const int size = options_.size;
  if (options_.transport == "tcp") return std::vector<shm::Segment>(size);
  std::vector<bool> local(size, false);
  for (int peer = 0; peer < size; ++peer)
    local[peer] = peer != rank && hosts_[peer] == hosts_[rank];
  const shm::SetupOptions so{rank, size, options_.handshake.job_id, options_.group_name,
                             options_.transport == "shm"};
  return shm::share_memory(so, local, fds, deadline);
}

void Device::make_pairs(FullMesh& mesh, std::vector<net::Fd>& fds,
                        std::vector<shm::Segment>& segments) {
  const int rank = options_.rank;
  std::vector<std::string> via;
  for (int peer = 0; peer < options_.size; ++peer) {
    if (peer == rank) continue;
    net::Fd fd = std::move(fds[peer]);
    std::string peer_addr = peer < rank ? mesh.address_of(peer) : net::peer_name(fd.get());
    const PairOptions po{
        .self_rank = rank,
        .peer_rank = peer,
        .peer_address = std::move(peer_addr),
        .group_name = options_.group_name,
        .spin = options_.spin,
        .oversubscribed = options_.oversubscribed,
        .same_host = hosts_[peer] == hosts_[rank],
        .on_group_failed = [this](uint64_t tag, int from,
                                  std::string text) { on_notice(tag, from, std::move(text)); },
        .on_unexpected = [this](uint64_t tag, uint64_t aux,
                                int from) { note_unexpected(tag, aux, from); }};
    const bool shared = segments[peer].valid();
    via.push_back(fmt::format("{} {}", peer, shared ? "shm" : "tcp"));
    pairs_[peer] =
        std::make_shared<Pair>(loop_, std::move(fd), po, std::move(segments[peer]), peer > rank);
  }
  DTRAIN_LOG_DEBUG("rank {}: group {} reaches rank {}", rank, options_.group_name,
                   fmt::join(via, ", rank "));
}

void Device::register_group(uint32_t group_id, GroupHandlers handlers) {
  std::lock_guard lock(groups_mu_);
  groups_[group_id] = std::move(handlers);
}

void Device::unregister_group(uint32_t group_id) {
  std::lock_guard lock(groups_mu_);
  groups_.erase(group_id);
}

void Device::fail_group(uint32_t group_id, uint64_t tag, const std::vector<int>& peers,
                        std::exception_ptr error, const std::string& text) {
  for (auto& p : pairs_)
    if (p) p->fail_group(group_id, transport::collective_seq_of(tag), error);
  for (int peer : peers)
    if (peer != options_.rank && pairs_[peer]) pairs_[peer]->send_group_failed(tag, text);
}

void Device::expect(uint32_t group_id, uint32_t seq, uint64_t fingerprint) {
  std::lock_guard lock(expect_mu_);
  expected_[group_id] = {seq, fingerprint};
  auto it = seen_.find(group_id);
  if (it == seen_.end()) return;
  const Seen& s = it->second[seq % 8];
  if (s.seq == seq && s.aux != fingerprint)
    mismatch_locked(make_tag(TagSpace::kCollective, group_id, seq), s.peer, s.aux, fingerprint);
}

void Device::note_unexpected(uint64_t tag, uint64_t aux, int peer) {
  if ((tag >> 56) != static_cast<uint64_t>(transport::TagSpace::kCollective) || aux == 0) return;
  const uint32_t gid = static_cast<uint32_t>(tag >> 32) & 0xffffffu;
  const uint32_t seq = static_cast<uint32_t>(tag);
  std::lock_guard lock(expect_mu_);
  if (auto it = expected_.find(gid); it != expected_.end()) {
    const auto [current, fingerprint] = it->second;
    if (current == seq) {
      if (fingerprint != aux) mismatch_locked(tag, peer, aux, fingerprint);
      return;
    }
    // A collective this rank has finished (the group runs them one at a time, in order): its
    // receives were all matched, so nothing will ever take this message. The peer called
    // something else, or the same with another algorithm; left alone, both would go on with
    // different results. `ours` 0: the group looks up what this rank called.
    if (static_cast<int32_t>(seq - current) < 0) {
      mismatch_locked(tag, peer, aux, 0);
      return;
    }
  }
  Seen& s = seen_[gid][seq % 8];
  if (s.seq != seq) s = Seen{seq, aux, peer};
}

void Device::mismatch_locked(uint64_t tag, int peer, uint64_t theirs, uint64_t ours) {
  {
    std::lock_guard lock(groups_mu_);
    const uint32_t gid = static_cast<uint32_t>(tag >> 32) & 0xffffffu;
    auto it = groups_.find(gid);
    if (it == groups_.end() || !it->second.mismatch) return;
    notices_.push_back(
        {tag, peer, {}, it->second.mismatch(static_cast<uint32_t>(tag), peer, theirs, ours)});
  }
  loop_->wake();
}

void Device::on_notice(uint64_t tag, int peer, std::string text) {
  // Called with a pair's lock held: mark the group failed at once (that takes no pair lock),
  // and leave failing its requests on the other pairs to the loop thread.
  {
    std::lock_guard lock(groups_mu_);
    const uint32_t gid = static_cast<uint32_t>(tag >> 32) & 0xffffffu;
    if (auto it = groups_.find(gid); it != groups_.end() && it->second.mark)
      it->second.mark(static_cast<uint32_t>(tag), std::make_exception_ptr(PeerFailureError(text)));
    notices_.push_back({tag, peer, std::move(text)});
  }
  loop_->wake();
}

void Device::process_notices() {
  std::vector<Notice> notices;
  std::map<uint32_t, GroupHandlers> groups;
  {
    std::lock_guard lock(groups_mu_);
    notices.swap(notices_);
    groups = groups_;
  }
  for (auto& n : notices) {
    const uint32_t gid = static_cast<uint32_t>(n.tag >> 32) & 0xffffffu;
    if (n.mismatch) {
      // Fails the group's running collective here, if there is one; its failure path (or the
      // next collective's, which the group fails at its start) tells the peers.
      for (auto& p : pairs_)
        if (p) p->fail_group(gid, transport::collective_seq_of(n.tag), n.mismatch);
      continue;
    }
    auto error = std::make_exception_ptr(PeerFailureError(n.text));
    for (auto& p : pairs_)
      if (p) p->fail_group(gid, transport::collective_seq_of(n.tag), error);
    if (auto it = groups.find(gid); it != groups.end() && it->second.handle)
      it->second.handle(static_cast<uint32_t>(n.tag), error);
  }
}

void Device::abort(std::exception_ptr error) {
  for (auto& p : pairs_)
    if (p) p->poison(error);
}

Device::~Device() {
  auto error = std::make_exception_ptr(AbortedError(fmt::format(
      "rank {}: the process group {} was destroyed", options_.rank, options_.group_name)));
  for (auto& p : pairs_)
    if (p) p->close(error);
  loop_->stop();
}

}  // namespace dtrain::transport
