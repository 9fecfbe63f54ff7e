// A parameter-server job inside a test: S server processes and W worker processes, forked, that
// find each other through a store the test process hosts. Servers publish their address and pid.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dtrain/ps.h"
#include "dtrain/store.h"
#include "support/expect.h"
#include "support/group.h"
#include "support/multiproc.h"

namespace dtrain::testing {

struct PsJob {
  int servers = 1;
  int workers = 1;
  std::unique_ptr<TcpStoreServer> store_server;
  uint16_t port = 0;

  PsJob(int s, int w) : servers(s), workers(w) {
    TcpStoreServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    store_server = std::make_unique<TcpStoreServer>(o);
    port = store_server->port();
  }

  std::unique_ptr<TcpStore> store() const {
    TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = port;
    o.timeout = std::chrono::seconds(30);
    return std::make_unique<TcpStore>(o);
  }

  // Server body: serves until every worker left (or 60 s).
  void serve(int index, ps::ServerOptions options = {}) const {
    options.index = index;
    options.num_servers = servers;
    options.listen_host = "127.0.0.1";
    ps::Server server(options);
    auto s = store();
    s->set(fmt::format("pid/{}", index), std::to_string(::getpid()));
    server.publish(*s);
    // Until every worker left, or the test says "stop" (workers that died never say goodbye).
    for (int i = 0; i < 600 && !server.wait(std::chrono::milliseconds(100)); ++i)
      if (s->check({"stop"})) return;
    RANK_CHECK(server.wait(std::chrono::milliseconds(1)), "server {} still had workers after 60 s",
               index);
  }

  ps::ClientOptions client_options(int worker) const {
    auto s = store();
    ps::ClientOptions o;
    o.worker = worker;
    o.num_workers = workers;
    o.timeout = std::chrono::seconds(20);
    o.connect_timeout = std::chrono::seconds(20);
    for (int i = 0; i < servers; ++i) o.servers.push_back(s->get_string(fmt::format("ps/server/{}", i)));
    return o;
  }

  // Runs servers (processes 0..S-1) and workers (S..S+W-1; fn gets the worker index).
  std::vector<ChildResult> run(const std::function<void(int worker)>& worker_fn,
                               ps::ServerOptions options = {},
                               std::chrono::milliseconds deadline = std::chrono::seconds(60)) {
    return run_ranks(
        servers + workers,
        [&](int r) {
          if (r < servers) {
            serve(r, options);
          } else {
            worker_fn(r - servers);
          }
        },
        deadline);
  }
};

}  // namespace dtrain::testing
