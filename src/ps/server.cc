// The parameter server process: one thread accepts workers, one thread per worker reads its
// requests in order and answers them, and a housekeeping thread expires parked requests, evicts
// idle sparse rows and writes scheduled checkpoints.
//
// Requests that must wait (a sync pull before the other workers pushed, an SSP pull too far
// ahead) are parked on their table and answered by whichever thread changes the table so that
// they can proceed, so a connection keeps reading while one of its requests waits: a worker may
// push table B while its pull of table A is parked.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/error_message.h"
#include "common/handshake.h"
#include "common/handshake_room.h"
#include "common/json_integer.h"
#include "common/log.h"
#include "common/socket.h"
#include "dtrain/error.h"
#include "dtrain/ps.h"
#include "dtrain/store.h"
#include "ps/dense_table.h"
#include "ps/protocol.h"
#include "ps/server_checkpoint.h"
#include "ps/sparse_table.h"

namespace dtrain::ps {

namespace {

using std::chrono::milliseconds;

struct Connection {
  net::Fd fd;
  int worker = -1;
  std::string peer;     // host:port of the worker
  std::mutex write_mu;  // one response at a time on fd; guards closing fd
  std::atomic<bool> said_bye{false};
  std::atomic<bool> forgotten{false};   // the other workers left it out (forget())
  std::atomic<bool> finished{false};    // its thread is done: join it, drop it
  std::atomic<bool> handshaking{true};  // not yet admitted or refused
  std::atomic<bool> spoke{false};       // sent something (a real client sends its hello at once)
  std::string source;                   // the peer's host
  std::thread thread;
};

// Connections still in their handshake, per source host and in all: beyond these, one (of that
// host) is closed to make room (net::handshake_to_close: the oldest silent one), so that silent
// sockets cannot occupy
// the server, while a real client, whose handshake takes a millisecond, gets through (each
// handshake is bounded by kHandshakeTime too).
constexpr int kMaxPendingPerSource = 16;
constexpr int kMaxPending = 256;
constexpr std::chrono::milliseconds kHandshakeTime{10'000};
// How long a connection claiming a worker index that a live connection holds waits for the
// holder to go (a restarted worker's old process is usually gone at once; a dead machine is
// found by TCP keepalive, net::kPeerKeepalive) before it is refused.
constexpr std::chrono::seconds kHolderGrace{net::kPeerKeepalive.limit_s() + 1};
// A request's payload is read (and its buffer grown) this much at a time.
constexpr size_t kPayloadSlice = size_t{1} << 20;

// "10.0.0.7" of "10.0.0.7:41235", "::1" of "[::1]:41235".
std::string host_of(const std::string& peer) {
  std::string host = peer.substr(0, peer.rfind(':'));
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  return host;
}

struct Waiter {
  std::shared_ptr<Connection> conn;
  Header request;
  std::vector<uint64_t> ids;  // pull_rows
  Clock::time_point since;
  Clock::time_point deadline;
};

struct TableEntry {
  std::mutex mu;  // guards everything below
  std::unique_ptr<DenseTable> dense;
  std::unique_ptr<SparseTable> sparse;
  std::vector<Waiter> waiters;

  const TableSpec& spec() const { return dense ? dense->spec() : sparse->spec(); }
};

// A response to send once the table's lock is released.
struct Reply {
  std::shared_ptr<Connection> conn;
  Header header;
  std::vector<std::byte> payload;
};

Reply error_reply(const std::shared_ptr<Connection>& conn, const Header& request, Status status,
                  const std::string& message) {
  Reply r{conn, request, {}};
  r.header.status = static_cast<uint8_t>(status);
  r.payload.resize(message.size());
  std::memcpy(r.payload.data(), message.data(), message.size());
  r.header.bytes = r.payload.size();
  return r;
}

}  // namespace

struct Server::Impl {
  ServerOptions options;
  net::Fd listen_fd;
  std::string address;
  std::atomic<bool> stopping{false};
  std::thread accept_thread;
  std::thread housekeeping_thread;

  std::mutex mu;  // guards tables, connections, presence, workers_total, byes, done
  std::condition_variable cv;
  std::map<uint64_t, std::shared_ptr<TableEntry>> tables;
  std::vector<std::shared_ptr<Connection>> connections;
  std::map<std::string, int> pending_by_source;  // connections in their handshake, per host
  int pending_total = 0;
  std::map<int, WorkerClocks::Presence> presence;  // workers that left or failed
  std::map<int, std::string> worker_address;
  std::map<int, std::shared_ptr<Connection>> current;  // each worker's live connection
  int workers_total = 0;                               // as the workers announce it
  std::set<int> byes;
  bool done = false;
  std::mutex checkpoint_mu;  // one checkpoint at a time

  explicit Impl(const ServerOptions& o) : options(o) {}

  std::string who() const { return fmt::format("ps server {} ({})", options.index, address); }

  // ---- connections -------------------------------------------------------------------------

  // Accepts, and hands each connection to a thread of its own at once: a slow or silent
  // client delays nobody else.
  void accept_loop() {
    while (!stopping) {
      net::Fd fd;
      try {
        fd = net::accept_tcp(listen_fd.get(), Deadline::after(milliseconds(200)), "ps server");
      } catch (const TimeoutError&) {
        prune_finished();
        continue;
      } catch (const std::exception& e) {
        if (!stopping) DTRAIN_LOG_WARN("{}: accept failed: {}", who(), e.what());
        continue;
      }
      prune_finished();
      auto conn = std::make_shared<Connection>();
      conn->peer = net::peer_name(fd.get());
      conn->fd = std::move(fd);
      const std::string source = host_of(conn->peer);
      conn->source = source;
      {
        std::lock_guard<std::mutex> lock(mu);
        int& from_source = pending_by_source[source];
        if (from_source >= kMaxPendingPerSource || pending_total >= kMaxPending)
          close_oldest_handshake(from_source >= kMaxPendingPerSource ? source : "");
        ++from_source;
        ++pending_total;
        connections.push_back(conn);
      }
      conn->thread = std::thread([this, conn, source] {
        const bool admitted = admit(conn);
        conn->handshaking = false;
        {
          std::lock_guard<std::mutex> lock(mu);
          if (--pending_by_source[source] == 0) pending_by_source.erase(source);
          --pending_total;
        }
        if (admitted) serve(conn);
        conn->finished = true;
      });
    }
  }

  // Closes a connection still in its handshake (from `source`, or from anywhere when it is
  // empty): the oldest silent one, else the oldest; its thread then ends and frees its place.
  // mu held.
  void close_oldest_handshake(const std::string& source) {
    Connection* c = net::handshake_to_close(connections, [&](Connection& c) {
      if (!c.handshaking || c.finished || (!source.empty() && c.source != source)) return false;
      std::lock_guard<std::mutex> conn_lock(c.write_mu);
      return c.fd.valid();
    });
    if (c == nullptr) return;
    std::lock_guard<std::mutex> conn_lock(c->write_mu);
    if (!c->fd.valid()) return;
    const bool silent = !c->spoke && !net::input_waiting(c->fd.get());
    DTRAIN_LOG_WARN(
        "{}: closed the connection from {}, still in its handshake{}, to make room: "
        "at most {} connections per host and {} in all may be in their handshake",
        who(), c->peer, silent ? " and silent" : "", kMaxPendingPerSource, kMaxPending);
    ::shutdown(c->fd.get(), SHUT_RDWR);
    c->handshaking = false;  // counted out once, even if a later call comes first
  }

  // Joins and drops the threads of connections that are over.
  void prune_finished() {
    std::vector<std::shared_ptr<Connection>> over;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = std::stable_partition(connections.begin(), connections.end(),
                                      [](const auto& c) { return !c->finished; });
      over.assign(it, connections.end());
      connections.erase(it, connections.end());
    }
    for (auto& c : over)
      if (c->thread.joinable()) c->thread.join();
  }

  // The handshake, the worker's identity and its place: whether the connection may serve.
  bool admit(const std::shared_ptr<Connection>& conn) {
    try {
      net::set_nodelay(conn->fd.get());
      net::set_keepalive(conn->fd.get(), net::kPeerKeepalive);
      if (net::peer_is_on_this_host(conn->fd.get()))  // as the client does
        net::use_loopback_congestion_control(conn->fd.get());
      const Deadline until = Deadline::after(kHandshakeTime);
      net::note_first_input(conn->fd.get(), until, conn->spoke);
      net::Hello hello = net::handshake_accept(conn->fd.get(), handshake(), net::Role::kPsClient,
                                               options.index, until);
      conn->worker = hello.rank;
      if (hello.tag < 1 || hello.tag > (1 << 20) || conn->worker < 0 ||
          static_cast<uint64_t>(conn->worker) >= hello.tag)
        throw InvalidArgumentError(
            fmt::format("worker index {} of {} is out of range", conn->worker, hello.tag));
      const int total = static_cast<int>(hello.tag);
      std::lock_guard<std::mutex> lock(mu);
      if (workers_total != 0 && workers_total != total)
        throw InvalidArgumentError(
            fmt::format("worker {} at {} says the job has {} workers, earlier workers said {}",
                        conn->worker, conn->peer, total, workers_total));
      workers_total = total;
    } catch (const net::HandshakeRefused& r) {
      DTRAIN_LOG_WARN("{}: refused a connection from {}: {}", who(), conn->peer, r.reason);
      return false;
    } catch (const std::exception& e) {
      // The worker passed the handshake, so it reads our frames: tell it why before closing.
      DTRAIN_LOG_WARN("{}: refused worker {} at {}: {}", who(), conn->worker, conn->peer, e.what());
      refuse(*conn, fmt::format("{} refused this worker: {}", who(), e.what()));
      return false;
    }
    // A connection claiming an index that a live connection holds does not displace it: that
    // would let any process that knows the job id (without DTRAIN_AUTH_TOKEN, anyone) retire a
    // real worker and fail the job. A restarted worker's old connection is gone, or soon found
    // dead; until then the newcomer waits.
    std::shared_ptr<Connection> holder;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = current.find(conn->worker);
      if (it != current.end()) holder = it->second;
    }
    if (holder && !holder->said_bye && still_alive(*holder, kHolderGrace)) {
      const std::string why = fmt::format(
          "worker {} is connected from {} and alive; a second connection claiming worker {} "
          "from {} is refused (two processes with one worker index, or a forged hello)",
          conn->worker, holder->peer, conn->worker, conn->peer);
      DTRAIN_LOG_WARN("{}: {}", who(), why);
      refuse(*conn, fmt::format("{}: {}", who(), why));
      return false;
    }
    std::shared_ptr<Connection> retired;
    {
      std::lock_guard<std::mutex> lock(mu);
      worker_address[conn->worker] = conn->peer;
      retired = std::exchange(current[conn->worker], conn);
    }
    if (retired && !retired->said_bye) {
      // Its late errors must not mark the worker failed (leave() checks it is current).
      DTRAIN_LOG_WARN("{}: worker {} connected again from {}; its connection from {} was dead",
                      who(), conn->worker, conn->peer, retired->peer);
      refuse(*retired, fmt::format("{}: worker {} connected again from {}; this connection (from "
                                   "{}) is retired",
                                   who(), conn->worker, conn->peer, retired->peer));
    }
    rejoin(conn->worker);
    DTRAIN_LOG_DEBUG("{}: worker {} connected from {}", who(), conn->worker, conn->peer);
    return true;
  }

  // Whether a connection's peer is still there: its socket shows no hang-up or error within
  // `wait` (a dead machine's is found by TCP keepalive).
  static bool still_alive(Connection& c, std::chrono::milliseconds wait) {
    net::Fd probe;
    {
      std::lock_guard<std::mutex> lock(c.write_mu);
      if (!c.fd.valid()) return false;
      probe = net::Fd(::fcntl(c.fd.get(), F_DUPFD_CLOEXEC, 0));  // not closed under our poll
    }
    if (!probe.valid()) return false;
    const Deadline deadline = Deadline::after(wait);
    while (!deadline.expired()) {
      pollfd p{probe.get(), POLLRDHUP, 0};
      int rc = ::poll(&p, 1, std::min(deadline.poll_ms(), 200));
      if (rc > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) return false;
      std::lock_guard<std::mutex> lock(c.write_mu);
      if (!c.fd.valid()) return false;  // its thread saw it end
    }
    return true;
  }

  net::HandshakeConfig handshake() const { return {options.job_id, options.token}; }

  // Tells a connection's worker why it is being closed (an error frame with request id 0, which
  // its client turns into the connection's error), then shuts the socket.
  void refuse(Connection& conn, const std::string& message) {
    std::lock_guard<std::mutex> lock(conn.write_mu);
    if (!conn.fd.valid()) return;
    Header h;
    h.status = static_cast<uint8_t>(Status::kInvalid);
    h.bytes = message.size();
    std::span<const std::byte> part(reinterpret_cast<const std::byte*>(message.data()),
                                    message.size());
    try {
      send_message(conn.fd.get(), h, {&part, 1}, Deadline::after(milliseconds(2'000)),
                   "refusing a worker");
    } catch (const std::exception&) {
    }
    ::shutdown(conn.fd.get(), SHUT_RDWR);
  }

  void serve(const std::shared_ptr<Connection>& conn) {
    serve_requests(conn);
    // Done with this worker: close its socket now (its requests still parked are dropped in
    // leave()), rather than when the server ends.
    std::lock_guard<std::mutex> lock(conn->write_mu);
    conn->fd.reset();
  }

  void serve_requests(const std::shared_ptr<Connection>& conn) {
    const std::string context =
        fmt::format("{} reading from worker {} at {}", who(), conn->worker, conn->peer);
    std::vector<std::byte> payload;
    try {
      while (!stopping) {
        Header h = read_header(conn->fd.get(), Deadline::never(), context);
        if (static_cast<Op>(h.op) == Op::kBye) {
          conn->said_bye = true;
          leave(conn, WorkerClocks::Presence::kLeft, "");
          return;
        }
        // The payload follows at once: a worker that stops mid-message is failing. It is
        // read in slices, the buffer growing as bytes arrive: a header that announces a large
        // payload costs memory only once the payload is really sent.
        const Deadline body =
            Deadline::after(milliseconds(std::max<uint32_t>(h.timeout_ms, 10'000)));
        for (size_t got = 0; got < h.bytes;) {
          const size_t slice = std::min<uint64_t>(h.bytes - got, kPayloadSlice);
          if (payload.size() < got + slice) payload.resize(got + slice);  // reused when it fits
          net::read_all(conn->fd.get(), payload.data() + got, slice, body, context);
          got += slice;
        }
        payload.resize(h.bytes);
        std::vector<Reply> replies;
        try {
          handle(conn, h, payload, replies);
        } catch (const InvalidArgumentError& e) {
          replies.push_back(error_reply(conn, h, Status::kInvalid,
                                        fmt::format("{}: {} refused: {}", who(),
                                                    to_string(static_cast<Op>(h.op)), e.what())));
        } catch (const std::exception& e) {
          replies.push_back(error_reply(
              conn, h, Status::kInternal,
              fmt::format("{}: {} failed: {}", who(), to_string(static_cast<Op>(h.op)), e.what())));
        }
        send(replies);
      }
    } catch (const std::exception& e) {
      if (stopping || conn->said_bye) return;
      DTRAIN_LOG_WARN("{}: lost worker {} at {}: {}", who(), conn->worker, conn->peer, e.what());
      leave(conn, WorkerClocks::Presence::kFailed,
            fmt::format("worker {} at {} disconnected without saying goodbye ({})", conn->worker,
                        conn->peer, e.what()));
    }
  }

  void send(std::vector<Reply>& replies) {
    for (auto& r : replies) {
      std::span<const std::byte> part(r.payload);
      std::lock_guard<std::mutex> lock(r.conn->write_mu);
      if (!r.conn->fd.valid()) continue;  // the worker is gone
      try {
        send_message(
            r.conn->fd.get(), r.header, {&part, 1},
            Deadline::after(milliseconds(std::max<uint32_t>(r.header.timeout_ms, 10'000))),
            fmt::format("{} answering worker {} at {}", who(), r.conn->worker, r.conn->peer));
      } catch (const std::exception& e) {
        // The worker's own thread notices the broken connection; nothing else to do here.
        DTRAIN_LOG_DEBUG("{}", e.what());
        ::shutdown(r.conn->fd.get(), SHUT_RDWR);
      }
    }
  }

  // ---- worker presence ------------------------------------------------------------------------

  void rejoin(int worker) {
    std::vector<std::shared_ptr<TableEntry>> all;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = presence.find(worker);
      if (it == presence.end()) return;
      presence.erase(it);
      byes.erase(worker);
      std::lock_guard<std::mutex> reasons_lock(reasons_mu);
      failure_reason.erase(worker);
      for (auto& [k, t] : tables) all.push_back(t);
    }
    for (auto& t : all) {
      std::lock_guard<std::mutex> lock(t->mu);
      if (t->dense) t->dense->set_presence(worker, WorkerClocks::Presence::kActive);
      if (t->sparse) t->sparse->set_presence(worker, WorkerClocks::Presence::kActive);
    }
  }

  // Worker `worker` is gone for good, as its peers agreed (live recovery): it counts as having
  // said goodbye, and the step in progress is dropped (the pushes of versions not yet applied),
  // which the others redo without it. Each of them asks after its own pushes, on the same
  // connection, so that the last one to ask finds them all here. A replacement that connects
  // as `worker` later is taken in where the others stand (rejoin).
  void forget(int worker, const Connection& asker) {
    std::shared_ptr<Connection> holder;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (worker < 0 || worker >= workers_total)
        throw InvalidArgumentError(fmt::format(
            "worker {} asked to forget worker {}, which is not one of the job's {} workers",
            asker.worker, worker, workers_total));
      auto it = current.find(worker);
      if (it != current.end()) holder = it->second;
    }
    DTRAIN_LOG_INFO("{}: worker {} forgets worker {}: the others go on without it", who(),
                    asker.worker, worker);
    if (holder == nullptr) {
      holder = std::make_shared<Connection>();  // it never connected here
      holder->worker = worker;
      std::lock_guard<std::mutex> lock(mu);
      current[worker] = holder;
    }
    // Its connection, should it still be open, no longer speaks for it.
    holder->said_bye = true;
    holder->forgotten = true;
    leave(holder, WorkerClocks::Presence::kLeft, "", /*forget=*/true);
  }

  // `forget`: the worker is gone for good and the step in progress is dropped (see forget()).
  void leave(const std::shared_ptr<Connection>& conn, WorkerClocks::Presence p,
             const std::string& why, bool forget = false) {
    const int worker = conn->worker;
    bool is_current;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = current.find(worker);
      is_current = it != current.end() && it->second == conn;
    }
    if (!is_current) {  // a retired connection: drop what it had parked, nothing else
      for (auto& t : all_tables()) {
        std::lock_guard<std::mutex> lock(t->mu);
        std::erase_if(t->waiters, [&](const Waiter& w) { return w.conn == conn; });
      }
      return;
    }
    {
      std::lock_guard<std::mutex> lock(reasons_mu);
      if (why.empty()) {
        failure_reason.erase(worker);
      } else {
        failure_reason[worker] = why;
      }
    }
    std::vector<std::shared_ptr<TableEntry>> all;
    {
      std::lock_guard<std::mutex> lock(mu);
      presence[worker] = p;
      if (p == WorkerClocks::Presence::kLeft) byes.insert(worker);
      for (auto& [k, t] : tables) all.push_back(t);
    }
    for (auto& t : all) {
      std::vector<Reply> replies;
      {
        std::lock_guard<std::mutex> lock(t->mu);
        std::erase_if(t->waiters, [&](const Waiter& w) { return w.conn == conn; });
        if (t->dense) forget ? t->dense->forget(worker) : t->dense->set_presence(worker, p);
        if (t->sparse) forget ? t->sparse->forget(worker) : t->sparse->set_presence(worker, p);
        settle(*t, replies);
      }
      send(replies);
    }
    std::lock_guard<std::mutex> lock(mu);
    if (options.exit_when_workers_leave && workers_total > 0 &&
        static_cast<int>(byes.size()) >= workers_total) {
      DTRAIN_LOG_INFO("{}: all {} workers left; stopping", who(), workers_total);
      done = true;
      cv.notify_all();
    }
  }
  std::mutex reasons_mu;  // guards failure_reason; taken last (with a table's lock held)
  std::map<int, std::string> failure_reason;  // why a failed worker failed

  // ---- requests -------------------------------------------------------------------------------

  std::shared_ptr<TableEntry> find(const Header& h) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = tables.find(h.table);
    if (it == tables.end())
      throw InvalidArgumentError(fmt::format(
          "no table with key {:#x} exists on this server: create it first (create_dense / "
          "create_sparse) with the same name on every worker",
          h.table));
    return it->second;
  }

  void handle(const std::shared_ptr<Connection>& conn, const Header& h,
              const std::vector<std::byte>& payload, std::vector<Reply>& replies) {
    const Op op = static_cast<Op>(h.op);
    switch (op) {
      case Op::kCreateDense:
      case Op::kCreateSparse:
        return create(conn, h, payload, replies);
      case Op::kForget:
        forget(static_cast<int>(h.offset), *conn);
        replies.push_back(Reply{conn, h, {}});
        return;
      case Op::kCheckpoint: {
        std::string path = checkpoint();
        std::string text = nlohmann::json{{"path", path}}.dump();
        Reply r{conn, h, std::vector<std::byte>(text.size())};
        std::memcpy(r.payload.data(), text.data(), text.size());
        r.header.bytes = text.size();
        replies.push_back(std::move(r));
        return;
      }
      default:
        break;
    }
    // Its pushes would count for no version, its reads wait for none.
    if (conn->forgotten)
      throw InvalidArgumentError(fmt::format(
          "worker {}'s connection from {} was forgotten when the other workers went on without "
          "it (live recovery); a worker taken in again connects anew",
          conn->worker, conn->peer));
    auto t = find(h);
    std::lock_guard<std::mutex> lock(t->mu);
    const TableSpec& spec = t->spec();
    if (conn->worker >= spec.num_workers)
      throw InvalidArgumentError(
          fmt::format("worker {} is not one of the {} workers table '{}' was created for",
                      conn->worker, spec.num_workers, spec.name));
    if (h.dtype != static_cast<uint8_t>(DType::kF32))
      throw InvalidArgumentError(fmt::format("table '{}' holds f32 values; the request carries {}",
                                             spec.name, to_string(static_cast<DType>(h.dtype))));
    switch (op) {
      case Op::kPush:
      case Op::kPull:
      case Op::kPushPull: {
        if (!t->dense)
          throw InvalidArgumentError(
              fmt::format("table '{}' is sparse: use push_rows / pull_rows", spec.name));
        const bool pushes = op != Op::kPull;
        t->dense->check_range(h.offset, h.count, pushes);
        if (pushes) {
          if (h.bytes != h.count * sizeof(float))
            throw InvalidArgumentError(
                fmt::format("{} of {} elements carries {} bytes", to_string(op), h.count, h.bytes));
          t->dense->push(conn->worker, h.offset, reinterpret_cast<const float*>(payload.data()));
        }
        if (op == Op::kPush) {
          Reply r{conn, h, {}};
          r.header.bytes = 0;
          replies.push_back(std::move(r));
        } else {
          park(*t, conn, h, {});
        }
        settle(*t, replies);
        return;
      }
      case Op::kPushRows:
      case Op::kPullRows: {
        if (!t->sparse)
          throw InvalidArgumentError(
              fmt::format("table '{}' is dense: use push / pull / push_pull", spec.name));
        if (h.width != spec.width)
          throw InvalidArgumentError(
              fmt::format("table '{}' has rows of width {}; the request has rows of width {}",
                          spec.name, spec.width, h.width));
        if (h.count > kMaxPayload / (sizeof(uint64_t) + h.width * sizeof(float)))
          throw InvalidArgumentError(fmt::format("{} of {} rows of width {} is too large",
                                                 to_string(op), h.count, h.width));
        const size_t id_bytes = h.count * sizeof(uint64_t);
        const size_t row_bytes = op == Op::kPushRows ? h.count * h.width * sizeof(float) : 0;
        if (h.bytes != id_bytes + row_bytes)
          throw InvalidArgumentError(fmt::format("{} of {} rows of width {} carries {} bytes",
                                                 to_string(op), h.count, h.width, h.bytes));
        std::vector<uint64_t> ids(h.count);
        if (id_bytes) std::memcpy(ids.data(), payload.data(), id_bytes);
        if (op == Op::kPushRows) {
          t->sparse->push(conn->worker, ids,
                          reinterpret_cast<const float*>(payload.data() + id_bytes));
          Reply r{conn, h, {}};
          r.header.bytes = 0;
          replies.push_back(std::move(r));
        } else {
          park(*t, conn, h, std::move(ids));
        }
        settle(*t, replies);
        return;
      }
      default:
        throw InvalidArgumentError(fmt::format("unknown operation {}", h.op));
    }
  }

  void create(const std::shared_ptr<Connection>& conn, const Header& h,
              const std::vector<std::byte>& payload, std::vector<Reply>& replies) {
    if (h.count > payload.size())
      throw InvalidArgumentError("create: the spec is longer than the message");
    nlohmann::json j = nlohmann::json::parse(
        std::string(reinterpret_cast<const char*>(payload.data()), h.count), nullptr, false);
    if (j.is_discarded()) throw InvalidArgumentError("create: the table spec is not JSON");
    TableSpec spec = spec_from_json(j);
    const bool sparse = static_cast<Op>(h.op) == Op::kCreateSparse;
    if (spec.sparse != sparse)
      throw InvalidArgumentError(
          fmt::format("create: table '{}' spec and operation disagree", spec.name));
    if (table_key(spec.name) != h.table)
      throw InvalidArgumentError(
          fmt::format("create: table '{}' sent with the key of another name", spec.name));
    const size_t values = payload.size() - h.count;
    if (!sparse && values != 0 && values != spec.slice_length * sizeof(float))
      throw InvalidArgumentError(fmt::format(
          "create: table '{}' slice of {} elements sent with {} bytes of initial values", spec.name,
          spec.slice_length, values));
    if (!sparse && spec.slice_offset + spec.slice_length > spec.numel)
      throw InvalidArgumentError(fmt::format(
          "create: table '{}' slice [{}, {}) is outside its {} "
          "elements",
          spec.name, spec.slice_offset, spec.slice_offset + spec.slice_length, spec.numel));
    bool created = false;
    std::shared_ptr<TableEntry> existing;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = tables.find(h.table);
      if (it != tables.end()) {
        existing = it->second;
      } else {
        auto entry = std::make_shared<TableEntry>();
        if (sparse) {
          entry->sparse = std::make_unique<SparseTable>(spec);
        } else {
          std::span<const float> init;
          if (values)
            init = {reinterpret_cast<const float*>(payload.data() + h.count), spec.slice_length};
          entry->dense = std::make_unique<DenseTable>(spec, init);
        }
        for (const auto& [w, p] : presence) {
          if (w >= spec.num_workers) continue;
          if (entry->dense) entry->dense->set_presence(w, p);
          if (entry->sparse) entry->sparse->set_presence(w, p);
        }
        tables.emplace(h.table, std::move(entry));
        created = true;
        DTRAIN_LOG_DEBUG("{}: created table '{}' ({})", who(), spec.name, to_json(spec).dump());
      }
    }
    if (existing) {  // attach: the declaration must match (lock order: mu is released first)
      std::lock_guard<std::mutex> table_lock(existing->mu);
      const TableSpec& have = existing->spec();
      if (have.name != spec.name)
        throw InvalidArgumentError(
            fmt::format("create: table names '{}' and '{}' have the same key; rename one",
                        have.name, spec.name));
      std::string diff = spec_mismatch(have, spec);
      if (!diff.empty())
        throw InvalidArgumentError(fmt::format(
            "create: worker {} declares table '{}' differently from the existing one: {} "
            "(create tables in the same order and with the same options on every worker)",
            conn->worker, spec.name, diff));
    }
    std::string text = nlohmann::json{{"created", created}}.dump();
    Reply r{conn, h, std::vector<std::byte>(text.size())};
    std::memcpy(r.payload.data(), text.data(), text.size());
    r.header.bytes = text.size();
    replies.push_back(std::move(r));
  }

  void park(TableEntry& t, const std::shared_ptr<Connection>& conn, const Header& h,
            std::vector<uint64_t> ids) {
    const auto now = Clock::now();
    const uint32_t limit = h.timeout_ms != 0 ? h.timeout_ms.get() : 300'000;
    Header parked = h;
    parked.timeout_ms = limit;  // what the timeout message quotes
    t.waiters.push_back(Waiter{conn, parked, std::move(ids), now, now + milliseconds(limit)});
  }

  // Answers the parked requests of t that can proceed, have failed or expired (t.mu held).
  void settle(TableEntry& t, std::vector<Reply>& replies) {
    const auto now = Clock::now();
    std::map<int, std::string> reasons;
    {
      std::lock_guard<std::mutex> lock(reasons_mu);
      reasons = failure_reason;
    }
    for (auto it = t.waiters.begin(); it != t.waiters.end();) {
      Waiter& w = *it;
      const Header& h = w.request;
      const int worker = w.conn->worker;
      std::vector<int> blockers =
          t.dense ? t.dense->blockers(worker, h.offset, h.count) : t.sparse->blockers(worker);
      if (blockers.empty()) {
        Reply r{w.conn, h, {}};
        if (t.dense) {
          r.payload.resize(h.count * sizeof(float));
          t.dense->read(h.offset, h.count, reinterpret_cast<float*>(r.payload.data()));
        } else {
          r.payload.resize(w.ids.size() * t.sparse->spec().width * sizeof(float));
          t.sparse->read(w.ids, reinterpret_cast<float*>(r.payload.data()));
        }
        r.header.bytes = r.payload.size();
        replies.push_back(std::move(r));
        it = t.waiters.erase(it);
        continue;
      }
      const TableSpec& spec = t.spec();
      std::string clocks =
          t.dense ? t.dense->describe_clocks(h.offset, h.count) : t.sparse->describe_clocks();
      std::string failed;
      for (int b : blockers)
        if (auto f = reasons.find(b); f != reasons.end()) failed = f->second;
      if (!failed.empty()) {
        replies.push_back(error_reply(
            w.conn, h, Status::kPeerFailure,
            fmt::format("{}: {} of {} table '{}' by worker {} cannot complete: {}; it waits for "
                        "workers {} ({}). Restart the job (or the failed worker).",
                        who(), to_string(static_cast<Op>(h.op)),
                        to_string(spec.options.consistency), spec.name, worker, failed, blockers,
                        clocks)));
        it = t.waiters.erase(it);
        continue;
      }
      if (now >= w.deadline) {
        const double waited = std::chrono::duration<double>(now - w.since).count();
        replies.push_back(error_reply(
            w.conn, h, Status::kTimeout,
            fmt::format("{}: {} of {} table '{}' by worker {} waited {:.1f} s of a {:g} s limit "
                        "for workers {} to push ({}); they are stragglers or stuck",
                        who(), to_string(static_cast<Op>(h.op)),
                        to_string(spec.options.consistency), spec.name, worker, waited,
                        h.timeout_ms / 1000.0, blockers, clocks)));
        it = t.waiters.erase(it);
        continue;
      }
      ++it;
    }
  }

  // ---- housekeeping and checkpoints -------------------------------------------------------------

  void housekeeping() {
    auto next_checkpoint = Clock::now() + options.checkpoint_every;
    auto next_evict = Clock::now() + std::chrono::seconds(1);
    while (!stopping) {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait_for(lock, milliseconds(100), [&] { return stopping.load(); });
      }
      if (stopping) return;
      const auto now = Clock::now();
      for (auto& t : all_tables()) {
        std::vector<Reply> replies;
        {
          std::lock_guard<std::mutex> lock(t->mu);
          if (!t->waiters.empty()) settle(*t, replies);
          if (t->sparse && now >= next_evict) {
            size_t n = t->sparse->evict(now);
            if (n) DTRAIN_LOG_DEBUG("{}: evicted {} idle rows of '{}'", who(), n, t->spec().name);
          }
        }
        send(replies);
      }
      if (now >= next_evict) next_evict = now + std::chrono::seconds(1);
      if (options.checkpoint_every.count() > 0 && !options.checkpoint_dir.empty() &&
          now >= next_checkpoint) {
        next_checkpoint = now + options.checkpoint_every;
        try {
          checkpoint();
        } catch (const std::exception& e) {
          DTRAIN_LOG_ERROR("{}: scheduled checkpoint failed: {}", who(), e.what());
        }
      }
    }
  }

  std::vector<std::shared_ptr<TableEntry>> all_tables() {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<std::shared_ptr<TableEntry>> out;
    for (auto& [k, t] : tables) out.push_back(t);
    return out;
  }

  std::string checkpoint_dir() const {
    if (options.checkpoint_dir.empty())
      throw InvalidArgumentError(
          fmt::format("{} has no checkpoint directory: start it with --checkpoint-dir DIR", who()));
    return fmt::format("{}/server-{}", options.checkpoint_dir, options.index);
  }

  std::string checkpoint() {
    const std::string dir = checkpoint_dir();
    std::lock_guard<std::mutex> one_at_a_time(checkpoint_mu);
    CheckpointData data;
    data.manifest = {{"server", options.index},
                     {"num_servers", options.num_servers},
                     {"tables", nlohmann::json::array()}};
    auto start = Clock::now();
    size_t i = 0;
    for (auto& t : all_tables()) {
      std::lock_guard<std::mutex> lock(t->mu);
      const std::string prefix = fmt::format("t{}.", i++);
      nlohmann::json meta =
          t->dense ? t->dense->save(prefix, data.tensors) : t->sparse->save(prefix, data.tensors);
      meta["prefix"] = prefix;
      data.manifest["tables"].push_back(std::move(meta));
    }
    std::string path = write_checkpoint(dir, std::move(data), options.keep_checkpoints);
    DTRAIN_LOG_INFO("{}: checkpoint written to {} in {:.1f} ms", who(), path,
                    std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    return path;
  }

  void restore() {
    const std::string dir = checkpoint_dir();
    auto found = read_latest_checkpoint(dir);
    if (!found) {
      DTRAIN_LOG_INFO("{}: no checkpoint in {}; starting empty", who(), dir);
      return;
    }
    auto& [path, data] = *found;
    int saved_index = -1, saved_servers = -1;
    try {
      saved_index = json_integer<int>(data.manifest, "server", -1);
      saved_servers = json_integer<int>(data.manifest, "num_servers", -1);
    } catch (const nlohmann::json::exception&) {
      // Not numbers: reported below as a checkpoint of another server.
    }
    if (saved_index != options.index || saved_servers != options.num_servers)
      throw InvalidArgumentError(fmt::format(
          "{}: {} was written by server {} of {}, this is server {} of {}: sparse rows and dense "
          "slices are placed by the server count, so restore with the same number of servers",
          who(), path, saved_index, saved_servers, options.index, options.num_servers));
    std::map<std::string, const SafetensorsEntry*> by_name;
    for (const auto& e : data.tensors) by_name[e.name] = &e;
    std::lock_guard<std::mutex> lock(mu);
    // Only the tables file has a CRC: a manifest edited by hand, or damaged, is refused naming
    // the checkpoint rather than escaping as a JSON library's exception.
    try {
      for (const auto& meta : data.manifest.at("tables")) {
        TableSpec spec = spec_from_json(meta.at("spec"));
        const std::string prefix = meta.at("prefix").get<std::string>();
        auto entry = std::make_shared<TableEntry>();
        if (spec.sparse) {
          entry->sparse = std::make_unique<SparseTable>(spec);
          entry->sparse->restore(meta, prefix, by_name);
        } else {
          entry->dense = std::make_unique<DenseTable>(spec, std::span<const float>{});
          entry->dense->restore(meta, prefix, by_name);
        }
        tables[table_key(spec.name)] = std::move(entry);
      }
    } catch (const nlohmann::json::exception& e) {
      throw InvalidArgumentError(fmt::format(
          "{}: {}/manifest.json does not describe its tables ({}); restore another checkpoint "
          "(delete this one) or start without restoring",
          who(), path, e.what()));
    }
    DTRAIN_LOG_INFO("{}: restored {} tables from {}", who(), tables.size(), path);
  }

  void stop() {
    if (stopping.exchange(true)) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      for (auto& c : connections) {
        std::lock_guard<std::mutex> conn_lock(c->write_mu);
        if (c->fd.valid()) ::shutdown(c->fd.get(), SHUT_RDWR);
      }
    }
    cv.notify_all();
    if (accept_thread.joinable()) accept_thread.join();
    if (housekeeping_thread.joinable()) housekeeping_thread.join();
    std::vector<std::shared_ptr<Connection>> conns;
    {
      std::lock_guard<std::mutex> lock(mu);
      conns = connections;
    }
    for (auto& c : conns)
      if (c->thread.joinable()) c->thread.join();
  }
};

Server::Server(const ServerOptions& options) : impl_(std::make_unique<Impl>(options)) {
  auto& s = *impl_;
  if (options.num_servers < 1 || options.index < 0 || options.index >= options.num_servers)
    throw InvalidArgumentError(fmt::format("ps server index {} of {} is out of range",
                                           options.index, options.num_servers));
  // A server that advertises a loopback address (its job's store is on loopback: one machine)
  // listens there only, so that no other machine can reach it.
  std::string listen_host = options.listen_host;
  if (listen_host.empty() && net::is_loopback(options.advertise_host))
    listen_host = options.advertise_host;
  s.listen_fd = net::listen_tcp(listen_host, options.port);
  std::string host = options.advertise_host;
  if (host.empty())
    host = (options.listen_host.empty() || options.listen_host == "0.0.0.0") ? "127.0.0.1"
                                                                             : options.listen_host;
  s.address = fmt::format("{}:{}", host, net::local_port(s.listen_fd.get()));
  if (options.restore) s.restore();
  s.accept_thread = std::thread([&s] { s.accept_loop(); });
  s.housekeeping_thread = std::thread([&s] { s.housekeeping(); });
  DTRAIN_LOG_INFO("{}: serving (pid {})", s.who(), ::getpid());
}

Server::~Server() { impl_->stop(); }

std::string Server::address() const { return impl_->address; }

void Server::publish(Store& store) {
  store.set(fmt::format("ps/server/{}", impl_->options.index), impl_->address);
}

bool Server::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  if (timeout == std::chrono::milliseconds::max()) {
    impl_->cv.wait(lock, [&] { return impl_->done; });
    return true;
  }
  return impl_->cv.wait_for(lock, timeout, [&] { return impl_->done; });
}

void Server::stop() { impl_->stop(); }

std::string Server::checkpoint() { return impl_->checkpoint(); }

}  // namespace dtrain::ps
