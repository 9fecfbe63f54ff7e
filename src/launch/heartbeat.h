// Heartbeat: a thread that adds 1 to a store key at a steady interval, so that the other agents
// of an elastic job can tell this one is alive (Rendezvous::heartbeat_key). They count it dead
// after the heartbeat timeout without a beat, so one failed call must not end the beating: a
// connection that broke or an answer that came too late is replaced by a new connection, and
// the beats go on. The log says when beats stop going through and when they resume.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>

#include "dtrain/store.h"

namespace dtrain::launch {

struct HeartbeatOptions {
  std::string key;
  std::chrono::milliseconds interval{1000};
  std::string log_prefix;  // "dtrain run [node a]"
};

class Heartbeat {
 public:
  // Opens a new connection to the store; throws dtrain::Error when it cannot. Its own connect
  // timeout bounds how long stopping the heartbeat can take.
  using Connect = std::function<std::shared_ptr<Store>()>;

  // Beats through `store` from now on, and through a connection from `connect` after a failure.
  Heartbeat(std::shared_ptr<Store> store, Connect connect, HeartbeatOptions options);
  ~Heartbeat();  // stops and joins

  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Beats no more (the agent leaves the job). Joins the thread.
  void stop();

 private:
  void run(std::stop_token stop);

  Connect connect_;
  HeartbeatOptions options_;
  std::shared_ptr<Store> store_;  // the thread's own; null while reconnecting
  std::mutex mutex_;              // for cv_ only
  std::condition_variable_any cv_;
  std::jthread thread_;  // last: started after the rest is set
};

}  // namespace dtrain::launch
