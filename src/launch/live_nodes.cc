#include "launch/live_nodes.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/log.h"
#include "dtrain/live_membership.h"

namespace dtrain::launch {
namespace {

using Clock = std::chrono::steady_clock;

std::string beat_key(int node) { return fmt::format("dtrain/live/node/{}/beat", node); }
std::string done_key(int node) { return fmt::format("dtrain/live/node/{}/done", node); }

double seconds_of(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

LiveNodes::LiveNodes(LiveNodesOptions options) : options_(std::move(options)) {
  TcpStoreOptions so;
  so.host = options_.host;
  so.port = options_.port;
  so.timeout = options_.timeout;
  so.connect_timeout = options_.connect_timeout;
  store_ = std::make_shared<TcpStore>(so);
  beating_ = std::jthread([this](std::stop_token stop) { beat_loop(stop); });
}

LiveNodes::~LiveNodes() {
  beating_.request_stop();
  if (beating_.joinable()) beating_.join();
}

void LiveNodes::beat_loop(std::stop_token stop) {
  std::mutex m;
  std::condition_variable_any wake;
  while (!stop.stop_requested()) {
    try {
      store_->add(beat_key(options_.node), 1);
    } catch (const std::exception& e) {
      // Cut off from node 0: the others stop waiting for this node, which is what it is.
      DTRAIN_LOG_DEBUG("dtrain run: node {} cannot beat in the job's store: {}", options_.node,
                       e.what());
    }
    std::unique_lock lock(m);
    wake.wait_for(lock, stop, options_.beat, [] { return false; });
  }
}

void LiveNodes::worker_ended(int rank, const std::string& how) {
  try {
    LiveMembership::publish_ended(*store_, rank, how);
  } catch (const std::exception& e) {
    DTRAIN_LOG_WARN(
        "dtrain run: node {} could not tell the other nodes that rank {} {}: {}; their survivors "
        "leave it out after the live world's settle time instead",
        options_.node, rank, how, e.what());
  }
}

void LiveNodes::finish(bool keep_store) {
  try {
    store_->set(done_key(options_.node), Bytes{'1'});
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
      if (store_->check({done_key(n)})) {
        it = waiting.erase(it);
        continue;
      }
      const int64_t now_beats = store_->add(beat_key(n), 0);
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
