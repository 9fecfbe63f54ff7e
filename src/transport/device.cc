#include "transport/device.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/deadline.h"
#include "common/env.h"
#include "common/handshake_room.h"
#include "common/log.h"
#include "common/socket.h"
#include "dtrain/error.h"
#include "transport/host.h"
#include "transport/shm/setup.h"
#include "transport/tag.h"

namespace dtrain::transport {
namespace {

std::string address_key(const std::string& group, int rank) {
  return fmt::format("{}/addr/{}", group, rank);
}

}  // namespace

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
  // Listen where the peers dial and no wider: a job on loopback addresses (one machine, its
  // store on 127.0.0.1) is not reachable from other machines.
  std::string listen_host = options_.listen_host;
  if (listen_host.empty() && net::is_loopback(options_.advertise_addr))
    listen_host = options_.advertise_addr;
  net::Fd listener = net::listen_tcp(listen_host, 0);
  address_ = net::HostPort{options_.advertise_addr, net::local_port(listener.get())}.to_string();
  store.set(address_key(options_.group_name, rank), address_);
  // Where this rank is: its host and its rack, in one key (one read per peer at start-up).
  store.set(fmt::format("{}/host/{}", options_.group_name, rank),
            hosts_[rank] + '\n' + racks_[rank]);
  DTRAIN_LOG_DEBUG("rank {}: group {} listens at {}", rank, options_.group_name, address_);

  // Higher ranks dial us while we dial lower ranks.
  std::vector<net::Fd> accepted(size);
  std::string accept_failure;
  std::mutex accept_mu;
  std::condition_variable accept_cv;
  bool accept_done = false;
  std::jthread acceptor([&] {
    accept_higher_ranks(listener.get(), deadline, accepted, accept_failure);
    std::lock_guard lock(accept_mu);
    accept_done = true;
    accept_cv.notify_all();
  });
  // Rank 0 says what the rendezvous waits for, every report interval, so that no minute passes
  // in silence; the other ranks wait for it (or for a lower rank) and stay quiet.
  const auto report_every = env::get_seconds(env::kStragglerSeconds);
  auto next_report = Deadline::after(report_every);
  const std::string joined = fmt::format("{}/connected", options_.group_name);
  auto report = [&] {
    if (rank != 0 || report_every.count() <= 0 || !next_report.expired()) return;
    next_report = Deadline::after(report_every);
    DTRAIN_LOG_INFO("rank 0: group {} rendezvous has waited {}: {}", options_.group_name,
                    deadline.describe(), rendezvous_progress(store, joined));
  };

  std::vector<net::Fd> dialled(size);
  try {
    for (int peer = 0; peer < rank; ++peer) {
      std::vector<std::string> key{address_key(options_.group_name, peer)};
      // Rank 0 reports the rendezvous; while it has not even registered, nobody would, so each
      // rank says what it waits for (workers started by hand, rank 0 failed or not started).
      for (;;) {
        const bool speak = peer == 0 && report_every.count() > 0;
        try {
          store.wait(key, speak ? std::max(std::chrono::milliseconds(1),
                                           std::min(deadline.remaining(), report_every))
                                : deadline.remaining());
          break;
        } catch (const TimeoutError& e) {
          if (!speak) throw;
          if (deadline.expired())
            throw TimeoutError(fmt::format(
                "rank {}: group {} rendezvous: rank 0 has not registered after {} "
                "(DTRAIN_CONNECT_TIMEOUT); it must start, and reach the store, before the others "
                "can connect: see its log ({})",
                rank, options_.group_name, deadline.describe(), e.what()));
          DTRAIN_LOG_INFO(
              "rank {}: group {} rendezvous has waited {}: rank 0 has not registered "
              "yet (it must start, and reach the store, before the others can connect; "
              "see its log)",
              rank, options_.group_name, deadline.describe());
        }
      }
      const std::string addr = store.get_string(key[0]);
      const std::string context = fmt::format("rank {}: connecting group {} to rank {} at {}", rank,
                                              options_.group_name, peer, addr);
      net::Fd fd = net::connect_tcp(net::parse_host_port(addr, "peer address"), deadline, context);
      net::Hello hello{net::Role::kPair, rank, peer, options_.group_tag};
      net::handshake_connect(fd.get(), options_.handshake, hello, peer, deadline, context);
      dialled[peer] = std::move(fd);
    }
  } catch (...) {
    ::shutdown(listener.get(), SHUT_RDWR);  // wakes the acceptor so the error is not delayed
    throw;
  }
  {
    std::unique_lock lock(accept_mu);
    while (!accept_cv.wait_for(lock, std::chrono::milliseconds(250), [&] { return accept_done; })) {
      lock.unlock();
      report();
      lock.lock();
    }
  }
  acceptor.join();
  if (!accept_failure.empty()) throw TimeoutError(accept_failure);

  std::vector<net::Fd> fds(size);
  for (int peer = 0; peer < size; ++peer)
    if (peer != rank)
      fds[peer] = peer < rank ? std::move(dialled[peer]) : std::move(accepted[peer]);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const std::string where =
        store.get_string(fmt::format("{}/host/{}", options_.group_name, peer));
    const auto cut = where.find('\n');
    hosts_[peer] = where.substr(0, cut);
    racks_[peer] = cut == std::string::npos ? "" : where.substr(cut + 1);
  }
  // Ranks in other network namespaces of this machine (containers, pods of one node, emulated
  // hosts) are other "hosts" but share its cores: counted with this host's, they can make it
  // oversubscribed, where a waiting rank must yield rather than spin.
  const auto on_machine = std::count_if(hosts_.begin(), hosts_.end(), [&](const std::string& h) {
    return machine_of(h) == machine_of(hosts_[rank]);
  });
  if (on_machine > static_cast<long>(std::max(1u, std::thread::hardware_concurrency())) &&
      !options_.oversubscribed) {
    options_.oversubscribed = true;
    DTRAIN_LOG_DEBUG("rank {}: {} ranks share this machine's {} cores: waits yield", rank,
                     on_machine, std::thread::hardware_concurrency());
  }
  std::vector<shm::Segment> segments(size);
  if (options_.transport != "tcp") {
    std::vector<bool> local(size, false);
    for (int peer = 0; peer < size; ++peer)
      local[peer] = peer != rank && hosts_[peer] == hosts_[rank];
    const shm::SetupOptions so{rank, size, options_.handshake.job_id, options_.group_name,
                               options_.transport == "shm"};
    segments = shm::share_memory(so, local, fds, deadline);
  }
  std::vector<std::string> via;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    net::Fd fd = std::move(fds[peer]);
    std::string peer_addr = peer < rank ? store.get_string(address_key(options_.group_name, peer))
                                        : net::peer_name(fd.get());
    PairOptions po{
        rank,
        peer,
        peer_addr,
        options_.group_name,
        options_.spin,
        options_.oversubscribed,
        hosts_[peer] == hosts_[rank],
        [this](uint64_t tag, int from, std::string text) { on_notice(tag, from, std::move(text)); },
        [this](uint64_t tag, uint64_t aux, int from) { note_unexpected(tag, aux, from); }};
    const bool shared = segments[peer].valid();
    via.push_back(fmt::format("{} {}", peer, shared ? "shm" : "tcp"));
    pairs_[peer] =
        std::make_shared<Pair>(loop_, std::move(fd), po, std::move(segments[peer]), peer > rank);
  }
  DTRAIN_LOG_DEBUG("rank {}: group {} reaches rank {}", rank, options_.group_name,
                   fmt::join(via, ", rank "));
  // Nobody starts before everybody is connected: a fast rank must not run ahead, fail, and take
  // the store (or itself) away from ranks still connecting.
  if (store.add(joined, 1) == size) store.set(joined + "/all", std::string_view("1"));
  try {
    // In slices, so that rank 0 can report between them (a wait that times out leaves the
    // store's connection as it was).
    for (;;) {
      const auto slice = rank == 0 && report_every.count() > 0
                             ? std::min(deadline.remaining(), next_report.remaining())
                             : deadline.remaining();
      try {
        store.wait({joined + "/all"}, std::max(slice, std::chrono::milliseconds(1)));
        break;
      } catch (const TimeoutError&) {
        if (deadline.expired()) throw;
        report();
      }
    }
  } catch (const TimeoutError&) {
    throw TimeoutError(fmt::format(
        "rank {}: group {} rendezvous: only {} of {} ranks finished connecting after {}; the "
        "others are slow to start, or failed (see their logs)",
        rank, options_.group_name, store.add(joined, 0), size, deadline.describe()));
  }
  DTRAIN_LOG_DEBUG("rank {}: group {} connected to {} peers in {:.1f} ms", rank,
                   options_.group_name, size - 1, deadline.elapsed().count() * 1.0);
}

std::string Device::rendezvous_progress(Store& store, const std::string& joined) {
  const int size = options_.size;
  std::vector<int> missing;
  try {
    for (int r = 0; r < size; ++r)
      if (!store.check({address_key(options_.group_name, r)})) missing.push_back(r);
    const int64_t connected = store.add(joined, 0);
    std::string text = fmt::format("{} of {} ranks have registered, {} have finished connecting",
                                   size - static_cast<int>(missing.size()), size, connected);
    if (!missing.empty()) {
      const size_t shown = std::min<size_t>(missing.size(), 16);
      text += fmt::format("; not registered: {} {}{} (slow to start, or failed: see their logs)",
                          missing.size() == 1 ? "rank" : "ranks",
                          fmt::join(missing.begin(), missing.begin() + shown, ", "),
                          shown < missing.size() ? ", ..." : "");
    }
    return text;
  } catch (const std::exception& e) {
    return fmt::format("(progress unknown: the store did not answer: {})", e.what());
  }
}

namespace {

// A connection to our rank port whose handshake runs on its own thread.
struct Incoming {
  net::Fd fd;
  std::string peer;    // host:port
  std::string source;  // host
  std::atomic<bool> done{false};
  std::atomic<bool> spoke{false};   // sent something (a real peer sends its hello at once)
  bool evicted = false;             // closed by us to make room (and logged then)
  std::optional<net::Hello> hello;  // set when it passed the handshake
  std::string refused;              // why not, otherwise
};

// Connections in their handshake, per source host and in all; beyond these one (of that host)
// is closed to make room (net::handshake_to_close: the oldest silent one), so that silent
// sockets cannot hold the rendezvous up while a real peer, whose handshake takes a millisecond,
// gets through. Each handshake also ends after kHandshakeTime.
constexpr size_t kMaxHandshakesPerSource = 16;
constexpr size_t kMaxHandshakes = 64;
constexpr std::chrono::milliseconds kHandshakeTime{10'000};

}  // namespace

void Device::accept_higher_ranks(int listen_fd, const Deadline& deadline,
                                 std::vector<net::Fd>& accepted, std::string& failure) {
  const int rank = options_.rank;
  int missing = options_.size - 1 - rank;
  int turned_away = 0;  // connections refused, dropped or closed to make room
  std::list<std::shared_ptr<Incoming>> pending;            // in the order they arrived
  net::Fd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));  // a handshake ended
  if (!wake.valid())
    throw InternalError(fmt::format("rank {}: eventfd: {}", rank, std::strerror(errno)));
  std::vector<std::jthread> handshakes;  // declared last: joined first
  net::set_nonblocking(listen_fd, true);
  auto make_room = [&](const std::string& source) {
    Incoming* in = net::handshake_to_close(pending, [&](const Incoming& c) {
      return !c.done && !c.evicted && (source.empty() || c.source == source);
    });
    if (in == nullptr) return;
    const bool silent = !in->spoke && !net::input_waiting(in->fd.get());
    DTRAIN_LOG_WARN(
        "rank {}: closed the connection from {}, still in its handshake{}, to make "
        "room (at most {} per host and {} in all)",
        rank, in->peer, silent ? " and silent" : "", kMaxHandshakesPerSource, kMaxHandshakes);
    ::shutdown(in->fd.get(), SHUT_RDWR);
    in->evicted = true;
  };
  while (missing > 0) {
    // Handshakes that ended: peers join, the rest are turned away.
    for (auto it = pending.begin(); it != pending.end();) {
      auto& in = **it;
      if (!in.done) {
        ++it;
        continue;
      }
      const auto& h = in.hello;
      if (h && h->peer_rank == rank && h->rank > rank && h->rank < options_.size &&
          h->tag == options_.group_tag && !accepted[h->rank].valid()) {
        accepted[h->rank] = std::move(in.fd);
        --missing;
      } else {
        ++turned_away;
        if (h)
          DTRAIN_LOG_WARN(
              "rank {}: refused a connection from {} claiming rank {} (to rank {}, "
              "group tag {:x}): not a peer this rank expects",
              rank, in.peer, h->rank, h->peer_rank, h->tag);
        else if (!in.evicted)
          DTRAIN_LOG_WARN("rank {}: refused a connection: {}", rank, in.refused);
      }
      it = pending.erase(it);
    }
    if (missing == 0) break;
    if (deadline.expired()) {
      std::vector<int> absent;
      for (int r = rank + 1; r < options_.size; ++r)
        if (!accepted[r].valid()) absent.push_back(r);
      failure = fmt::format(
          "rank {}: group {} rendezvous: rank(s) {} did not connect to {} after {}; check that "
          "they are running, use the same DTRAIN_JOB_ID, and can reach this address{}",
          rank, options_.group_name, fmt::join(absent, ", "), address_, deadline.describe(),
          turned_away > 0 ? fmt::format(" ({} other connection(s) were turned away: see the log "
                                        "above)",
                                        turned_away)
                          : std::string());
      break;
    }
    pollfd p[2] = {{listen_fd, POLLIN, 0}, {wake.get(), POLLIN, 0}};
    const int rc = ::poll(p, 2, deadline.poll_ms());
    if (rc <= 0) continue;
    if ((p[1].revents & POLLIN) != 0) {
      uint64_t count;
      [[maybe_unused]] ssize_t n = ::read(wake.get(), &count, sizeof(count));
    }
    if ((p[0].revents & (POLLHUP | POLLERR | POLLNVAL)) != 0) break;  // shut: we are failing
    if ((p[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      break;  // the listener was shut down (the dialling side failed) or broke
    }
    auto in = std::make_shared<Incoming>();
    in->fd = net::Fd(fd);
    in->peer = net::peer_name(fd);
    in->source = in->peer.substr(0, in->peer.rfind(':'));
    size_t from_source = 0, in_handshake = 0;
    for (const auto& q : pending) {
      if (q->done || q->evicted) continue;
      ++in_handshake;
      from_source += q->source == in->source ? 1 : 0;
    }
    if (from_source >= kMaxHandshakesPerSource)
      make_room(in->source);
    else if (in_handshake >= kMaxHandshakes)
      make_room("");
    pending.push_back(in);
    const auto limit = std::min(deadline.remaining(), kHandshakeTime);
    handshakes.emplace_back([this, in, rank, limit, wake_fd = wake.get()] {
      try {
        const Deadline until = Deadline::after(limit);
        net::note_first_input(in->fd.get(), until, in->spoke);
        in->hello =
            net::handshake_accept(in->fd.get(), options_.handshake, net::Role::kPair, rank, until);
      } catch (const net::HandshakeRefused& refused) {
        in->refused = refused.reason;
      } catch (const std::exception& e) {
        in->refused = fmt::format("dropped a connection from {} during its handshake: {}", in->peer,
                                  e.what());
      }
      in->done = true;
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t n = ::write(wake_fd, &one, sizeof(one));
    });
  }
  // Handshakes still running end now (their sockets shut), and their threads are joined.
  for (auto& in : pending)
    if (!in->done) ::shutdown(in->fd.get(), SHUT_RDWR);
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
