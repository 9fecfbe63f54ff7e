// Measuring the cost model's link constants on a running group: rank 0 plays ping-pong with one
// peer of each class of link it has (another rank of its host, a rank on another host of its
// rack, a rank in another rack): small messages give alpha (half a round trip), 4 MiB ones beta;
// a local reduction gives gamma. Where several hosts share rank 0's machine (emulated hosts,
// containers of one node), what the machine's cores move with every host busy at once: one
// rank of each host sends 4 MiB to the next over TCP (beta_machine), and each host's group
// runs the hierarchy's steps inside it (beta_machine_shm). The figures travel through the store,
// so that every rank of the group picks its algorithms from the same numbers. No collective of
// this group runs: its sequence numbers are untouched (the hosts' groups count theirs, all
// alike).
#include <algorithm>
#include <chrono>
#include <vector>

#include <fmt/format.h>

#include "comm/native_process_group.h"
#include "common/env.h"
#include "common/log.h"
#include "common/reduce.h"
#include "dtrain/error.h"
#include "transport/host.h"

namespace dtrain::comm {
namespace {

constexpr int kTag = 0x7a11b;      // the ping-pong's messages, before any of the user's
constexpr int kRingTag = 0x7a11c;  // the machine's ring of flows
constexpr int kSmallIters = 40;
constexpr int kLargeIters = 3;
constexpr int kMachineIters = 5;  // with every host busy: the median of 5
// 4 MiB: a shaped link lets its bucket (tbf's, a switch's buffer) through at memory speed; a
// message much larger than it measures the rate.
constexpr size_t kLarge = size_t{4} << 20;
// 32 MiB in each rank of each host: beyond the last-level cache.
constexpr size_t kLargeShm = size_t{32} << 20;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

CostConstants NativeProcessGroup::measure_links(CostConstants k) {
  // The peer of each class, as every rank sees it.
  auto host = [&](int r) { return device_->host_of(members_[r]); };
  auto rack = [&](int r) { return device_->rack_of(members_[r]); };
  int peers[3] = {-1, -1, -1};  // shm, host, rack
  for (int r = 1; r < size_; ++r) {
    const int c = host(r) == host(0) ? 0 : rack(r) == rack(0) ? 1 : 2;
    if (peers[c] < 0) peers[c] = r;
  }
  std::vector<std::byte> small(8), large(kLarge);
  auto ping_pong = [&](int peer, std::vector<std::byte>& buf, int iters) {
    const auto view = TensorView{buf.data(), buf.size(), DType::kU8};
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      if (rank_ == 0) {
        send(view, peer, kTag);
        recv(view, peer, kTag);
      } else {
        recv(view, 0, kTag);
        send(view, 0, kTag);
      }
    }
    return seconds_since(t0) / iters / 2;  // one way
  };
  double alpha[3] = {0, 0, 0}, beta[3] = {0, 0, 0};
  for (int c = 0; c < 3; ++c) {
    if (peers[c] < 0 || (rank_ != 0 && rank_ != peers[c])) continue;
    ping_pong(peers[c], small, 4);  // warm the path
    alpha[c] = ping_pong(peers[c], small, kSmallIters);
    ping_pong(peers[c], large, 1);
    beta[c] = std::max(ping_pong(peers[c], large, kLargeIters) - alpha[c], 1e-9) / kLarge;
  }
  // What the machine's cores move where several hosts share them, each measured by its members
  // all at once: a member that started first would have its bytes waiting in the buffers before
  // the last one starts its clock, which then reads memory, not the machine. So a token goes
  // round the members first, and the slowest member's time is theirs (at members[0], rank 0).
  auto slowest_together = [&](const std::vector<int>& members, size_t i, auto&& timed) {
    const size_t h = members.size();
    double token = 0;
    const auto tv = TensorView{&token, sizeof(token), DType::kU8};
    if (i == 0) {
      send(tv, members[1], kRingTag);
      recv(tv, members[h - 1], kRingTag);
    } else {
      recv(tv, members[i - 1], kRingTag);
      send(tv, members[(i + 1) % h], kRingTag);
    }
    double took = timed();
    if (i != 0) {
      send(TensorView{&took, sizeof(took), DType::kU8}, members[0], kRingTag);
      return 0.0;
    }
    for (size_t j = 1; j < h; ++j) {
      double theirs = 0;
      recv(TensorView{&theirs, sizeof(theirs), DType::kU8}, members[j], kRingTag);
      took = std::max(took, theirs);
    }
    return took;
  };
  // Each iteration receives `in` from `from` while sending `out` to `to`. Seconds of the median
  // iteration: a VM's neighbours take its cores for milliseconds now and then.
  auto exchange = [&](std::vector<std::byte>& out, std::vector<std::byte>& in, int to, int from,
                      int iters) {
    const auto out_view = TensorView{out.data(), out.size(), DType::kU8};
    const auto in_view = TensorView{in.data(), in.size(), DType::kU8};
    std::vector<double> took;
    for (int it = 0; it < iters; ++it) {
      const auto t0 = std::chrono::steady_clock::now();
      auto got = irecv(in_view, from, kRingTag, {});
      isend(out_view, to, kRingTag, {})->wait();
      got->wait();
      took.push_back(seconds_since(t0));
    }
    std::nth_element(took.begin(), took.begin() + iters / 2, took.end());
    return took[iters / 2];
  };
  // The hosts on rank 0's machine, each with its ranks in order (rank 0's host first).
  std::vector<std::vector<int>> hosts;
  for (int r = 0; r < size_; ++r) {
    if (transport::machine_of(host(r)) != transport::machine_of(host(0))) continue;
    auto it = std::find_if(hosts.begin(), hosts.end(),
                           [&](const auto& ranks) { return host(ranks[0]) == host(r); });
    if (it == hosts.end())
      hosts.push_back({r});
    else
      it->push_back(r);
  }
  // TCP: one rank of each host sends 4 MiB to the next host's, in a ring.
  std::vector<int> ring;
  for (const auto& ranks : hosts) ring.push_back(ranks[0]);
  double machine = 0;
  if (const auto me = std::find(ring.begin(), ring.end(), rank_);
      ring.size() >= 2 && me != ring.end()) {
    const size_t i = me - ring.begin(), h = ring.size();
    std::vector<std::byte> in(kLarge);
    const int to = ring[(i + 1) % h], from = ring[(i + h - 1) % h];
    exchange(large, in, to, from, 1);
    const double took =
        slowest_together(ring, i, [&] { return exchange(large, in, to, from, kMachineIters); });
    if (i == 0) machine = took / (static_cast<double>(h) * kLarge);
  }
  // Shared memory: what the hierarchy does inside the hosts, timed as it runs, every host at
  // once: a reduce-scatter and an all-gather of 32 MiB in each host's group (beyond the cache,
  // where large all-reduces run; the sum's time included).
  std::vector<int> busy;  // the ranks of the hosts on rank 0's machine with two or more
  for (const auto& ranks : hosts)
    if (ranks.size() >= 2) busy.insert(busy.end(), ranks.begin(), ranks.end());
  double machine_shm = 0;
  if (const auto me = std::find(busy.begin(), busy.end(), rank_);
      local_group_ && topology_.level == Topology::Level::kHosts && me != busy.end() &&
      busy.size() > static_cast<size_t>(local_group_->size())) {
    const size_t i = me - busy.begin();
    const size_t k = static_cast<size_t>(local_group_->size());
    const size_t block = kLargeShm / sizeof(float) / k;
    std::vector<float> all(block * k, 1.0f), mine(block);
    const TensorView all_view{all.data(), all.size(), DType::kF32};
    const TensorView mine_view{mine.data(), mine.size(), DType::kF32};
    auto steps = [&](int iters) {
      std::vector<double> took;
      for (int it = 0; it < iters; ++it) {
        const auto t0 = std::chrono::steady_clock::now();
        local_group_->reduce_scatter(mine_view, all_view, {})->wait();
        local_group_->allgather(all_view, mine_view, {})->wait();
        took.push_back(seconds_since(t0));
      }
      std::nth_element(took.begin(), took.begin() + iters / 2, took.end());
      return took[iters / 2];
    };
    steps(1);
    const double took = slowest_together(busy, i, [&] { return steps(kMachineIters); });
    // The hierarchy's formula: 2 (k-1)/k M at the inner rate.
    if (i == 0)
      machine_shm = took / (2.0 * (k - 1) / k * static_cast<double>(all.size() * sizeof(float)));
  }
  const std::string key = fmt::format("{}/measured_links", name_);
  if (rank_ == 0) {
    if (machine > 0) k.beta_machine = machine;
    if (machine_shm > 0) k.beta_machine_shm = machine_shm;
    if (peers[0] > 0) k.alpha_local = alpha[0], k.beta_local = beta[0];
    if (peers[1] > 0) k.alpha = alpha[1], k.beta = beta[1];
    if (peers[2] > 0) {
      k.alpha_rack = alpha[2], k.beta_rack = beta[2];
      if (peers[1] < 0) k.alpha = alpha[2], k.beta = beta[2];  // no host of its own rack to ask
    }
    std::vector<float> a(kLarge / sizeof(float), 1.0f), b(a.size(), 2.0f);
    reduce_into(a.data(), b.data(), a.size(), DType::kF32, ReduceOp::kSum);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 8; ++i)
      reduce_into(a.data(), b.data(), a.size(), DType::kF32, ReduceOp::kSum);
    k.gamma = seconds_since(t0) / 8 / kLarge;
    store_->set(key, CostModel::to_json(k, fmt::format("measured by group {} at start-up", name_)));
    DTRAIN_LOG_INFO("rank 0: group {} measured its links: {}", name_,
                    CostModel::to_json(k, "").substr(0, 400));
    return k;
  }
  // Everyone else takes rank 0's figures, read as a calibration file is.
  return CostModel::parse(store_->get_string(key), fmt::format("rank 0's measurement ({})", key),
                          k);
}

void NativeProcessGroup::agree_on_costs() {
  const auto loaded = CostModel::load();
  store_->set(fmt::format("{}/cost_file/{}", name_, rank_),
              loaded.problem.empty() ? "ok" : loaded.problem);
  std::string why;
  for (int r = 0; r < size_ && why.empty(); ++r) {
    const std::string v = store_->get_string(fmt::format("{}/cost_file/{}", name_, r));
    if (v != "ok") why = fmt::format("rank {}: {}", r, v);
  }
  if (why.empty()) return;
  if (rank_ == 0)
    DTRAIN_LOG_ERROR(
        "{}; measuring the links at start-up instead (write a good file with "
        "`dtrain bench allreduce --calibrate FILE`, or unset DTRAIN_COST_FILE)",
        why);
  set_cost_constants(measure_links(loaded.constants));
}

void NativeProcessGroup::set_cost_constants(const CostConstants& k) {
  cost_model_.set_constants(k);
  forget_choices();
  for (const auto& g : {local_group_, cross_group_})
    if (g) g->set_cost_constants(k);
}

}  // namespace dtrain::comm
