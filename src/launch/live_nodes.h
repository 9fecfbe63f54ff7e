// The launchers of a live job on several nodes (`dtrain run --live --nnodes N`), through the job's
// store, which node 0's launcher hosts:
// - each tells the members on every node how its workers ended (LiveMembership::publish_ended),
//   since a survivor on another node cannot read this node's exit words;
// - node 0's keeps the store up until the other launchers are done, since the survivors of other
//   nodes go on agreeing through it after node 0's own workers ended. A launcher beats while it
//   supervises; one silent for `silence` (dead, or cut off) is not waited for. A launcher cut off
//   for a while connects again once the network is back.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dtrain/store.h"

namespace dtrain::launch {

struct LiveNodesOptions {
  std::string host;  // node 0's launcher, which hosts the store
  uint16_t port = 0;
  int node = 0;
  int nnodes = 1;
  // Each store call; a launcher cut off from the store says so and goes on supervising.
  std::chrono::milliseconds timeout{5'000};
  // Connecting at start: node 0's launcher may start after this one.
  std::chrono::milliseconds connect_timeout{60'000};
  std::chrono::milliseconds beat{1'000};
  // Node 0 stops waiting for a launcher that has not beaten for this long.
  std::chrono::milliseconds silence{15'000};
};

class LiveNodes {
 public:
  // Connects to the store (retrying up to `connect_timeout`) and starts beating.
  explicit LiveNodes(LiveNodesOptions options);
  ~LiveNodes();  // stops beating
  LiveNodes(const LiveNodes&) = delete;
  LiveNodes& operator=(const LiveNodes&) = delete;

  // How the worker of world rank `rank` ended, for the members on every node. A store that
  // cannot be reached is logged, not thrown: the supervisor goes on.
  void worker_ended(int rank, const std::string& how);
  // This node's workers have all ended; on node 0 with `keep_store`, returns once every other
  // launcher said the same or fell silent (logging whom it waits for). Without it (the launcher
  // was told to stop), node 0 says whose workers lose the store and returns at once.
  void finish(bool keep_store);
  // Whether the job's store answers (connecting anew when the connection broke): a replacement
  // for a worker of this node can be taken in only through it.
  bool store_answers();

 private:
  void beat_loop(std::stop_token stop);
  // Runs `call` on the store client; when its connection broke (a cut that has ended), once
  // more on a new one, connecting for up to `patience`. Throws when the store cannot be reached,
  // at once when a try to connect failed less than options.timeout ago unless `try_anyway`.
  template <typename Call>
  auto on_store(Call&& call, std::chrono::milliseconds patience, bool try_anyway);

  LiveNodesOptions options_;
  std::mutex store_mu_;              // guards the three below
  std::shared_ptr<TcpStore> store_;  // calls are serialised on its connection; replaced when broken
  std::chrono::steady_clock::time_point failed_try_{};  // the last try to connect anew that failed
  std::string failed_why_;
  std::jthread beating_;
};

}  // namespace dtrain::launch
