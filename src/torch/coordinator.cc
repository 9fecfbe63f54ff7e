// Coordinator: the negotiation cycle, the response cache and tensor fusion (see coordinator.h).
//
// Cost per cycle: one allgather of 1 + cache_capacity/8 bytes per rank. A negotiation adds an
// allgather of sizes, an allgatherv of the requests and two broadcasts of rank 0's answer; in
// the steady state every tensor is cached and there is none.
#include "torch/coordinator.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/error.h"

namespace dtrain {

using Clock = std::chrono::steady_clock;

namespace {

constexpr uint8_t kFlagNewTensors = 1;  // has tensors to negotiate
constexpr uint8_t kFlagStopping = 2;    // its coordinator is being destroyed
constexpr uint8_t kFlagReport = 4;      // rank 0 has an error to report

constexpr uint8_t kAnswerOk = 0;
constexpr uint8_t kAnswerStall = 1;
constexpr uint8_t kAnswerMismatch = 2;

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(v); }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void str(const std::string& s) {
    u64(s.size());
    out_.insert(out_.end(), s.begin(), s.end());
  }
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
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{data_[at_ + i]} << (8 * i);
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
      throw InternalError(fmt::format("coordinator: message of {} bytes cut short at byte {}",
                                      size_, at_));
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

void Coordinator::Handle::finish(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

bool Coordinator::Handle::done() const {
  std::lock_guard lock(mutex_);
  return done_;
}

void Coordinator::Handle::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!cv_.wait_for(lock, timeout, [&] { return done_; }))
    throw TimeoutError(fmt::format(
        "DistributedOptimizer: tensor '{}' was not reduced within {} ms (other ranks slow to "
        "submit it, or stalled; see the stall_timeout error if one follows)",
        name_, timeout.count()));
  if (error_) std::rethrow_exception(error_);
}

Coordinator::Coordinator(std::shared_ptr<ProcessGroup> group, CoordinatorOptions options)
    : group_(std::move(group)), options_(options) {
  if (options_.timeout.count() == 0) options_.timeout = group_->timeout();
  thread_ = std::jthread([this](std::stop_token stop) { loop(stop); });
}

Coordinator::~Coordinator() {
  {
    std::lock_guard lock(mutex_);
    stop_requested_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<Coordinator::Handle> Coordinator::submit(const std::string& name,
                                                         const TensorView& tensor) {
  auto handle = std::make_shared<Handle>();
  handle->name_ = name;
  std::lock_guard lock(mutex_);
  if (error_) std::rethrow_exception(error_);
  if (stop_requested_)
    throw InvalidArgumentError(fmt::format(
        "rank {}: DistributedOptimizer: tensor '{}' submitted while the coordinator is stopping",
        group_->rank(), name));
  if (!inflight_.insert(name).second)
    throw InvalidArgumentError(fmt::format(
        "rank {}: DistributedOptimizer: tensor '{}' submitted again before its previous "
        "all-reduce finished; names must be unique and each submitted once per step",
        group_->rank(), name));
  incoming_.push_back(Entry{name, tensor, handle, false});
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
  for (auto& e : pending_) e.handle->finish(error);
  for (auto& e : incoming) e.handle->finish(error);
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
      fail(std::make_exception_ptr(AbortedError(fmt::format(
          "rank {}: DistributedOptimizer: the coordinator stopped before these tensors were "
          "reduced",
          group_->rank()))));
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
  const size_t state_bytes = 1 + bit_bytes;

  std::vector<uint8_t> state(state_bytes, 0);
  for (const auto& e : pending_) {
    auto it = cache_id_.find(e.name);
    if (it != cache_id_.end() && cache_[it->second].dtype == e.tensor.dtype &&
        cache_[it->second].numel == e.tensor.numel) {
      state[1 + it->second / 8] |= static_cast<uint8_t>(1u << (it->second % 8));
    } else if (!e.sent) {
      state[0] |= kFlagNewTensors;
    }
  }
  if (stopping) state[0] |= kFlagStopping;
  if (me == 0 && !stall_error_.empty()) state[0] |= kFlagReport;

  std::vector<uint8_t> all(state_bytes * static_cast<size_t>(n));
  AllgatherOptions ao;
  ao.timeout = options_.timeout;
  group_->allgather(TensorView::of(all), TensorView::of(state), ao)->wait();

  bool negotiate_now = false;
  all_stopping = true;
  std::vector<uint8_t> stopping_ranks(n, 0);
  for (int r = 0; r < n; ++r) {
    uint8_t f = all[r * state_bytes];
    negotiate_now |= (f & (kFlagNewTensors | kFlagReport)) != 0;
    stopping_ranks[r] = (f & kFlagStopping) != 0;
    all_stopping &= stopping_ranks[r] != 0;
  }
  if (stopping) {
    if (stop_seen_ == Clock::time_point{}) stop_seen_ = Clock::now();
    if (!all_stopping && Clock::now() - stop_seen_ > options_.timeout)
      throw TimeoutError(fmt::format(
          "rank {}: DistributedOptimizer: destroyed, but ranks [{}] kept theirs running for {} "
          "ms; destroy it on every rank at the same point",
          me, fmt::join(ranks_where(stopping_ranks, false), ", "), options_.timeout.count()));
  }

  // Cached tensors ready on every rank, in cache order.
  std::vector<std::string> run;
  std::vector<std::vector<uint8_t>> holders(cache_.size());
  for (size_t id = 0; id < cache_.size(); ++id) {
    std::vector<uint8_t> has(n, 0);
    int count = 0;
    for (int r = 0; r < n; ++r) {
      has[r] = (all[r * state_bytes + 1 + id / 8] >> (id % 8)) & 1;
      count += has[r];
    }
    if (count == n) run.push_back(cache_[id].name);
    if (me == 0) {
      if (count > 0 && count < n) {
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
      auto it = cache_id_.find(e.name);
      const bool cached = it != cache_id_.end() && cache_[it->second].dtype == e.tensor.dtype &&
                          cache_[it->second].numel == e.tensor.numel;
      if (e.sent || cached) continue;
      e.sent = true;
      mine.push_back(Request{e.name, e.tensor.dtype, e.tensor.numel});
    }
    std::string error;
    std::vector<std::string> agreed = negotiate(mine, error);
    if (!error.empty()) throw TimeoutError(fmt::format("rank {}: {}", me, error));
    for (const auto& name : agreed) {
      run.push_back(name);
      if (cache_.size() < options_.cache_capacity && cache_id_.count(name) == 0) {
        auto it = std::find_if(pending_.begin(), pending_.end(),
                               [&](const Entry& e) { return e.name == name; });
        cache_id_[name] = cache_.size();
        cache_.push_back(CacheEntry{name, it->tensor.dtype, it->tensor.numel});
      }
    }
  }
  {
    std::lock_guard lock(mutex_);  // before execute(), which lets the submitters go
    ++stats_.cycles;
    stats_.negotiations += negotiate_now ? 1 : 0;
    stats_.cached_tensors += cached_count;
    stats_.tensors += run.size();
  }
  execute(run);
  if (me == 0) stall_error_ = rank0_stall_error(holders);
}

std::vector<std::string> Coordinator::negotiate(const std::vector<Request>& mine,
                                                std::string& error) {
  const int n = group_->size();
  Writer w;
  for (const auto& r : mine) {
    w.str(r.name);
    w.u8(static_cast<uint8_t>(r.dtype));
    w.u64(r.numel);
  }
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
  group_->allgatherv(TensorView{gathered.data(), total, DType::kU8},
                     TensorView{input.data(), payload.size(), DType::kU8}, counts, ao)
      ->wait();

  Writer answer;
  if (group_->rank() == 0) {
    std::vector<std::vector<Request>> requests(n);
    size_t at = 0;
    for (int r = 0; r < n; ++r) {
      Reader rd(gathered.data() + at, counts[r]);
      while (!rd.done()) {
        Request q;
        q.name = rd.str();
        q.dtype = static_cast<DType>(rd.u8());
        q.numel = rd.u64();
        requests[r].push_back(std::move(q));
      }
      at += counts[r];
    }
    std::vector<Request> ready;
    std::string mismatch = rank0_update(requests, ready);
    if (!mismatch.empty()) {
      answer.u8(kAnswerMismatch);
      answer.str(mismatch);
    } else if (!stall_error_.empty()) {
      answer.u8(kAnswerStall);
      answer.str(stall_error_);
    } else {
      answer.u8(kAnswerOk);
      answer.str("");
    }
    answer.u64(ready.size());
    for (const auto& q : ready) answer.str(q.name);
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
  if (kind == kAnswerMismatch) throw InvalidArgumentError(fmt::format("rank {}: {}", group_->rank(), message));
  if (kind == kAnswerStall) error = message;
  std::vector<std::string> names(rd.u64());
  for (auto& name : names) name = rd.str();
  return names;
}

std::string Coordinator::rank0_update(const std::vector<std::vector<Request>>& all,
                                      std::vector<Request>& ready) {
  const size_t n = all.size();
  const auto now = Clock::now();
  for (size_t r = 0; r < n; ++r) {
    for (const auto& q : all[r]) {
      auto [it, inserted] = table_.try_emplace(q.name);
      Pending& p = it->second;
      if (inserted) {
        p.request = q;
        p.ranks.assign(n, 0);
        p.since = now;
        table_order_.push_back(q.name);
      } else if (p.request.dtype != q.dtype || p.request.numel != q.numel) {
        p.mismatch = fmt::format(
            "DistributedOptimizer: tensor '{}' differs between ranks: {} elements of {} on the "
            "first rank that submitted it, {} elements of {} on rank {}; every rank must submit "
            "the same tensors under the same names",
            q.name, p.request.numel, to_string(p.request.dtype), q.numel, to_string(q.dtype), r);
      }
      p.ranks[r] = 1;
    }
  }
  std::vector<std::string> still;
  for (const auto& name : table_order_) {
    Pending& p = table_.at(name);
    if (std::count(p.ranks.begin(), p.ranks.end(), 1) == static_cast<long>(n)) {
      if (!p.mismatch.empty()) return p.mismatch;
      ready.push_back(p.request);
      table_.erase(name);
    } else {
      still.push_back(name);
    }
  }
  table_order_ = std::move(still);
  return "";
}

std::string Coordinator::rank0_stall_error(const std::vector<std::vector<uint8_t>>& cached_bits) {
  const auto now = Clock::now();
  auto describe = [&](const std::string& name, const std::vector<uint8_t>& ranks,
                      Clock::time_point since) {
    return fmt::format(
        "DistributedOptimizer: tensor '{}' is ready on ranks [{}] but missing on ranks [{}] "
        "after {:.1f} s (stall_timeout {:.1f} s); every rank must submit the same tensors each "
        "step: same model, same parameters requiring grad, step() called as often on every rank",
        name, fmt::join(ranks_where(ranks, true), ", "), fmt::join(ranks_where(ranks, false), ", "),
        std::chrono::duration<double>(now - since).count(),
        std::chrono::duration<double>(options_.stall_timeout).count());
  };
  for (const auto& name : table_order_) {
    const Pending& p = table_.at(name);
    if (now - p.since > options_.stall_timeout) return describe(name, p.ranks, p.since);
  }
  for (const auto& [id, since] : partial_since_)
    if (now - since > options_.stall_timeout) return describe(cache_[id].name, cached_bits[id], since);
  return "";
}

void Coordinator::execute(const std::vector<std::string>& names) {
  if (names.empty()) return;
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < pending_.size(); ++i) index[pending_[i].name] = i;
  std::vector<size_t> order;
  for (const auto& name : names) {
    auto it = index.find(name);
    if (it == index.end())
      throw InternalError(fmt::format("coordinator: rank {} was told to reduce '{}', which it "
                                      "never submitted",
                                      group_->rank(), name));
    order.push_back(it->second);
  }
  // Group by dtype (first appearance first, order kept within a dtype), then cut into fusion
  // buffers of at most fusion_threshold_bytes.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    auto first = [&](DType t) {
      for (size_t k = 0; k < order.size(); ++k)
        if (pending_[order[k]].tensor.dtype == t) return k;
      return order.size();
    };
    return first(pending_[a].tensor.dtype) < first(pending_[b].tensor.dtype);
  });
  AllreduceOptions ro;
  ro.op = options_.op;
  ro.timeout = options_.timeout;
  uint64_t collectives = 0;
  for (size_t i = 0; i < order.size();) {
    const DType dtype = pending_[order[i]].tensor.dtype;
    size_t j = i;
    size_t bytes = 0;
    while (j < order.size() && pending_[order[j]].tensor.dtype == dtype &&
           (j == i || bytes + pending_[order[j]].tensor.nbytes() <= options_.fusion_threshold_bytes)) {
      bytes += pending_[order[j]].tensor.nbytes();
      ++j;
    }
    if (j == i + 1) {
      group_->allreduce(pending_[order[i]].tensor, ro)->wait();
    } else {
      if (fusion_.size() < bytes) fusion_.resize(bytes);
      size_t at = 0;
      for (size_t k = i; k < j; ++k) {
        const TensorView& t = pending_[order[k]].tensor;
        std::memcpy(fusion_.data() + at, t.data, t.nbytes());
        at += t.nbytes();
      }
      group_->allreduce(TensorView{fusion_.data(), bytes / element_size(dtype), dtype}, ro)->wait();
      at = 0;
      for (size_t k = i; k < j; ++k) {
        const TensorView& t = pending_[order[k]].tensor;
        std::memcpy(t.data, fusion_.data() + at, t.nbytes());
        at += t.nbytes();
      }
    }
    ++collectives;
    i = j;
  }
  std::vector<uint8_t> finished(pending_.size(), 0);
  for (size_t k : order) finished[k] = 1;
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
