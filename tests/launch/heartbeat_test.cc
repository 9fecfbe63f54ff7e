// The elastic agent's heartbeat against a real store server: it beats, it goes on beating once
// the server has gone and come back on the same port (every connection to it broke), and it
// stops promptly, also while it cannot reach the store.
#include "launch/heartbeat.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <thread>

#include "dtrain/store.h"

namespace dtrain::launch {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr const char* kJob = "heartbeat-test";

std::unique_ptr<TcpStoreServer> serve(uint16_t port) {
  TcpStoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.job_id = kJob;
  return std::make_unique<TcpStoreServer>(o);
}

std::shared_ptr<Store> connect(uint16_t port, std::chrono::milliseconds connect_timeout) {
  TcpStoreOptions o;
  o.port = port;
  o.job_id = kJob;
  o.timeout = 2s;
  o.connect_timeout = connect_timeout;
  return std::make_shared<TcpStore>(o);
}

bool within(std::chrono::milliseconds limit, const std::function<bool()>& done) {
  for (auto end = Clock::now() + limit; Clock::now() < end; std::this_thread::sleep_for(10ms))
    if (done()) return true;
  return false;
}

TEST(Heartbeat, BeatsOnAfterTheStoreConnectionBroke) {
  auto server = serve(0);
  const uint16_t port = server->port();
  Heartbeat heartbeat(connect(port, 1s), [port] { return connect(port, 200ms); },
                      {.key = "beats", .interval = 50ms, .log_prefix = "test"});
  {
    auto watcher = connect(port, 1s);
    ASSERT_TRUE(within(5s, [&] { return watcher->add("beats", 0) >= 3; })) << "no beats";
  }
  server.reset();  // every connection to it breaks; the beats fail meanwhile
  std::this_thread::sleep_for(300ms);
  server = serve(port);
  auto watcher = connect(port, 1s);
  EXPECT_TRUE(within(5s, [&] { return watcher->add("beats", 0) >= 3; }))
      << "the heartbeat did not resume: " << watcher->add("beats", 0) << " beats";
  auto start = Clock::now();
  heartbeat.stop();
  EXPECT_LT(Clock::now() - start, 1s);
}

TEST(Heartbeat, StopsPromptlyWhileTheStoreIsGone) {
  auto server = serve(0);
  const uint16_t port = server->port();
  Heartbeat heartbeat(connect(port, 1s), [port] { return connect(port, 500ms); },
                      {.key = "beats", .interval = 20ms, .log_prefix = "test"});
  server.reset();
  std::this_thread::sleep_for(200ms);  // reconnecting now
  auto start = Clock::now();
  heartbeat.stop();
  // At most one connection attempt (500 ms) to sit out.
  EXPECT_LT(Clock::now() - start, 2s);
}

}  // namespace
}  // namespace dtrain::launch
