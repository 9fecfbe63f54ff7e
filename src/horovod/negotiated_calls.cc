// NegotiatedCalls: agreement before every call, call order, and joined ranks (see the header).
//
// Cost per call: one allgather of 152 bytes per rank before the collective itself.
#include "horovod/negotiated_calls.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/flight_recorder.h"
#include "dtrain/error.h"

namespace dtrain {

namespace {

uint64_t fnv1a(uint64_t h, uint64_t v) { return (h ^ v) * 1099511628211ull; }

uint64_t hash_of(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = fnv1a(h, c);
  return h | 1;  // never 0, which means "no name"
}

const char* kind_name(Call::Kind kind) {
  switch (kind) {
    case Call::Kind::kAllreduce:
      return "allreduce";
    case Call::Kind::kAllgather:
      return "allgather";
    case Call::Kind::kBroadcast:
      return "broadcast";
    case Call::Kind::kAlltoall:
      return "alltoall";
    case Call::Kind::kBarrier:
      return "barrier";
    case Call::Kind::kJoin:
      return "join";
    case Call::Kind::kReducescatter:
      return "reducescatter";
  }
  return "an unknown call";
}

// Whether two ranks' calls may run as one collective.
bool compatible(const Call& a, const Call& b) {
  return a.name == b.name && !a.refused && !b.refused && a.signature() == b.signature();
}

bool takes_zeros(const Call& c) {
  const auto op = static_cast<ReduceOp>(c.op_or_root);
  return c.kind == Call::Kind::kAllreduce && (op == ReduceOp::kSum || op == ReduceOp::kAvg);
}

}  // namespace

Call Call::of(Kind kind, DType dtype, const std::vector<int64_t>& shape, int64_t op_or_root,
              const std::string& name) {
  Call c;
  c.kind = kind;
  c.label = name;
  c.dtype = static_cast<int64_t>(dtype);
  c.op_or_root = op_or_root;
  c.ndim = static_cast<int64_t>(shape.size());
  c.count = 1;
  for (int64_t d : shape) c.count *= d;
  for (size_t d = 0; d < shape.size() && d < kMaxDims; ++d) c.dims[d] = shape[d];
  if (shape.size() > kMaxDims) {  // the last slot stands for every dimension from it on
    uint64_t h = 1469598103934665603ull;
    for (size_t d = kMaxDims - 1; d < shape.size(); ++d)
      h = fnv1a(h, static_cast<uint64_t>(shape[d]));
    c.dims[kMaxDims - 1] = static_cast<int64_t>(h >> 1);
  }
  c.name = name.empty() ? 0 : hash_of(name);
  return c;
}

std::string Call::describe() const {
  if (kind == Kind::kBarrier || kind == Kind::kJoin) return fmt::format("{}()", kind_name(kind));
  std::string shape;
  for (int64_t d = 0; d < std::min<int64_t>(ndim, kMaxDims); ++d)
    shape += fmt::format("{}{}", d == 0 ? "" : ", ", dims[d]);
  if (ndim > static_cast<int64_t>(kMaxDims)) shape += ", ...";
  const std::string dtype_name =
      dtype >= 0 ? std::string(to_string(static_cast<DType>(dtype))) : "?";
  std::string s = fmt::format("{} of {} [{}]", kind_name(kind), dtype_name, shape);
  if (kind == Kind::kAllreduce || kind == Kind::kReducescatter)
    s += fmt::format(" with {}", to_string(static_cast<ReduceOp>(op_or_root)));
  if (kind == Kind::kBroadcast) s += fmt::format(" from rank {}", op_or_root);
  if (name != 0)
    s += label.empty() ? fmt::format(" named #{:08x}", name >> 32)
                       : fmt::format(" named '{}'", label);
  if (refused) s += " and refused its arguments (its own error says why)";
  return s;
}

uint64_t Call::signature() const {
  const bool rows_may_differ = kind == Kind::kAllgather || kind == Kind::kAlltoall;
  uint64_t h = 1469598103934665603ull;
  for (int64_t v : {static_cast<int64_t>(kind), dtype, ndim, rows_may_differ ? 0 : op_or_root})
    h = fnv1a(h, static_cast<uint64_t>(v));
  for (size_t d = rows_may_differ ? 1 : 0; d < kMaxDims; ++d)
    h = fnv1a(h, static_cast<uint64_t>(dims[d]));
  return h;
}

std::array<int64_t, Call::kWords> Call::encode() const {
  std::array<int64_t, kWords> w{};
  w[0] = static_cast<int64_t>(kind);
  w[1] = dtype;
  w[2] = op_or_root;
  w[3] = ndim;
  w[4] = static_cast<int64_t>(name);
  w[5] = refused ? 1 : 0;
  w[6] = count;
  std::copy(dims.begin(), dims.end(), w.begin() + 7);
  // The name's first bytes, so that another rank's errors can show it ("grad/layer1..." when
  // longer).
  std::string text = label.size() <= kLabelBytes ? label : label.substr(0, kLabelBytes - 3) + "...";
  text.resize(kLabelWords * 8, '\0');
  std::memcpy(w.data() + 7 + kMaxDims, text.data(), kLabelWords * 8);
  return w;
}

Call Call::decode(const int64_t* w) {
  Call c;
  c.kind = static_cast<Kind>(w[0]);
  c.dtype = w[1];
  c.op_or_root = w[2];
  c.ndim = w[3];
  c.name = static_cast<uint64_t>(w[4]);
  c.refused = w[5] != 0;
  c.count = w[6];
  std::copy(w + 7, w + 7 + kMaxDims, c.dims.begin());
  std::array<char, kLabelWords * 8> text{};
  std::memcpy(text.data(), w + 7 + kMaxDims, text.size());
  text.back() = '\0';
  c.label = text.data();
  return c;
}

comm::CollectiveKind collective_kind_of(int64_t kind) {
  switch (static_cast<Call::Kind>(kind)) {
    case Call::Kind::kAllgather:
      return comm::CollectiveKind::kAllgather;
    case Call::Kind::kBroadcast:
      return comm::CollectiveKind::kBroadcast;
    case Call::Kind::kAlltoall:
      return comm::CollectiveKind::kAlltoall;
    case Call::Kind::kBarrier:
    case Call::Kind::kJoin:
      return comm::CollectiveKind::kBarrier;
    case Call::Kind::kReducescatter:
      return comm::CollectiveKind::kReduceScatter;
    case Call::Kind::kAllreduce:
      break;
  }
  return comm::CollectiveKind::kAllreduce;
}

comm::CollectiveCall Call::flight_call() const {
  comm::CollectiveCall c;
  c.kind = collective_kind_of(static_cast<int64_t>(kind));
  if (dtype >= 0) c.dtype = static_cast<DType>(dtype);
  if (c.kind == comm::CollectiveKind::kAllreduce || c.kind == comm::CollectiveKind::kReduceScatter)
    c.op = static_cast<ReduceOp>(op_or_root);
  if (c.kind == comm::CollectiveKind::kBroadcast) c.root = static_cast<int>(op_or_root);
  c.count = kind == Kind::kBarrier || kind == Kind::kJoin ? 0 : static_cast<uint64_t>(count);
  return c;
}

NegotiatedCalls::NegotiatedCalls(std::shared_ptr<ProcessGroup> group,
                                 NegotiatedCallsOptions options)
    : group_(std::move(group)), options_(std::move(options)) {
  // Its agreement and its collectives are the machinery of one call: the record keeps the call.
  auto& recorder = comm::FlightRecorder::global();
  recorder.mute(recorder.group_id(group_->name()));
  flight_group_ = recorder.group_id(options_.name);
}

void NegotiatedCalls::run(const Call& call, const Body& body) {
  std::lock_guard lock(mutex_);
  auto& recorder = comm::FlightRecorder::global();
  const uint64_t flight = recorder.record({.kind = comm::FlightCall::Kind::kNamed,
                                           .group = flight_group_,
                                           .call = call.flight_call(),
                                           .name = call.label});
  try {
    execute(call, body);
  } catch (...) {
    recorder.ended(flight, false);
    throw;
  }
  recorder.ended(flight, true);
}

void NegotiatedCalls::refuse(Call call) {
  call.refused = true;
  try {
    run(call, {});
  } catch (const InvalidArgumentError&) {
    // Expected: the disagreement every rank reports. This rank's caller throws its own error.
  }
}

std::vector<Call> NegotiatedCalls::exchange(const Call& mine, std::chrono::milliseconds timeout) {
  const int n = group_->size();
  const auto words = mine.encode();
  std::vector<int64_t> out(words.begin(), words.end());
  std::vector<int64_t> all(Call::kWords * static_cast<size_t>(n));
  AllgatherOptions o;
  o.timeout = timeout;
  o.async_op = false;
  group_->allgather(TensorView::of(all), TensorView::of(out), o)->wait();
  std::vector<Call> calls;
  calls.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) calls.push_back(Call::decode(all.data() + r * Call::kWords));
  return calls;
}

std::string NegotiatedCalls::disagreement(const std::vector<Call>& calls, uint64_t round) const {
  std::vector<int> joined, active;
  for (size_t r = 0; r < calls.size(); ++r)
    (calls[r].kind == Call::Kind::kJoin ? joined : active).push_back(static_cast<int>(r));
  if (active.empty()) return "";
  const Call& first = calls[static_cast<size_t>(active[0])];
  const bool agree = std::all_of(active.begin(), active.end(), [&](int r) {
    return compatible(first, calls[static_cast<size_t>(r)]);
  });
  if (!agree) {
    // Ranks that called the same thing together, in rank order of their first member.
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    for (size_t r = 0; r < calls.size(); ++r) {
      const std::string d = calls[r].describe();
      auto it =
          std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == d; });
      if (it == groups.end()) {
        groups.push_back({d, {}});
        it = groups.end() - 1;
      }
      it->second.push_back(static_cast<int>(r));
    }
    std::string who;
    for (const auto& [d, ranks] : groups)
      who += ranks.size() == 1
                 ? fmt::format("{}rank {} called {}", who.empty() ? "" : "; ", ranks[0], d)
                 : fmt::format("{}ranks [{}] called {}", who.empty() ? "" : "; ",
                               fmt::join(ranks, ", "), d);
    return fmt::format(
        "{} call #{}: the ranks' calls differ, so none of them ran (nothing was sent; the next "
        "call goes on): {}. Every rank must make the same calls in the same order, with the same "
        "dtype, shape (allgather and alltoall: after dimension 0), op, root and name",
        options_.name, round, who);
  }
  if (!joined.empty() && !takes_zeros(first))
    return fmt::format(
        "{} call #{}: {} cannot run while ranks [{}] have joined (join()): only all-reduces of "
        "sum or average go on with joined ranks, which contribute zeros; make this call before "
        "any rank joins, or after every rank has",
        options_.name, round, first.describe(), fmt::join(joined, ", "));
  return "";
}

void NegotiatedCalls::execute(const Call& call, const Body& body) {
  const uint64_t round = ++rounds_;
  const std::vector<Call> calls = exchange(call, std::chrono::milliseconds(0));
  const std::string why = disagreement(calls, round);
  if (!why.empty()) throw InvalidArgumentError(fmt::format("rank {}: {}", group_->rank(), why));
  body(Agreed{calls});
}

void NegotiatedCalls::join() {
  std::lock_guard lock(mutex_);
  Call mine;
  mine.kind = Call::Kind::kJoin;
  for (;;) {
    const uint64_t round = ++rounds_;
    const std::vector<Call> calls = exchange(mine, options_.join_wait);
    int contributors = 0;
    const Call* theirs = nullptr;
    for (const auto& c : calls)
      if (c.kind != Call::Kind::kJoin) {
        ++contributors;
        theirs = &c;
      }
    if (contributors == 0) return;
    // The others fail their call when it is not one to run with zeros (disagreement() says so
    // to them); this rank waits for their next one.
    if (disagreement(calls, round).empty()) zeros_for(*theirs);
  }
}

void NegotiatedCalls::zeros_for(const Call& call) {
  const auto dtype = static_cast<DType>(call.dtype);
  std::vector<std::byte> zeros(call.numel() * element_size(dtype));  // the others' size
  AllreduceOptions o;
  o.op = static_cast<ReduceOp>(call.op_or_root);  // sum or average, as the others'
  o.async_op = false;
  group_->allreduce(TensorView{zeros.data(), call.numel(), dtype}, o)->wait();
}

}  // namespace dtrain
