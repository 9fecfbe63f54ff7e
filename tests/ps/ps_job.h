// A parameter-server job inside a test: S server processes and W worker processes, forked, that
// find each other through a store in a process of its own. Servers publish their address and pid.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
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
  pid_t store_pid = -1;
  uint16_t port = 0;

  // The store runs in a process of its own: this one forks the job's processes, and forking from
  // a process that runs threads (a store server's) into children that start threads is what
  // ThreadSanitizer cannot follow (scripts/sanitize.sh tsan).
  PsJob(int s, int w) : servers(s), workers(w) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("PsJob: pipe() failed");
    std::fflush(stdout);
    std::fflush(stderr);
    store_pid = ::fork();
    if (store_pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // dies with the test
      ::close(fds[0]);
      TcpStoreServerOptions o;
      o.host = "127.0.0.1";
      o.port = 0;
      TcpStoreServer server(o);
      const uint16_t p = server.port();
      [[maybe_unused]] auto n = ::write(fds[1], &p, sizeof p);
      ::close(fds[1]);
      for (;;) ::pause();  // until the test kills it
    }
    ::close(fds[1]);
    pollfd ready{fds[0], POLLIN, 0};
    const bool got =
        ::poll(&ready, 1, 20'000) == 1 && ::read(fds[0], &port, sizeof port) == sizeof port;
    ::close(fds[0]);
    if (!got) throw std::runtime_error("PsJob: the store process did not report its port in 20 s");
  }
  ~PsJob() {
    ::kill(store_pid, SIGKILL);
    ::waitpid(store_pid, nullptr, 0);
  }
  PsJob(const PsJob&) = delete;
  PsJob& operator=(const PsJob&) = delete;

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
