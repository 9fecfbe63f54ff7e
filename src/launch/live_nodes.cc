#include "launch/live_nodes.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/log.h"
#include "dtrain/error.h"
#include "dtrain/live_membership.h"

namespace dtrain::launch {
namespace {

using Clock = std::chrono::steady_clock;

std::string beat_key(int node) { return fmt::format("dtrain/live/node/{}/beat", node); }
std::string done_key(int node) { return fmt::format("dtrain/live/node/{}/done", node); }

double seconds_of(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::shared_ptr<TcpStore> connect(const LiveNodesOptions& o,
                                  std::chrono::milliseconds connect_timeout) {
  TcpStoreOptions so;
  so.host = o.host;
  so.port = o.port;
  so.timeout = o.timeout;
  so.connect_timeout = connect_timeout;
  return std::make_shared<TcpStore>(so);
}

}  // namespace

LiveNodes::LiveNodes(LiveNodesOptions options) : options_(std::move(options)) {
  store_ = connect(options_, options_.connect_timeout);
  beating_ = std::jthread([this](std::stop_token stop) { beat_loop(stop); });
}

template <typename Call>
auto LiveNodes::on_store(Call&& call, std::chrono::milliseconds patience, bool try_anyway) {
  std::shared_ptr<TcpStore> store;
  {
    std::lock_guard lock(store_mu_);
    if (!try_anyway && failed_try_ != Clock::time_point{} &&
        Clock::now() - failed_try_ < options_.timeout)
      throw StoreError(failed_why_);
    store = store_;
  }
  try {
    return call(*store);
  } catch (const Error& e) {
    // A broken connection (a store error, or a call that went unanswered) stays broken: this
    // client is done with, and the call runs on a new one if node 0 can be reached now.
    if (e.kind() != ErrorKind::kStore && e.kind() != ErrorKind::kTimeout) throw;
    std::shared_ptr<TcpStore> fresh;
    try {
      fresh = connect(options_, patience);
    } catch (const std::exception& failed) {
      std::lock_guard lock(store_mu_);
      failed_try_ = Clock::now();
      failed_why_ = failed.what();
      throw;
    }
    {
      std::lock_guard lock(store_mu_);
      if (store_ == store) store_ = fresh;
      store = store_;
      failed_try_ = {};
    }
    return call(*store);
  }
}

bool LiveNodes::store_answers() {
  try {
    on_store([&](TcpStore& s) { return s.check({beat_key(options_.node)}); }, options_.timeout,
             true);
    return true;
  } catch (const std::exception& e) {
    DTRAIN_LOG_WARN("dtrain run: node {} cannot reach the job's store at {}:{}: {}", options_.node,
                    options_.host, options_.port, e.what());
    return false;
  }
}

LiveNodes::~LiveNodes() {
  beating_.request_stop();
  if (beating_.joinable()) beating_.join();
}

void LiveNodes::beat_loop(std::stop_token stop) {
  std::mutex m;
  std::condition_variable_any wake;
  bool lost = false;
  while (!stop.stop_requested()) {
    try {
      // Connecting anew for at most a beat: the launcher's exit waits for a try in progress.
      on_store([&](TcpStore& s) { return s.add(beat_key(options_.node), 1); }, options_.beat, true);
      if (lost) DTRAIN_LOG_INFO("dtrain run: node {} reaches the job's store again", options_.node);
      lost = false;
    } catch (const std::exception& e) {
      // Node 0's launcher died or this node is cut off from it: node 0 stops waiting for this
      // node after its silence, and this node's workers cannot re-form meanwhile.
      if (!lost)
        DTRAIN_LOG_WARN(
            "dtrain run: node {} lost the job's store at {}:{} (node 0's launcher "
            "hosts it): {}; this node's workers cannot re-form without it",
            options_.node, options_.host, options_.port, e.what());
      lost = true;
    }
    std::unique_lock lock(m);
    wake.wait_for(lock, stop, options_.beat, [] { return false; });
  }
}

void LiveNodes::worker_ended(int rank, const std::string& how) {
  try {
    on_store(
        [&](TcpStore& s) {
          LiveMembership::publish_ended(s, rank, how);
          return 0;
        },
        options_.timeout, false);
  } catch (const std::exception& e) {
    DTRAIN_LOG_WARN(
        "dtrain run: node {} could not tell the other nodes that rank {} {}: {}; their survivors "
        "leave it out after the live world's settle time instead",
        options_.node, rank, how, e.what());
  }
}

void LiveNodes::finish(bool keep_store) {
  try {
    on_store(
        [&](TcpStore& s) {
          s.set(done_key(options_.node), Bytes{'1'});
          return 0;
        },
        options_.timeout, false);
  } catch (const std::exception& e) {
    DTRAIN_LOG_WARN("dtrain run: node {} could not say in the job's store that it is done: {}",
                    options_.node, e.what());
  }
  if (options_.node != 0) return;
  // Each other node's last beat count, and when it last changed.
  std::map<int, std::pair<int64_t, Clock::time_point>> waiting;
  for (int n = 1; n < options_.nnodes; ++n) waiting[n] = {-1, Clock::now()};
  bool said = false;
  while (!waiting.empty()) {
    std::vector<int> still;
    for (auto it = waiting.begin(); it != waiting.end();) {
      const int n = it->first;
      auto& [beats, changed] = it->second;
      if (on_store([&](TcpStore& s) { return s.check({done_key(n)}); }, options_.timeout, false)) {
        it = waiting.erase(it);
        continue;
      }
      const int64_t now_beats =
          on_store([&](TcpStore& s) { return s.add(beat_key(n), 0); }, options_.timeout, false);
      if (now_beats != beats) {
        beats = now_beats;
        changed = Clock::now();
      } else if (Clock::now() - changed >= options_.silence) {
        DTRAIN_LOG_WARN(
            "dtrain run: the launcher of node {} has been silent for {:.1f} s (it died, or it is "
            "cut off from node 0): not keeping the job's store up for it",
            n, seconds_of(Clock::now() - changed));
        it = waiting.erase(it);
        continue;
      }
      still.push_back(n);
      ++it;
    }
    if (still.empty()) break;
    if (!keep_store) {
      DTRAIN_LOG_WARN(
          "dtrain run: this launcher was told to stop: the workers of node(s) {} lose the job's "
          "store, and fail at their next re-forming or at their end",
          fmt::join(still, ", "));
      break;
    }
    if (!said) {
      DTRAIN_LOG_INFO(
          "dtrain run: this node's workers have ended; it keeps the job's store up for the "
          "launchers of node(s) {}, whose workers go on (--live)",
          fmt::join(still, ", "));
      said = true;
    }
    std::this_thread::sleep_for(options_.beat / 4);
  }
}

}  // namespace dtrain::launch
