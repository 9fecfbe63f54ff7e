// Coordinator: the negotiation cycle, the response cache and tensor fusion (see coordinator.h).
//
// Cost per cycle: one allgather of 1 + cache_capacity/8 bytes per rank. A negotiation adds an
// allgather of sizes, an allgatherv of the requests and two broadcasts of rank 0's answer; in
// the steady state every tensor is cached and there is none.
#include "horovod/coordinator.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/cuda_staging.h"
#include "comm/flight_recorder.h"
#include "common/byte_order.h"
#include "common/deadline.h"
#include "common/reduce.h"
#include "dtrain/error.h"
#include "dtrain/timeline.h"
#include "horovod/negotiated_calls.h"

namespace dtrain {

using Clock = std::chrono::steady_clock;

namespace {

// dst = src, byte for byte; either may be in a GPU's memory (copied through the CUDA staging).
void copy_bytes(std::string_view who, const TensorView& dst, const TensorView& src,
                const Deadline& deadline) {
  if (comm::on_cuda(dst) || comm::on_cuda(src))
    comm::copy_cuda(who, dst, src, deadline);
  else
    std::memcpy(dst.data, src.data, src.nbytes());
}

constexpr uint8_t kFlagNewTensors = 1;  // has tensors to negotiate
constexpr uint8_t kFlagStopping = 2;    // its coordinator is being destroyed
constexpr uint8_t kFlagReport = 4;      // rank 0 has an error to report
constexpr uint8_t kFlagJoined = 8;      // joined: zeros for whatever the others reduce

constexpr uint8_t kAnswerOk = 0;
constexpr uint8_t kAnswerStall = 1;

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(v); }
  void u64(uint64_t v) { ByteWriter(out_).u64(v); }
  void str(const std::string& s) { ByteWriter(out_).sized(s); }
  std::vector<uint8_t>& bytes() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return at_ >= size_; }
  uint8_t u8() {
    need(1);
    return data_[at_++];
  }
  uint64_t u64() {
    need(8);
    const auto v = load_le<uint64_t>(data_ + at_);
    at_ += 8;
    return v;
  }
  std::string str() {
    uint64_t n = u64();
    need(n);
    std::string s(reinterpret_cast<const char*>(data_ + at_), n);
    at_ += n;
    return s;
  }

 private:
  void need(uint64_t n) {
    if (at_ + n > size_)
      throw InternalError(
          fmt::format("coordinator: message of {} bytes cut short at byte {}", size_, at_));
  }
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

std::vector<int> ranks_where(const std::vector<uint8_t>& flags, bool value) {
  std::vector<int> out;
  for (size_t r = 0; r < flags.size(); ++r)
    if ((flags[r] != 0) == value) out.push_back(static_cast<int>(r));
  return out;
}

}  // namespace

void Coordinator::Handle::finish(std::exception_ptr error, int last_joined) {
  comm::FlightRecorder::global().ended(flight_, error == nullptr);
  std::vector<std::function<void(std::exception_ptr)>> callbacks;
  {
    std::lock_guard lock(mutex_);
    done_ = true;
    error_ = error;
    last_joined_ = last_joined;
    callbacks.swap(callbacks_);
  }
  cv_.notify_all();
  for (auto& callback : callbacks) callback(error);
}

void Coordinator::Handle::on_done(std::function<void(std::exception_ptr)> callback) {
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex_);
    if (!done_) {
      callbacks_.push_back(std::move(callback));
      return;
    }
    error = error_;
  }
  callback(error);
}

int Coordinator::Handle::last_joined() const {
  std::lock_guard lock(mutex_);
  return last_joined_;
}

bool Coordinator::Handle::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!cv_.wait_for(lock, timeout, [&] { return done_; })) return false;
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Coordinator::Handle::done() const {
  std::lock_guard lock(mutex_);
  return done_;
}

void Coordinator::Handle::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!cv_.wait_for(lock, timeout, [&] { return done_; }))
    throw TimeoutError(fmt::format(
        "{}: tensor '{}' was not reduced within {} ms (other ranks slow to submit it, or "
        "stalled; see the stall_timeout error if one follows)",
        owner_, name_, timeout.count()));
  if (error_) std::rethrow_exception(error_);
}

Coordinator::Coordinator(std::shared_ptr<ProcessGroup> group, CoordinatorOptions options)
    : group_(std::move(group)), options_(options) {
  if (options_.timeout.count() == 0) options_.timeout = group_->timeout();
  // The negotiation's collectives run every cycle: the recorder keeps the calls they serve.
  auto& recorder = comm::FlightRecorder::global();
  recorder.mute(recorder.group_id(group_->name()));
  flight_group_ = recorder.group_id(options_.name);
  thread_ = std::jthread([this](std::stop_token stop) { loop(stop); });
}

uint64_t Coordinator::record(const std::string& name, uint8_t kind, DType dtype, uint64_t count,
                             ReduceOp op) {
  comm::FlightCall call{
      .kind = comm::FlightCall::Kind::kNamed, .group = flight_group_, .name = name};
  call.call.kind = collective_kind_of(kind);  // the callers' codes are Call::Kind's
  call.call.dtype = dtype;
  call.call.count = count;
  call.call.op = op;
  return comm::FlightRecorder::global().record(call);
}

Coordinator::~Coordinator() { stop(); }

void Coordinator::stop() {
  {
    std::lock_guard lock(mutex_);
    stop_requested_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

Coordinator::Request Coordinator::request_of(const Entry& e) {
  if (e.call.kind == 0)
    return Request{e.name, e.tensor.dtype, e.tensor.numel, e.op, 0, e.call.signature, e.call.text};
  return Request{e.name,      e.call.dtype,     0,          ReduceOp::kSum,
                 e.call.kind, e.call.signature, e.call.text};
}

std::shared_ptr<Coordinator::Handle> Coordinator::submit(const std::string& name,
                                                         const TensorView& tensor, ReduceOp op,
                                                         const std::vector<int64_t>& shape) {
  Entry e;
  e.name = name;
  e.tensor = tensor;
  e.op = op;
  e.call.kind = 0;
  if (!shape.empty()) {
    e.call.signature = std::hash<std::string>{}(fmt::format("{}", fmt::join(shape, ",")));
    e.call.text = fmt::format("{} [{}]", to_string(tensor.dtype), fmt::join(shape, ", "));
  }
  return enqueue(std::move(e));
}

std::shared_ptr<Coordinator::Handle> Coordinator::submit_call(
    const std::string& name, CallRequest request, std::function<void(ProcessGroup&)> body) {
  if (request.kind == 0)
    throw InternalError("Coordinator::submit_call: kind 0 is the all-reduce's; use submit()");
  Entry e;
  e.name = name;
  e.op = ReduceOp::kSum;
  e.call = std::move(request);
  e.body = std::move(body);
  return enqueue(std::move(e));
}

std::shared_ptr<Coordinator::Handle> Coordinator::enqueue(Entry entry) {
  const std::string& name = entry.name;
  auto handle = std::make_shared<Handle>();
  handle->name_ = name;
  handle->owner_ = options_.name;
  std::lock_guard lock(mutex_);
  if (error_) std::rethrow_exception(error_);
  if (stop_requested_)
    throw InvalidArgumentError(
        fmt::format("rank {}: {}: tensor '{}' submitted while the coordinator is stopping",
                    group_->rank(), options_.name, name));
  if (join_ != nullptr)
    throw InvalidArgumentError(
        fmt::format("rank {}: {}: tensor '{}' submitted after this rank joined; a rank "
                    "that called join() submits nothing until every rank has joined",
                    group_->rank(), options_.name, name));
  if (!inflight_.insert(name).second)
    throw InvalidArgumentError(
        fmt::format("rank {}: {}: '{}' submitted again before its previous one finished; names "
                    "must be unique among the calls in flight",
                    group_->rank(), options_.name, name));
  entry.handle = handle;
  handle->flight_ = record(entry.name, entry.call.kind,
                           entry.call.kind == 0 ? entry.tensor.dtype : entry.call.dtype,
                           entry.tensor.numel, entry.op);
  incoming_.push_back(std::move(entry));
  return handle;
}

std::shared_ptr<Coordinator::Handle> Coordinator::join() {
  auto handle = std::make_shared<Handle>();
  handle->name_ = "join";
  handle->owner_ = options_.name;
  std::lock_guard lock(mutex_);
  if (error_) std::rethrow_exception(error_);
  if (join_ != nullptr)
    throw InvalidArgumentError(
        fmt::format("rank {}: join() called again before every rank joined", group_->rank()));
  if (!inflight_.empty())
    throw InvalidArgumentError(fmt::format(
        "rank {}: join() called while {} submitted tensors are not reduced yet; wait for them "
        "(synchronize) first",
        group_->rank(), inflight_.size()));
  join_ = handle;
  joined_at_ = std::chrono::system_clock::now();
  handle->flight_ = record("join", 0, DType::kU8, 0, ReduceOp::kSum);
  return handle;
}

std::exception_ptr Coordinator::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

Coordinator::Stats Coordinator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void Coordinator::fail(std::exception_ptr error) {
  std::vector<Entry> incoming;
  {
    std::lock_guard lock(mutex_);
    error_ = error;
    incoming.swap(incoming_);
    inflight_.clear();
  }
  std::shared_ptr<Handle> join;
  {
    std::lock_guard lock(mutex_);
    join.swap(join_);
  }
  for (auto& e : pending_) e.handle->finish(error);
  for (auto& e : incoming) e.handle->finish(error);
  if (join != nullptr) join->finish(error);
  pending_.clear();
}

void Coordinator::loop(std::stop_token stop) {
  auto next = Clock::now();
  for (;;) {
    bool stopping = false;
    {
      std::lock_guard lock(mutex_);
      stopping = stop_requested_;
      for (auto& e : incoming_) pending_.push_back(std::move(e));
      incoming_.clear();
    }
    bool all_stopping = false;
    try {
      cycle(stopping, all_stopping);
    } catch (...) {
      fail(std::current_exception());
      return;
    }
    if (all_stopping) {
      fail(std::make_exception_ptr(
          AbortedError(fmt::format("rank {}: {}: the coordinator stopped before these tensors were "
                                   "reduced",
                                   group_->rank(), options_.name))));
      return;
    }
    next += options_.cycle_time;
    auto now = Clock::now();
    if (next < now) {
      next = now;
    } else {
      std::this_thread::sleep_until(next);
    }
  }
}

void Coordinator::cycle(bool stopping, bool& all_stopping) {
  const int n = group_->size();
  const int me = group_->rank();
  const size_t bit_bytes = (options_.cache_capacity + 7) / 8;
  // Flags, one bit per cached tensor, and when this rank joined (microseconds of the wall clock:
  // the ranks' phases in a cycle differ, their clocks agree, exactly on one host).
  const size_t state_bytes = 1 + bit_bytes + 8;
  auto cached_id = [&](const Entry& e) -> std::optional<size_t> {
    auto it = cache_id_.find(e.name);
    if (it == cache_id_.end() || !(cache_[it->second] == request_of(e))) return std::nullopt;
    return it->second;
  };

  std::shared_ptr<Handle> join;
  std::chrono::system_clock::time_point joined_at;
  {
    std::lock_guard lock(mutex_);
    join = join_;
    joined_at = joined_at_;
  }
  std::vector<uint8_t> state(state_bytes, 0);
  for (const auto& e : pending_) {
    if (auto id = cached_id(e)) {
      state[1 + *id / 8] |= static_cast<uint8_t>(1u << (*id % 8));
    } else if (!e.sent) {
      state[0] |= kFlagNewTensors;
    }
  }
  if (stopping) state[0] |= kFlagStopping;
  if (me == 0 && !stall_error_.empty()) state[0] |= kFlagReport;
  if (join != nullptr) {
    state[0] |= kFlagJoined;
    auto when = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(joined_at.time_since_epoch())
            .count());
    store_le(&state[1 + bit_bytes], when);
  }

  std::vector<uint8_t> all(state_bytes * static_cast<size_t>(n));
  AllgatherOptions ao;
  ao.timeout = options_.timeout;
  group_->allgather(TensorView::of(all), TensorView::of(state), ao)->wait();

  bool negotiate_now = false;
  all_stopping = true;
  std::vector<uint8_t> stopping_ranks(n, 0);
  std::vector<uint8_t> joined(n, 0);
  int joined_count = 0;
  for (int r = 0; r < n; ++r) {
    uint8_t f = all[r * state_bytes];
    negotiate_now |= (f & (kFlagNewTensors | kFlagReport)) != 0;
    stopping_ranks[r] = (f & kFlagStopping) != 0;
    all_stopping &= stopping_ranks[r] != 0;
    joined[r] = (f & kFlagJoined) != 0;
    joined_count += joined[r];
  }
  if (stopping) {
    if (stop_seen_ == Clock::time_point{}) stop_seen_ = Clock::now();
    if (!all_stopping && Clock::now() - stop_seen_ > options_.timeout)
      throw TimeoutError(
          fmt::format("rank {}: {}: destroyed, but ranks [{}] kept theirs running for {} "
                      "ms; destroy it on every rank at the same point",
                      me, options_.name, fmt::join(ranks_where(stopping_ranks, false), ", "),
                      options_.timeout.count()));
  }
  if (joined_count == n) {
    // Every rank joined (so none has anything pending): the one that came last joined latest
    // (the highest rank of equals). Cycles cannot tell: each rank reads its state at its own
    // moment of the cycle. Every rank reads the same times, so gives the same answer.
    auto joined_when = [&](int r) {
      return load_le<uint64_t>(&all[r * state_bytes + 1 + bit_bytes]);
    };
    int last = n - 1;
    for (int r = n - 2; r >= 0; --r)
      if (joined_when(r) > joined_when(last)) last = r;
    joined_before_.clear();
    {
      std::lock_guard lock(mutex_);
      join_ = nullptr;
    }
    join->finish(nullptr, last);
    return;
  }
  // A rank that just joined may complete tensors rank 0 holds as not ready everywhere.
  if (joined_count > 0 && joined != joined_before_) negotiate_now = true;
  joined_before_ = joined;

  // Cached tensors ready on every rank (a joined rank counts as ready), in cache order.
  std::vector<Request> run;
  std::vector<std::vector<uint8_t>> holders(cache_.size());
  for (size_t id = 0; id < cache_.size(); ++id) {
    std::vector<uint8_t> has(n, 0);
    int count = 0;
    for (int r = 0; r < n; ++r) {
      has[r] = ((all[r * state_bytes + 1 + id / 8] >> (id % 8)) & 1) | joined[r];
      count += has[r];
    }
    if (count == n) run.push_back(cache_[id]);
    if (me == 0) {
      if (count > joined_count && count < n) {
        partial_since_.emplace(id, Clock::now());
      } else {
        partial_since_.erase(id);
      }
    }
    holders[id] = std::move(has);
  }
  const size_t cached_count = run.size();

  if (negotiate_now) {
    std::vector<Request> mine;
    for (auto& e : pending_) {
      if (e.sent || cached_id(e)) continue;
      e.sent = true;
      mine.push_back(request_of(e));
    }
    std::string error;
    std::vector<Refusal> refused;
    std::vector<Request> agreed = negotiate(mine, joined, error, refused);
    if (!error.empty()) throw TimeoutError(fmt::format("rank {}: {}", me, error));
    refuse(refused);
    for (auto& q : agreed) {
      // Calls are negotiated each time: with ranks joined they must fail, not run from the cache.
      if (q.kind == 0 && cache_.size() < options_.cache_capacity && cache_id_.count(q.name) == 0) {
        cache_id_[q.name] = cache_.size();
        cache_.push_back(q);
      }
      run.push_back(std::move(q));
    }
  }
  {
    std::lock_guard lock(mutex_);  // before execute(), which lets the submitters go
    ++stats_.cycles;
    stats_.negotiations += negotiate_now ? 1 : 0;
    stats_.cached_tensors += cached_count;
    stats_.tensors += run.size();
  }
  execute(run, n - joined_count, join != nullptr);
  if (me == 0) stall_error_ = rank0_stall_error(holders);
}

void Coordinator::refuse(const std::vector<Refusal>& refused) {
  if (refused.empty()) return;
  std::vector<std::pair<std::shared_ptr<Handle>, std::string>> failed;
  std::vector<Entry> rest;
  for (auto& e : pending_) {
    auto it = std::find_if(refused.begin(), refused.end(),
                           [&](const Refusal& r) { return r.name == e.name; });
    if (it == refused.end()) {
      rest.push_back(std::move(e));
    } else {
      failed.emplace_back(e.handle, it->why);
    }
  }
  pending_ = std::move(rest);
  {
    std::lock_guard lock(mutex_);
    for (const auto& [h, why] : failed) inflight_.erase(h->name_);
  }
  for (const auto& [h, why] : failed)
    h->finish(std::make_exception_ptr(
        InvalidArgumentError(fmt::format("rank {}: {}", group_->rank(), why))));
}

std::vector<Coordinator::Request> Coordinator::negotiate(const std::vector<Request>& mine,
                                                         const std::vector<uint8_t>& joined,
                                                         std::string& error,
                                                         std::vector<Refusal>& refused) {
  const int n = group_->size();
  auto write_request = [](Writer& w, const Request& q) {
    w.str(q.name);
    w.u8(static_cast<uint8_t>(q.dtype));
    w.u64(q.numel);
    w.u8(static_cast<uint8_t>(q.op));
    w.u8(q.kind);
    w.u64(q.signature);
    w.str(q.text);
  };
  Writer w;
  for (const auto& r : mine) write_request(w, r);
  std::vector<uint8_t>& payload = w.bytes();
  std::vector<int64_t> size = {static_cast<int64_t>(payload.size())};
  std::vector<int64_t> sizes(n);
  AllgatherOptions ao;
  ao.timeout = options_.timeout;
  group_->allgather(TensorView::of(sizes), TensorView::of(size), ao)->wait();
  std::vector<size_t> counts(sizes.begin(), sizes.end());
  size_t total = 0;
  for (size_t c : counts) total += c;
  std::vector<uint8_t> gathered(std::max<size_t>(total, 1));
  std::vector<uint8_t> input = payload.empty() ? std::vector<uint8_t>(1) : payload;
  group_
      ->allgatherv(TensorView{gathered.data(), total, DType::kU8},
                   TensorView{input.data(), payload.size(), DType::kU8}, counts, ao)
      ->wait();
  auto read_request = [](Reader& rd) {
    Request q;
    q.name = rd.str();
    q.dtype = static_cast<DType>(rd.u8());
    q.numel = rd.u64();
    q.op = static_cast<ReduceOp>(rd.u8());
    q.kind = rd.u8();
    q.signature = rd.u64();
    q.text = rd.str();
    return q;
  };

  Writer answer;
  if (group_->rank() == 0) {
    std::vector<std::vector<Request>> requests(n);
    size_t at = 0;
    for (int r = 0; r < n; ++r) {
      Reader rd(gathered.data() + at, counts[r]);
      while (!rd.done()) requests[r].push_back(read_request(rd));
      at += counts[r];
    }
    std::vector<Request> ready;
    std::vector<Refusal> refusals;
    rank0_update(requests, joined, ready, refusals);
    if (!stall_error_.empty()) {
      answer.u8(kAnswerStall);
      answer.str(stall_error_);
    } else {
      answer.u8(kAnswerOk);
      answer.str("");
    }
    answer.u64(refusals.size());
    for (const auto& r : refusals) {
      answer.str(r.name);
      answer.str(r.why);
    }
    // The whole request, not just the name: a joined rank never saw it and needs its size.
    for (const auto& q : ready) write_request(answer, q);
  }
  std::vector<int64_t> answer_size = {static_cast<int64_t>(answer.bytes().size())};
  BroadcastOptions bo;
  bo.root = 0;
  bo.timeout = options_.timeout;
  group_->broadcast(TensorView::of(answer_size), bo)->wait();
  std::vector<uint8_t> bytes = answer.bytes();
  bytes.resize(static_cast<size_t>(answer_size[0]));
  group_->broadcast(TensorView::of(bytes), bo)->wait();

  Reader rd(bytes.data(), bytes.size());
  uint8_t kind = rd.u8();
  std::string message = rd.str();
  if (kind == kAnswerStall) error = message;
  for (uint64_t k = rd.u64(); k > 0; --k) {
    Refusal r;
    r.name = rd.str();
    r.why = rd.str();
    refused.push_back(std::move(r));
  }
  std::vector<Request> agreed;
  while (!rd.done()) agreed.push_back(read_request(rd));
  return agreed;
}

void Coordinator::rank0_update(const std::vector<std::vector<Request>>& all,
                               const std::vector<uint8_t>& joined, std::vector<Request>& ready,
                               std::vector<Refusal>& refused) {
  const size_t n = all.size();
  const auto now = Clock::now();
  for (size_t r = 0; r < n; ++r) {
    for (const auto& q : all[r]) {
      auto [it, inserted] = table_.try_emplace(q.name);
      Pending& p = it->second;
      if (inserted) {
        p.request = q;
        p.first_rank = static_cast<int>(r);
        p.ranks.assign(n, 0);
        p.since = now;
        table_order_.push_back(q.name);
      } else if (!(p.request == q) && (p.request.kind != 0 || q.kind != 0)) {
        p.mismatch = fmt::format(
            "{}: '{}' differs between ranks: rank {} called {}, rank {} called {}; every rank "
            "must make the same calls under the same names (it ran on no rank; the others go "
            "on)",
            options_.name, q.name, p.first_rank,
            p.request.kind == 0 ? "an all-reduce" : p.request.text, r,
            q.kind == 0 ? "an all-reduce" : q.text);
      } else if (!(p.request == q)) {
        auto tensor = [](const Request& t) {
          return t.text.empty() ? fmt::format("{} elements of {}", t.numel, to_string(t.dtype))
                                : t.text;
        };
        p.mismatch = fmt::format(
            "{}: tensor '{}' differs between ranks: rank {} submitted {} reduced with {}, rank "
            "{} submitted {} reduced with {}; every rank must submit the same tensors under the "
            "same names (this tensor was reduced on no rank; the others go on)",
            options_.name, q.name, p.first_rank, tensor(p.request), to_string(p.request.op), r,
            tensor(q), to_string(q.op));
      }
      p.ranks[r] = 1;
    }
  }
  std::vector<std::string> still;
  for (const auto& name : table_order_) {
    Pending& p = table_.at(name);
    size_t count = 0;
    for (size_t r = 0; r < n; ++r) count += (p.ranks[r] | joined[r]) != 0;
    std::vector<int> joined_out;  // joined ranks that did not submit this call
    for (size_t r = 0; r < n; ++r)
      if (joined[r] != 0 && p.ranks[r] == 0) joined_out.push_back(static_cast<int>(r));
    if (count == n && p.mismatch.empty() && p.request.kind != 0 && !joined_out.empty())
      p.mismatch = fmt::format(
          "{}: {} '{}' cannot run while ranks [{}] have joined (join()): only all-reduces go on "
          "with joined ranks, which contribute zeros",
          options_.name, p.request.text, name, fmt::join(joined_out, ", "));
    if (count == n) {
      if (p.mismatch.empty()) {
        ready.push_back(p.request);
      } else {
        refused.push_back(Refusal{name, p.mismatch});
      }
      table_.erase(name);
    } else {
      still.push_back(name);
    }
  }
  table_order_ = std::move(still);
}

std::string Coordinator::rank0_stall_error(const std::vector<std::vector<uint8_t>>& cached_bits) {
  const auto now = Clock::now();
  auto describe = [&](const std::string& name, const std::vector<uint8_t>& ranks,
                      Clock::time_point since) {
    return fmt::format(
        "{}: tensor '{}' is ready on ranks [{}] but missing on ranks [{}] "
        "after {:.1f} s (stall_timeout {:.1f} s); every rank must submit the same tensors each "
        "step: same model, same parameters requiring grad, step() called as often on every rank",
        options_.name, name, fmt::join(ranks_where(ranks, true), ", "),
        fmt::join(ranks_where(ranks, false), ", "),
        std::chrono::duration<double>(now - since).count(),
        std::chrono::duration<double>(options_.stall_timeout).count());
  };
  for (const auto& name : table_order_) {
    const Pending& p = table_.at(name);
    if (now - p.since > options_.stall_timeout) return describe(name, p.ranks, p.since);
  }
  for (const auto& [id, since] : partial_since_)
    if (now - since > options_.stall_timeout)
      return describe(cache_[id].name, cached_bits[id], since);
  return "";
}

void Coordinator::execute(const std::vector<Request>& agreed, int contributing, bool joined) {
  if (agreed.empty()) return;
  const int n = group_->size();
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < pending_.size(); ++i) index[pending_[i].name] = i;
  // The calls run after the all-reduces, in the agreed order: the same on every rank.
  std::vector<Request> tensors;
  std::vector<size_t> calls;  // indices into pending_
  for (const auto& q : agreed) {
    if (q.kind == 0) {
      tensors.push_back(q);
      continue;
    }
    auto it = index.find(q.name);
    if (it == index.end())
      throw InternalError(
          fmt::format("coordinator: rank {} was told to run '{}', which it never submitted",
                      group_->rank(), q.name));
    calls.push_back(it->second);
  }
  // What this rank reduces for each agreed tensor: its own buffer, or zeros when it has joined.
  std::vector<TensorView> views;
  std::vector<std::vector<std::byte>> zeros;
  zeros.reserve(tensors.size());
  std::vector<uint8_t> finished(pending_.size(), 0);
  for (const auto& q : tensors) {
    auto it = index.find(q.name);
    if (it != index.end()) {
      views.push_back(pending_[it->second].tensor);
      finished[it->second] = 1;
    } else if (joined) {
      zeros.emplace_back(q.numel * element_size(q.dtype));
      views.push_back(TensorView{zeros.back().data(), q.numel, q.dtype});
    } else {
      throw InternalError(
          fmt::format("coordinator: rank {} was told to reduce '{}', which it "
                      "never submitted",
                      group_->rank(), q.name));
    }
  }
  // Group by (dtype, op), first appearance first and order kept within a group, then cut into
  // fusion buffers of at most fusion_threshold_bytes.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  auto same_kind = [&](size_t a, size_t b) {
    return tensors[a].dtype == tensors[b].dtype && tensors[a].op == tensors[b].op;
  };
  std::vector<size_t> first(tensors.size());
  for (size_t k = 0; k < tensors.size(); ++k) {
    first[k] = k;
    for (size_t j = 0; j < k; ++j)
      if (same_kind(j, k)) {
        first[k] = first[j];
        break;
      }
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return first[a] < first[b]; });
  AllreduceOptions ro;
  ro.timeout = options_.timeout;
  uint64_t collectives = 0;
  for (size_t i = 0; i < order.size();) {
    const Request& kind = tensors[order[i]];
    size_t j = i;
    size_t bytes = 0;
    while (j < order.size() && same_kind(order[i], order[j]) &&
           (j == i || bytes + views[order[j]].nbytes() <= options_.fusion_threshold_bytes)) {
      bytes += views[order[j]].nbytes();
      ++j;
    }
    // With ranks joined, an average is over the ranks that contributed.
    const bool partial_average =
        kind.op == ReduceOp::kAvg && contributing < n && !options_.average_over_all_ranks;
    ro.op = partial_average ? ReduceOp::kSum : kind.op;
    TensorView whole = views[order[i]];
    // Several tensors are fused in host memory; so is a GPU's tensor averaged over the ranks
    // that contributed, which is scaled down here, on the CPU.
    const bool fused = j > i + 1 || (partial_average && comm::on_cuda(whole));
    const Deadline copies =
        Deadline::after(options_.timeout.count() > 0 ? options_.timeout : group_->timeout());
    const std::string who =
        fused ? fmt::format("rank {}: {}: the fusion buffer", group_->rank(), options_.name) : "";
    if (fused) {
      if (fusion_.size() < bytes) fusion_.resize(bytes);
      size_t at = 0;
      for (size_t k = i; k < j; ++k) {
        const TensorView& t = views[order[k]];
        copy_bytes(who, TensorView::raw(fusion_.data() + at, t.nbytes()), t, copies);
        at += t.nbytes();
      }
      whole = TensorView{fusion_.data(), bytes / element_size(kind.dtype), kind.dtype};
    }
    const auto started = Clock::now();
    group_->allreduce(whole, ro)->wait();
    if (Timeline* t = Timeline::get())
      t->add(fmt::format("allreduce of {} tensor(s)", j - i), "coordinator", started, Clock::now(),
             fmt::format(R"({{"bytes": {}, "dtype": "{}", "op": "{}"}})", bytes,
                         to_string(kind.dtype), to_string(kind.op)));
    if (partial_average)
      scale_down(whole.data, whole.numel, whole.dtype, static_cast<size_t>(contributing));
    if (fused) {
      size_t at = 0;
      for (size_t k = i; k < j; ++k) {
        const TensorView& t = views[order[k]];
        copy_bytes(who, t, TensorView::raw(fusion_.data() + at, t.nbytes()), copies);
        at += t.nbytes();
      }
    }
    ++collectives;
    i = j;
  }
  for (size_t k : calls) {
    const auto started = Clock::now();
    pending_[k].body(*group_);
    finished[k] = 1;
    if (Timeline* t = Timeline::get())
      t->add(pending_[k].call.text, "coordinator", started, Clock::now(), "{}");
    ++collectives;
  }
  std::vector<Entry> rest;
  std::vector<std::shared_ptr<Handle>> done;
  for (size_t k = 0; k < pending_.size(); ++k) {
    if (finished[k]) {
      done.push_back(pending_[k].handle);
    } else {
      rest.push_back(std::move(pending_[k]));
    }
  }
  pending_ = std::move(rest);
  {
    std::lock_guard lock(mutex_);
    for (const auto& h : done) inflight_.erase(h->name_);
    stats_.collectives += collectives;
  }
  for (const auto& h : done) h->finish(nullptr);
}

}  // namespace dtrain
