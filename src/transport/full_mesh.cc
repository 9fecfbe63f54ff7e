#include "transport/full_mesh.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/env.h"
#include "common/handshake_room.h"
#include "common/log.h"
#include "dtrain/error.h"

namespace dtrain::transport {
namespace {

std::string address_key(const std::string& group, int rank) {
  return fmt::format("{}/addr/{}", group, rank);
}

std::string location_key(const std::string& group, int rank) {
  return fmt::format("{}/host/{}", group, rank);
}

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

// Takes the higher ranks' connections on the listener until every one is in, the deadline
// passes, or the listener is shut down (the dialling side failed). Strangers, ranks this rank
// does not expect and connections that stay silent are turned away, each said in the log.
class Acceptor {
 public:
  Acceptor(const FullMeshOptions& options, const Deadline& deadline, const std::string& address)
      : options_(options),
        deadline_(deadline),
        address_(address),
        missing_(options.size - 1 - options.rank),
        wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
        accepted_(options.size) {
    if (!wake_.valid())
      throw InternalError(fmt::format("rank {}: eventfd: {}", options.rank, std::strerror(errno)));
  }

  void run(int listen_fd) {
    net::set_nonblocking(listen_fd, true);
    while (missing_ > 0) {
      admit_finished();
      if (missing_ == 0) break;
      if (deadline_.expired()) {
        failure_ = give_up_message();
        break;
      }
      pollfd p[2] = {{listen_fd, POLLIN, 0}, {wake_.get(), POLLIN, 0}};
      const int rc = ::poll(p, 2, deadline_.poll_ms());
      if (rc <= 0) continue;
      if ((p[1].revents & POLLIN) != 0) {
        uint64_t count;
        [[maybe_unused]] ssize_t n = ::read(wake_.get(), &count, sizeof(count));
      }
      if ((p[0].revents & (POLLHUP | POLLERR | POLLNVAL)) != 0) break;  // shut: we are failing
      if ((p[0].revents & POLLIN) == 0) continue;
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
        break;  // the listener was shut down (the dialling side failed) or broke
      }
      take(net::Fd(fd));
    }
    // Handshakes still running end now (their sockets shut); their threads are joined when the
    // acceptor goes.
    for (auto& in : pending_)
      if (!in->done) ::shutdown(in->fd.get(), SHUT_RDWR);
  }

  // Indexed by rank: the accepted higher ranks.
  std::vector<net::Fd>& accepted() { return accepted_; }
  // Why not every higher rank connected ("" when they all did, or the acceptor was stopped).
  const std::string& failure() const { return failure_; }

 private:
  // Handshakes that ended: peers join, the rest are turned away.
  void admit_finished() {
    const int rank = options_.rank;
    for (auto it = pending_.begin(); it != pending_.end();) {
      auto& in = **it;
      if (!in.done) {
        ++it;
        continue;
      }
      const auto& h = in.hello;
      if (h && h->peer_rank == rank && h->rank > rank && h->rank < options_.size &&
          h->tag == options_.group_tag && !accepted_[h->rank].valid()) {
        accepted_[h->rank] = std::move(in.fd);
        --missing_;
      } else {
        ++turned_away_;
        if (h)
          DTRAIN_LOG_WARN(
              "rank {}: refused a connection from {} claiming rank {} (to rank {}, "
              "group tag {:x}): not a peer this rank expects",
              rank, in.peer, h->rank, h->peer_rank, h->tag);
        else if (!in.evicted)
          DTRAIN_LOG_WARN("rank {}: refused a connection: {}", rank, in.refused);
      }
      it = pending_.erase(it);
    }
  }

  std::string give_up_message() const {
    std::vector<int> absent;
    for (int r = options_.rank + 1; r < options_.size; ++r)
      if (!accepted_[r].valid()) absent.push_back(r);
    return fmt::format(
        "rank {}: group {} rendezvous: rank(s) {} did not connect to {} after {}; check that "
        "they are running, use the same DTRAIN_JOB_ID, and can reach this address{}",
        options_.rank, options_.group_name, fmt::join(absent, ", "), address_, deadline_.describe(),
        turned_away_ > 0 ? fmt::format(" ({} other connection(s) were turned away: see the log "
                                       "above)",
                                       turned_away_)
                         : std::string());
  }

  // A new connection: room made for it if its host (or everyone) has too many in their
  // handshake, and its handshake started on a thread of its own.
  void take(net::Fd fd) {
    auto in = std::make_shared<Incoming>();
    in->peer = net::peer_name(fd.get());
    in->source = in->peer.substr(0, in->peer.rfind(':'));
    in->fd = std::move(fd);
    size_t from_source = 0, in_handshake = 0;
    for (const auto& q : pending_) {
      if (q->done || q->evicted) continue;
      ++in_handshake;
      from_source += q->source == in->source ? 1 : 0;
    }
    if (from_source >= kMaxHandshakesPerSource)
      make_room(in->source);
    else if (in_handshake >= kMaxHandshakes)
      make_room("");
    pending_.push_back(in);
    const auto limit = std::min(deadline_.remaining(), kHandshakeTime);
    handshakes_.emplace_back([this, in, limit] {
      try {
        const Deadline until = Deadline::after(limit);
        net::note_first_input(in->fd.get(), until, in->spoke);
        in->hello = net::handshake_accept(in->fd.get(), options_.handshake, net::Role::kPair,
                                          options_.rank, until);
      } catch (const net::HandshakeRefused& refused) {
        in->refused = refused.reason;
      } catch (const std::exception& e) {
        in->refused = fmt::format("dropped a connection from {} during its handshake: {}", in->peer,
                                  e.what());
      }
      in->done = true;
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
    });
  }

  // Closes the oldest connection still in its handshake (of `source`, or of anyone for "").
  void make_room(const std::string& source) {
    Incoming* in = net::handshake_to_close(pending_, [&](const Incoming& c) {
      return !c.done && !c.evicted && (source.empty() || c.source == source);
    });
    if (in == nullptr) return;
    const bool silent = !in->spoke && !net::input_waiting(in->fd.get());
    DTRAIN_LOG_WARN(
        "rank {}: closed the connection from {}, still in its handshake{}, to make "
        "room (at most {} per host and {} in all)",
        options_.rank, in->peer, silent ? " and silent" : "", kMaxHandshakesPerSource,
        kMaxHandshakes);
    ::shutdown(in->fd.get(), SHUT_RDWR);
    in->evicted = true;
  }

  const FullMeshOptions& options_;
  const Deadline deadline_;
  const std::string address_;
  int missing_;
  int turned_away_ = 0;  // connections refused, dropped or closed to make room
  net::Fd wake_;         // a handshake ended
  std::vector<net::Fd> accepted_;
  std::string failure_;
  std::list<std::shared_ptr<Incoming>> pending_;  // in the order they arrived
  std::vector<std::jthread> handshakes_;          // declared last: joined first
};

}  // namespace

FullMesh::FullMesh(Store& store, FullMeshOptions options, const Deadline& deadline,
                   const std::string& location)
    : store_(store),
      options_(std::move(options)),
      deadline_(deadline),
      connected_key_(fmt::format("{}/connected", options_.group_name)),
      report_every_(env::get_seconds(env::kStragglerSeconds)),
      next_report_(Deadline::after(report_every_)) {
  // Listen where the peers dial and no wider: a job on loopback addresses (one machine, its
  // store on 127.0.0.1) is not reachable from other machines.
  std::string listen_host = options_.listen_host;
  if (listen_host.empty() && net::is_loopback(options_.advertise_addr))
    listen_host = options_.advertise_addr;
  listener_ = net::listen_tcp(listen_host, 0);
  address_ = net::HostPort{options_.advertise_addr, net::local_port(listener_.get())}.to_string();
  store_.set(address_key(options_.group_name, options_.rank), address_);
  store_.set(location_key(options_.group_name, options_.rank), location);
  DTRAIN_LOG_DEBUG("rank {}: group {} listens at {}", options_.rank, options_.group_name, address_);
}

std::vector<net::Fd> FullMesh::connect() {
  Acceptor acceptor(options_, deadline_, address_);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;  // guarded by mu
  // Declared after what it uses: a failure below joins it (the listener shut) before they go.
  std::jthread accepting([&] {
    acceptor.run(listener_.get());
    std::lock_guard lock(mu);
    done = true;
    cv.notify_all();
  });
  std::vector<net::Fd> fds(options_.size);
  try {
    dial_lower_ranks(fds);
  } catch (...) {
    ::shutdown(listener_.get(), SHUT_RDWR);  // wakes the acceptor so the error is not delayed
    throw;
  }
  {
    std::unique_lock lock(mu);
    while (!cv.wait_for(lock, std::chrono::milliseconds(250), [&] { return done; })) {
      lock.unlock();
      report_if_due();
      lock.lock();
    }
  }
  accepting.join();
  if (!acceptor.failure().empty()) throw TimeoutError(acceptor.failure());
  for (int peer = options_.rank + 1; peer < options_.size; ++peer)
    fds[peer] = std::move(acceptor.accepted()[peer]);
  return fds;
}

void FullMesh::dial_lower_ranks(std::vector<net::Fd>& dialled) {
  const int rank = options_.rank;
  for (int peer = 0; peer < rank; ++peer) {
    wait_for_address(peer);
    const std::string addr = address_of(peer);
    const std::string context = fmt::format("rank {}: connecting group {} to rank {} at {}", rank,
                                            options_.group_name, peer, addr);
    net::Fd fd = net::connect_tcp(net::parse_host_port(addr, "peer address"), deadline_, context);
    net::Hello hello{net::Role::kPair, rank, peer, options_.group_tag};
    net::handshake_connect(fd.get(), options_.handshake, hello, peer, deadline_, context);
    dialled[peer] = std::move(fd);
  }
}

void FullMesh::wait_for_address(int peer) {
  const std::vector<std::string> key{address_key(options_.group_name, peer)};
  // Rank 0 reports the rendezvous; while it has not even registered, nobody would, so each rank
  // says what it waits for (workers started by hand, rank 0 failed or not started).
  const bool speak = peer == 0 && report_every_.count() > 0;
  for (;;) {
    try {
      store_.wait(key, speak ? std::max(std::chrono::milliseconds(1),
                                        std::min(deadline_.remaining(), report_every_))
                             : deadline_.remaining());
      return;
    } catch (const TimeoutError& e) {
      if (!speak) throw;
      if (deadline_.expired())
        throw TimeoutError(fmt::format(
            "rank {}: group {} rendezvous: rank 0 has not registered after {} "
            "(DTRAIN_CONNECT_TIMEOUT); it must start, and reach the store, before the others "
            "can connect: see its log ({})",
            options_.rank, options_.group_name, deadline_.describe(), e.what()));
      DTRAIN_LOG_INFO(
          "rank {}: group {} rendezvous has waited {}: rank 0 has not registered "
          "yet (it must start, and reach the store, before the others can connect; "
          "see its log)",
          options_.rank, options_.group_name, deadline_.describe());
    }
  }
}

std::string FullMesh::address_of(int peer) {
  return store_.get_string(address_key(options_.group_name, peer));
}

std::string FullMesh::location_of(int peer) {
  return store_.get_string(location_key(options_.group_name, peer));
}

void FullMesh::wait_for_all() {
  const int size = options_.size;
  if (store_.add(connected_key_, 1) == size)
    store_.set(connected_key_ + "/all", std::string_view("1"));
  try {
    // In slices, so that rank 0 can report between them (a wait that times out leaves the
    // store's connection as it was).
    for (;;) {
      const auto slice = options_.rank == 0 && report_every_.count() > 0
                             ? std::min(deadline_.remaining(), next_report_.remaining())
                             : deadline_.remaining();
      try {
        store_.wait({connected_key_ + "/all"}, std::max(slice, std::chrono::milliseconds(1)));
        return;
      } catch (const TimeoutError&) {
        if (deadline_.expired()) throw;
        report_if_due();
      }
    }
  } catch (const TimeoutError&) {
    throw TimeoutError(fmt::format(
        "rank {}: group {} rendezvous: only {} of {} ranks finished connecting after {}; the "
        "others are slow to start, or failed (see their logs)",
        options_.rank, options_.group_name, store_.add(connected_key_, 0), size,
        deadline_.describe()));
  }
}

void FullMesh::report_if_due() {
  if (options_.rank != 0 || report_every_.count() <= 0 || !next_report_.expired()) return;
  next_report_ = Deadline::after(report_every_);
  DTRAIN_LOG_INFO("rank 0: group {} rendezvous has waited {}: {}", options_.group_name,
                  deadline_.describe(), progress());
}

std::string FullMesh::progress() {
  const int size = options_.size;
  std::vector<int> missing;
  try {
    for (int r = 0; r < size; ++r)
      if (!store_.check({address_key(options_.group_name, r)})) missing.push_back(r);
    const int64_t connected = store_.add(connected_key_, 0);
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

}  // namespace dtrain::transport
