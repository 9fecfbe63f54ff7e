// The worker's side of the parameter server: one connection per server, each with a sender
// thread (requests leave in the order they were made, while the caller goes on) and a receiver
// thread (answers are read straight into the caller's buffers). A Handle counts the answers it
// still expects, per server, so a timeout can say which servers are silent.
#include <sys/socket.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/env.h"
#include "common/handshake.h"
#include "common/log.h"
#include "common/socket.h"
#include "dtrain/error.h"
#include "dtrain/ps.h"
#include "dtrain/ps_cluster.h"
#include "dtrain/store.h"
#include "ps/placement.h"
#include "ps/protocol.h"
#include "ps/table_spec.h"

namespace dtrain::ps {

using std::chrono::milliseconds;

struct Handle::State {
  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::string what;                // "push_pull of table 'model'"
  std::map<int, int> outstanding;  // server -> answers still expected
  int total = 0;
  std::exception_ptr error;
  bool cancelled = false;
  std::function<void()> on_success;  // runs once every answer arrived (e.g. scatter rows)
  milliseconds timeout{300'000};     // of wait() without an argument
  // Withdraws the requests of a handle that timed out (see ServerLink::cancel).
  std::function<void(const std::shared_ptr<State>&)> cancel;

  void expect(int server, int n) {
    outstanding[server] += n;
    total += n;
  }
  bool complete() const { return error != nullptr || outstanding.empty(); }
};

namespace {

// One request waiting for its answer.
struct Pending {
  std::shared_ptr<Handle::State> state;
  Op op;
  std::byte* dest = nullptr;  // where the answer's payload goes (null: discard or keep)
  size_t dest_bytes = 0;
  std::shared_ptr<std::vector<std::byte>> keep;  // answers that are post-processed
};

struct Outgoing {
  Header header;
  std::vector<std::span<const std::byte>> parts;
  std::shared_ptr<void> owned;  // keeps copied payloads (combined rows, ids) alive
  std::shared_ptr<Handle::State> state;
};

void finish(const std::shared_ptr<Handle::State>& s, int server, std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(s->mu);
    if (error && !s->error) s->error = error;
    auto it = s->outstanding.find(server);
    if (it != s->outstanding.end() && --it->second == 0) s->outstanding.erase(it);
    // The last answer's post-processing (scattering rows into the caller's buffer) runs under
    // the lock, so that no waiter sees the call complete before its output is written.
    if (s->outstanding.empty() && !s->error && !s->cancelled && s->on_success) {
      try {
        s->on_success();
      } catch (...) {
        s->error = std::current_exception();
      }
      s->on_success = nullptr;
    }
  }
  s->cv.notify_all();
}

}  // namespace

// ---- one server connection ---------------------------------------------------------------------

class ServerLink {
 public:
  ServerLink(int index, std::string address, const ClientOptions& o)
      : index_(index), address_(std::move(address)), timeout_(o.timeout) {
    const Deadline deadline = Deadline::after(o.connect_timeout);
    const std::string context =
        fmt::format("ps worker {} connecting to server {} at {}", o.worker, index_, address_);
    fd_ = net::connect_tcp(net::parse_host_port(address_, "ps server address"), deadline, context);
    net::set_nodelay(fd_.get());
    net::set_keepalive(fd_.get(), net::kPeerKeepalive);
    // On one host, Reno rather than a pacing BBR, which measured slower on loopback
    // (docs/parameter_server.md).
    if (net::peer_is_on_this_host(fd_.get())) net::use_loopback_congestion_control(fd_.get());
    net::Hello hello{net::Role::kPsClient, o.worker, index_, static_cast<uint64_t>(o.num_workers)};
    net::handshake_connect(fd_.get(), net::HandshakeConfig{o.job_id, o.token}, hello, index_,
                           deadline, context);
    who_ = fmt::format("ps server {} at {}", index_, address_);
    sender_ = std::thread([this] { send_loop(); });
    receiver_ = std::thread([this] { receive_loop(); });
  }

  ~ServerLink() { close(true); }

  static constexpr uint8_t kSilent = 1;  // a bye that is not sent

  const std::string& who() const { return who_; }

  void submit(Outgoing out, Pending pending) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_) {
        auto error = failed_;
        // Not queued: fail the request at once.
        lock_free_finish(pending.state, error);
        return;
      }
      out.header.id = ++next_id_;
      pending_.emplace(out.header.id, std::move(pending));
      queue_.push_back(std::move(out));
    }
    cv_.notify_one();
  }

  // Says goodbye (unless `goodbye` is false: the worker is failing), then waits (briefly) for
  // the server to close, and stops both threads.
  void close(bool goodbye) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) return;
      closing_ = true;
      Outgoing bye;
      bye.header.op = static_cast<uint8_t>(Op::kBye);
      bye.header.flags = goodbye ? 0 : kSilent;
      queue_.push_back(std::move(bye));
    }
    cv_.notify_one();
    if (sender_.joinable()) sender_.join();
    if (goodbye) {  // the server closes its end once it has read the goodbye
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, milliseconds(5'000), [&] { return receiver_done_; });
    }
    ::shutdown(fd_.get(), SHUT_RDWR);
    if (receiver_.joinable()) receiver_.join();
  }

  // A timed-out handle gives up its requests: their answers will be discarded, and unsent ones
  // are dropped. Returns once no thread touches the handle's buffers.
  void cancel(const std::shared_ptr<Handle::State>& s) {
    std::unique_lock<std::mutex> lock(mu_);
    for (auto it = pending_.begin(); it != pending_.end();)
      it = it->second.state == s ? pending_.erase(it) : std::next(it);
    queue_.erase(std::remove_if(queue_.begin(), queue_.end(),
                                [&](const Outgoing& o) { return o.state == s; }),
                 queue_.end());
    // A message being written or read keeps going until that thread's own deadline.
    cv_.wait(lock, [&] { return sending_ != s && receiving_ != s; });
  }

 private:
  void lock_free_finish(const std::shared_ptr<Handle::State>& s, std::exception_ptr e) {
    // Called with mu_ held: finish() only takes the state's lock.
    finish(s, index_, e);
  }

  void send_loop() {
    for (;;) {
      Outgoing out;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty(); });
        out = std::move(queue_.front());
        queue_.pop_front();
        sending_ = out.state;
      }
      const bool bye = static_cast<Op>(out.header.op) == Op::kBye;
      try {
        if (bye && out.header.flags == kSilent) {
          // No goodbye: the server treats the closed connection as this worker failing.
        } else if (!failed()) {
          // The server's limit for holding the request is shorter than ours, so that its
          // answer, which names the workers it waited for, arrives before we give up.
          const int64_t margin = std::max<int64_t>(1000, timeout_.count() / 20);
          out.header.timeout_ms =
              static_cast<uint32_t>(std::clamp<int64_t>(timeout_.count() - margin, 1, UINT32_MAX));
          send_message(
              fd_.get(), out.header, out.parts, Deadline::after(timeout_),
              fmt::format("sending {} to {}", to_string(static_cast<Op>(out.header.op)), who_));
        }
      } catch (const TimeoutError& e) {
        fail(std::make_exception_ptr(PeerFailureError(e.what())));
      } catch (const std::exception& e) {
        // The connection broke: the same news the receiving side gives, whichever sees it first.
        fail(gone(e.what()));
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        sending_.reset();
      }
      cv_.notify_all();
      if (bye) return;
    }
  }

  void receive_loop() {
    std::vector<std::byte> discard;
    std::optional<Pending> inflight;  // the request whose answer is being read
    auto done_reading = [&] {
      {
        std::lock_guard<std::mutex> lock(mu_);
        receiving_.reset();
      }
      cv_.notify_all();
    };
    try {
      for (;;) {
        Header h = read_header(fd_.get(), Deadline::never(), fmt::format("reading from {}", who_));
        inflight.reset();
        {
          std::lock_guard<std::mutex> lock(mu_);
          auto it = pending_.find(h.id);
          if (it != pending_.end()) {
            inflight = std::move(it->second);
            pending_.erase(it);
            receiving_ = inflight->state;
          }
        }
        const Deadline body = Deadline::after(timeout_);
        const std::string context = fmt::format("reading an answer from {}", who_);
        const auto status = static_cast<Status>(h.status);
        if (status != Status::kOk) {
          std::string text(h.bytes, '\0');
          net::read_all(fd_.get(), text.data(), text.size(), body, context);
          done_reading();
          std::exception_ptr e;
          switch (status) {
            case Status::kInvalid:
              e = std::make_exception_ptr(InvalidArgumentError(text));
              break;
            case Status::kTimeout:
              e = std::make_exception_ptr(TimeoutError(text));
              break;
            case Status::kPeerFailure:
              e = std::make_exception_ptr(PeerFailureError(text));
              break;
            default:
              e = std::make_exception_ptr(InternalError(text));
              break;
          }
          if (h.id == 0) {  // about the connection itself: the server refused or retired it
            fail(e);
            break;
          }
          if (inflight) finish(inflight->state, index_, e);
          inflight.reset();
          continue;
        }
        std::byte* dest = nullptr;
        std::exception_ptr wrong_size;
        if (inflight && inflight->keep) {
          inflight->keep->resize(h.bytes);
          dest = inflight->keep->data();
        } else if (inflight && inflight->dest && h.bytes == inflight->dest_bytes) {
          dest = inflight->dest;
        } else {
          if (inflight && inflight->dest)
            wrong_size = std::make_exception_ptr(InternalError(
                fmt::format("{} answered {} with {} bytes where {} were expected", who_,
                            to_string(inflight->op), h.bytes, inflight->dest_bytes)));
          discard.resize(h.bytes);
          dest = discard.data();
        }
        net::read_all(fd_.get(), dest, h.bytes, body, context);
        done_reading();
        if (inflight) finish(inflight->state, index_, wrong_size);
        inflight.reset();
      }
    } catch (const std::exception& e) {
      bool closing;
      {
        std::lock_guard<std::mutex> lock(mu_);
        closing = closing_;
      }
      std::exception_ptr error =
          !closing ? gone(e.what())
                   : std::make_exception_ptr(AbortedError(
                         fmt::format("the connection to {} was closed by this worker", who_)));
      // The answer being read when the connection broke fails too, then everything pending.
      if (inflight) finish(inflight->state, index_, error);
      done_reading();
      fail(error);
    }
    std::lock_guard<std::mutex> lock(mu_);
    receiver_done_ = true;
    cv_.notify_all();
  }

  std::exception_ptr gone(const std::string& cause) const {
    return std::make_exception_ptr(PeerFailureError(fmt::format(
        "{} is gone ({}): the server process died or was stopped; every request to it fails. "
        "Restart the server (with --restore to resume from its last checkpoint) or the job",
        who_, cause)));
  }

  bool failed() {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_ != nullptr;
  }

  void fail(std::exception_ptr error) {
    std::unordered_map<uint64_t, Pending> pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_) failed_ = error;
      pending.swap(pending_);
    }
    cv_.notify_all();
    for (auto& [id, p] : pending) finish(p.state, index_, failed_);
    ::shutdown(fd_.get(), SHUT_RDWR);
  }

  const int index_;
  const std::string address_;
  const milliseconds timeout_;
  std::string who_;
  net::Fd fd_;
  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::deque<Outgoing> queue_;
  std::unordered_map<uint64_t, Pending> pending_;
  std::shared_ptr<Handle::State> sending_;    // the handle whose request is being written
  std::shared_ptr<Handle::State> receiving_;  // the handle whose answer is being read
  uint64_t next_id_ = 0;
  std::exception_ptr failed_;
  bool closing_ = false;
  bool receiver_done_ = false;
  std::thread sender_;
  std::thread receiver_;
};

// ---- Handle
// --------------------------------------------------------------------------------------

struct Client::Impl {
  ClientOptions options;
  std::vector<std::unique_ptr<ServerLink>> links;

  struct Table {
    TableSpec spec;  // slice fields unused
    uint64_t key = 0;
    std::vector<Slice> slices;
  };
  std::mutex mu;  // guards tables and load
  std::map<std::string, Table> tables;
  std::vector<uint64_t> load;

  const Table& table(const std::string& name, bool sparse) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = tables.find(name);
    if (it == tables.end())
      throw InvalidArgumentError(fmt::format(
          "ps worker {}: table '{}' is unknown to this client: call create_{}(\"{}\", ...) first",
          options.worker, name, sparse ? "sparse" : "dense", name));
    if (it->second.spec.sparse != sparse)
      throw InvalidArgumentError(fmt::format(
          "ps worker {}: table '{}' is {}: use {}", options.worker, name,
          it->second.spec.sparse ? "sparse" : "dense",
          it->second.spec.sparse ? "push_rows / pull_rows" : "push / pull / push_pull"));
    return it->second;
  }

  std::shared_ptr<Handle::State> new_state(std::string what) {
    auto s = std::make_shared<Handle::State>();
    s->what = fmt::format("ps worker {}: {}", options.worker, what);
    s->timeout = options.timeout;
    s->cancel = [this](const std::shared_ptr<Handle::State>& state) {
      for (auto& link : links) link->cancel(state);
    };
    return s;
  }

  void check_f32(const TensorView& t, size_t numel, const std::string& what) {
    if (t.dtype != DType::kF32)
      throw InvalidArgumentError(fmt::format("ps worker {}: {} needs f32 values; got {}",
                                             options.worker, what, to_string(t.dtype)));
    if (t.numel != numel)
      throw InvalidArgumentError(fmt::format("ps worker {}: {} needs {} elements; got {}",
                                             options.worker, what, numel, t.numel));
    if (t.device != Device::kCpu)
      throw InvalidArgumentError(fmt::format(
          "ps worker {}: {}: the parameter server takes CPU tensors; copy CUDA tensors to the "
          "host first",
          options.worker, what));
  }

  Handle dense(Op op, const std::string& name, const TensorView* grad, const TensorView* out) {
    const Table& t = table(name, false);
    const std::string what = fmt::format("{} of table '{}'", to_string(op), name);
    if (grad) check_f32(*grad, t.spec.numel, what + " (gradient)");
    if (out) check_f32(*out, t.spec.numel, what + " (output)");
    auto state = new_state(what);
    struct Part {
      int server;
      Outgoing out;
      Pending pending;
    };
    std::vector<Part> parts;
    for (const Slice& s : t.slices) {
      uint64_t begin = 0;
      do {
        const uint64_t count = std::min<uint64_t>(kChunkElems, s.length - begin);
        const uint64_t offset = s.offset + begin;
        Part p{s.server, {}, {}};
        p.out.header.op = static_cast<uint8_t>(op);
        p.out.header.dtype = static_cast<uint8_t>(DType::kF32);
        p.out.header.table = t.key;
        p.out.header.offset = offset;
        p.out.header.count = count;
        p.out.state = state;
        if (grad) {
          p.out.parts.push_back({static_cast<const std::byte*>(grad->data) + offset * sizeof(float),
                                 count * sizeof(float)});
          p.out.header.bytes = count * sizeof(float);
        }
        p.pending.state = state;
        p.pending.op = op;
        if (out) {
          p.pending.dest = static_cast<std::byte*>(out->data) + offset * sizeof(float);
          p.pending.dest_bytes = count * sizeof(float);
        }
        parts.push_back(std::move(p));
        begin += kChunkElems;
      } while (begin < s.length);
    }
    {
      std::lock_guard<std::mutex> lock(state->mu);
      for (const auto& p : parts) state->expect(p.server, 1);
    }
    for (auto& p : parts) links[p.server]->submit(std::move(p.out), std::move(p.pending));
    return Handle(state);
  }

  // Per server: the distinct ids it holds, and for each of those the positions in the caller's
  // list where it appears.
  struct RowPlan {
    std::vector<std::vector<uint64_t>> ids;
    std::vector<std::vector<std::vector<size_t>>> positions;
  };
  RowPlan plan_rows(std::span<const uint64_t> ids) {
    const int servers = static_cast<int>(links.size());
    RowPlan plan;
    plan.ids.resize(servers);
    plan.positions.resize(servers);
    std::unordered_map<uint64_t, std::pair<int, size_t>> seen;
    seen.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      auto [it, fresh] = seen.emplace(ids[i], std::pair<int, size_t>{0, 0});
      if (fresh) {
        const int s = server_of_row(ids[i], servers);
        it->second = {s, plan.ids[s].size()};
        plan.ids[s].push_back(ids[i]);
        plan.positions[s].emplace_back();
      }
      plan.positions[it->second.first][it->second.second].push_back(i);
    }
    return plan;
  }

  Handle rows(Op op, const std::string& name, std::span<const uint64_t> ids, TensorView values) {
    const Table& t = table(name, true);
    const size_t width = t.spec.width;
    const std::string what = fmt::format("{} of table '{}'", to_string(op), name);
    check_f32(values, ids.size() * width,
              fmt::format("{} ({} ids of width {})", what, ids.size(), width));
    auto state = new_state(what);
    auto plan = std::make_shared<RowPlan>(plan_rows(ids));
    const bool push = op == Op::kPushRows;
    const bool consistency_needs_all_servers = t.spec.options.consistency != Consistency::kAsync;
    std::vector<int> targets;
    for (int s = 0; s < static_cast<int>(links.size()); ++s)
      if (!plan->ids[s].empty() || (push && consistency_needs_all_servers)) targets.push_back(s);
    std::vector<std::shared_ptr<std::vector<std::byte>>> answers(links.size());
    for (int s : targets)
      if (!push) answers[s] = std::make_shared<std::vector<std::byte>>();
    if (!push) {
      // Scatter each server's rows to every position its ids hold in the caller's list.
      float* out = static_cast<float*>(values.data);
      state->on_success = [plan, answers, out, width] {
        for (size_t s = 0; s < answers.size(); ++s) {
          if (!answers[s]) continue;
          const float* rows = reinterpret_cast<const float*>(answers[s]->data());
          for (size_t r = 0; r < plan->positions[s].size(); ++r)
            for (size_t pos : plan->positions[s][r])
              std::memcpy(out + pos * width, rows + r * width, width * sizeof(float));
        }
      };
    }
    {
      std::lock_guard<std::mutex> lock(state->mu);
      for (int s : targets) state->expect(s, 1);
    }
    const float* grads = static_cast<const float*>(values.data);
    for (int s : targets) {
      const uint64_t bytes = plan->ids[s].size() * (sizeof(uint64_t) + (push ? width * 4 : 0));
      if (bytes > kMaxPayload)
        throw InvalidArgumentError(fmt::format(
            "ps worker {}: {} sends {} bytes to server {}, more than a request may carry ({}): "
            "split the ids over several calls",
            options.worker, what, bytes, s, kMaxPayload));
    }
    for (int s : targets) {
      Outgoing o;
      o.header.op = static_cast<uint8_t>(op);
      o.header.dtype = static_cast<uint8_t>(values.dtype);
      o.header.table = t.key;
      o.header.count = plan->ids[s].size();
      o.header.width = width;
      o.state = state;
      // The payload is built here: ids, and for a push each distinct id's summed gradient.
      auto body = std::make_shared<std::vector<std::byte>>();
      const size_t n = plan->ids[s].size();
      body->resize(n * sizeof(uint64_t) + (push ? n * width * sizeof(float) : 0));
      if (n > 0) std::memcpy(body->data(), plan->ids[s].data(), n * sizeof(uint64_t));
      if (push) {
        float* sum = reinterpret_cast<float*>(body->data() + n * sizeof(uint64_t));
        for (size_t r = 0; r < n; ++r) {
          const auto& where = plan->positions[s][r];
          std::memcpy(sum + r * width, grads + where[0] * width, width * sizeof(float));
          for (size_t k = 1; k < where.size(); ++k)
            for (size_t j = 0; j < width; ++j) sum[r * width + j] += grads[where[k] * width + j];
        }
      }
      o.header.bytes = body->size();
      o.parts.push_back({body->data(), body->size()});
      o.owned = body;
      Pending p;
      p.state = state;
      p.op = op;
      p.keep = answers[s];
      links[s]->submit(std::move(o), std::move(p));
    }
    if (targets.empty()) state->cv.notify_all();
    return Handle(state);
  }

  // Sends a create to `server` and waits for its answer.
  bool create_on(int server, const Table& t, const TableSpec& spec, std::span<const float> init) {
    auto state = new_state(fmt::format("create of table '{}' on server {}", spec.name, server));
    std::string text = to_json(spec).dump();
    auto body = std::make_shared<std::vector<std::byte>>(text.size() + init.size_bytes());
    std::memcpy(body->data(), text.data(), text.size());
    if (!init.empty()) std::memcpy(body->data() + text.size(), init.data(), init.size_bytes());
    Outgoing o;
    o.header.op = static_cast<uint8_t>(spec.sparse ? Op::kCreateSparse : Op::kCreateDense);
    o.header.dtype = static_cast<uint8_t>(DType::kF32);
    o.header.table = t.key;
    o.header.count = text.size();
    o.header.bytes = body->size();
    o.parts.push_back({body->data(), body->size()});
    o.owned = body;
    o.state = state;
    Pending p;
    p.state = state;
    p.op = static_cast<Op>(o.header.op);
    p.keep = std::make_shared<std::vector<std::byte>>();
    auto answer = p.keep;
    {
      std::lock_guard<std::mutex> lock(state->mu);
      state->expect(server, 1);
    }
    links[server]->submit(std::move(o), std::move(p));
    Handle h(state);
    h.wait();
    auto j = nlohmann::json::parse(
        std::string(reinterpret_cast<const char*>(answer->data()), answer->size()), nullptr, false);
    return !j.is_discarded() && j.value("created", false);
  }

  TableSpec base_spec(const std::string& name, const TableOptions& options) {
    TableSpec spec;
    spec.name = name;
    spec.num_workers = options_workers();
    spec.options = options;
    return spec;
  }
  int options_workers() const { return options.num_workers; }
};

void Handle::wait() {
  if (state_) wait(state_->timeout);
}

void Handle::wait(milliseconds timeout) {
  if (!state_) return;
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->cv.wait_for(lock, timeout, [&] { return state_->complete(); })) {
    std::vector<int> silent;
    int missing = 0;
    for (const auto& [s, n] : state_->outstanding) {
      silent.push_back(s);
      missing += n;
    }
    state_->cancelled = true;
    std::string message = fmt::format(
        "{}: no answer from servers {} after {:g} s ({} of {} answers missing): the servers are "
        "overloaded, waiting for other workers (sync/SSP), or stuck",
        state_->what, silent, timeout.count() / 1000.0, missing, state_->total);
    auto cancel = state_->cancel;
    lock.unlock();
    if (cancel) cancel(state_);  // afterwards no thread touches this call's buffers
    throw TimeoutError(message);
  }
  if (state_->error) {
    // Other requests of this call may still be under way: withdraw them, so that no thread
    // touches the caller's buffers once this throws.
    auto error = state_->error;
    auto cancel = state_->cancel;
    const bool pending = !state_->outstanding.empty();
    state_->cancelled = true;
    lock.unlock();
    if (pending && cancel) cancel(state_);
    std::rethrow_exception(error);
  }
}

bool Handle::wait_for(milliseconds slice) {
  if (!state_) return true;
  {
    std::unique_lock<std::mutex> lock(state_->mu);
    if (!state_->cv.wait_for(lock, slice, [&] { return state_->complete(); })) return false;
  }
  wait(milliseconds(0));  // complete: returns, or throws the call's error
  return true;
}

milliseconds Handle::timeout() const { return state_ ? state_->timeout : milliseconds(0); }

bool Handle::done() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->complete();
}

// ---- Client -------------------------------------------------------------------------------------

Client::Client(const ClientOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  if (options.servers.empty())
    throw InvalidArgumentError("ps client: no servers given (ClientOptions::servers is empty)");
  if (options.num_workers < 1 || options.worker < 0 || options.worker >= options.num_workers)
    throw InvalidArgumentError(fmt::format("ps client: worker {} of {} is out of range",
                                           options.worker, options.num_workers));
  impl_->load.assign(options.servers.size(), 0);
  for (size_t i = 0; i < options.servers.size(); ++i)
    impl_->links.push_back(
        std::make_unique<ServerLink>(static_cast<int>(i), options.servers[i], options));
  DTRAIN_LOG_DEBUG("ps worker {}: connected to {} servers", options.worker, options.servers.size());
}

Client::~Client() {
  // Outstanding requests finish first: the sender sends the goodbye after them. A client
  // destroyed while an exception unwinds the worker says no goodbye, so that the servers count
  // the worker as failed (its peers' sync waits fail, naming it) rather than as finished.
  const bool failing = std::uncaught_exceptions() > 0;
  for (auto& link : impl_->links) link->close(!failing);
}

std::unique_ptr<Client> Client::from_env() {
  Cluster cluster = resolve_cluster();
  if (cluster.role != Cluster::Role::kWorker)
    throw InvalidArgumentError(
        fmt::format("ps: this process has the role {} ({}); only workers create a Client",
                    to_string(cluster.role), cluster.source));
  ClientOptions o;
  o.num_workers = cluster.num_workers;
  o.worker = cluster.index;
  o.timeout = std::chrono::seconds(env::get_int(env::kTimeout).value_or(300));
  o.connect_timeout = std::chrono::seconds(env::get_int(env::kConnectTimeout).value_or(60));
  o.job_id = env::get_string(env::kJobId);
  o.token = env::get_string(env::kAuthToken);
  if (!cluster.servers.empty()) {
    o.servers = cluster.servers;
  } else {
    TcpStoreOptions so;
    so.host = cluster.store_addr;
    so.port = cluster.store_port;
    so.connect_timeout = o.connect_timeout;
    so.timeout = o.connect_timeout;
    TcpStore store(so);
    if (o.worker < 0) o.worker = static_cast<int>(store.add("ps/next_worker", 1) - 1);
    std::vector<std::string> keys;
    for (int i = 0; i < cluster.num_servers; ++i) keys.push_back(fmt::format("ps/server/{}", i));
    for (const auto& value : store.multi_get(keys))
      o.servers.emplace_back(value.begin(), value.end());
  }
  return std::make_unique<Client>(o);
}

void Client::create_dense(const std::string& name, TensorView init, const TableOptions& options) {
  auto& m = *impl_;
  if (init.dtype != DType::kF32)
    throw InvalidArgumentError(fmt::format("ps worker {}: dense table '{}' must be f32; got {}",
                                           m.options.worker, name, to_string(init.dtype)));
  Impl::Table t;
  t.spec = m.base_spec(name, options);
  t.spec.numel = init.numel;
  t.key = table_key(name);
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.tables.count(name))
      throw InvalidArgumentError(
          fmt::format("ps worker {}: table '{}' was already created", m.options.worker, name));
    t.slices = place_dense(init.numel, m.load);
  }
  const float* values = static_cast<const float*>(init.data);
  for (const Slice& s : t.slices) {
    TableSpec spec = t.spec;
    spec.slice_offset = s.offset;
    spec.slice_length = s.length;
    std::span<const float> part;
    if (values) part = {values + s.offset, s.length};
    m.create_on(s.server, t, spec, part);
  }
  std::lock_guard<std::mutex> lock(m.mu);
  m.tables.emplace(name, std::move(t));
}

void Client::create_sparse(const std::string& name, const SparseTableOptions& options) {
  auto& m = *impl_;
  if (options.width == 0)
    throw InvalidArgumentError(
        fmt::format("ps worker {}: sparse table '{}' needs a width > 0", m.options.worker, name));
  Impl::Table t;
  t.spec = m.base_spec(name, options.table);
  t.spec.sparse = true;
  t.spec.width = options.width;
  t.spec.init = options.init;
  t.spec.evict_after_s = options.evict_after.count();
  t.key = table_key(name);
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.tables.count(name))
      throw InvalidArgumentError(
          fmt::format("ps worker {}: table '{}' was already created", m.options.worker, name));
  }
  for (int s = 0; s < num_servers(); ++s) m.create_on(s, t, t.spec, {});
  std::lock_guard<std::mutex> lock(m.mu);
  m.tables.emplace(name, std::move(t));
}

Handle Client::push(const std::string& name, TensorView grad) {
  return impl_->dense(Op::kPush, name, &grad, nullptr);
}
Handle Client::pull(const std::string& name, TensorView out) {
  return impl_->dense(Op::kPull, name, nullptr, &out);
}
Handle Client::push_pull(const std::string& name, TensorView grad, TensorView out) {
  return impl_->dense(Op::kPushPull, name, &grad, &out);
}
Handle Client::pull_rows(const std::string& table, std::span<const uint64_t> ids, TensorView out) {
  return impl_->rows(Op::kPullRows, table, ids, out);
}
Handle Client::push_rows(const std::string& table, std::span<const uint64_t> ids,
                         TensorView grads) {
  return impl_->rows(Op::kPushRows, table, ids, grads);
}

namespace {

// Sends one request of `op` (with `offset`) to every server and waits for their answers.
std::vector<std::shared_ptr<std::vector<std::byte>>> ask_every_server(Client::Impl& m, Op op,
                                                                      uint64_t offset) {
  std::vector<std::shared_ptr<std::vector<std::byte>>> answers;
  auto state = m.new_state(to_string(op));
  const int servers = static_cast<int>(m.links.size());
  {
    std::lock_guard<std::mutex> lock(state->mu);
    for (int s = 0; s < servers; ++s) state->expect(s, 1);
  }
  for (int s = 0; s < servers; ++s) {
    Outgoing o;
    o.header.op = static_cast<uint8_t>(op);
    o.header.offset = offset;
    o.state = state;
    Pending p;
    p.state = state;
    p.op = op;
    p.keep = std::make_shared<std::vector<std::byte>>();
    answers.push_back(p.keep);
    m.links[s]->submit(std::move(o), std::move(p));
  }
  Handle(state).wait();
  return answers;
}

}  // namespace

void Client::forget_worker(int worker) {
  ask_every_server(*impl_, Op::kForget, static_cast<uint64_t>(worker));
}

std::vector<std::string> Client::checkpoint() {
  const auto answers = ask_every_server(*impl_, Op::kCheckpoint, 0);
  std::vector<std::string> paths;
  for (const auto& a : answers) {
    auto j = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(a->data()), a->size()),
                                   nullptr, false);
    paths.push_back(j.is_discarded() ? std::string() : j.value("path", ""));
  }
  return paths;
}

int Client::worker() const { return impl_->options.worker; }
int Client::num_servers() const { return static_cast<int>(impl_->links.size()); }

}  // namespace dtrain::ps
