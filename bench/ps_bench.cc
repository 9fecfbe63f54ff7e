// ps_bench: the parameter server measured against what the machine can do, in one run.
//
//   build/bin/ps_bench [--mib 64] [--iters 10] [--workers 4] [--servers 2] [--wire-mib 16]
//
// 1. stream   one loopback TCP stream, receiver busy-polling: the ceiling for moving bytes.
// 2. push_pull  1 worker, 1 server, a dense table of --mib MiB: push the gradient and pull the
//             updated values (async SGD), median time per step; GB/s counts both directions, so
//             it is comparable with the stream's GB/s. The goal is >= 70% of the stream.
// 3. wire     bytes each worker sends and receives per step (TCP_INFO of its sockets), parameter server
//             (--servers servers) against ring all-reduce over TCP, for --workers workers and a
//             --wire-mib MiB model, beside the theory: PS M out + M in; ring 2(N-1)/N M each way.
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/socket.h"
#include "dtrain/process_group.h"
#include "dtrain/ps.h"
#include "dtrain/store.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Runs fn in a child process; returns its pid.
template <typename F>
pid_t spawn(F fn) {
  std::fflush(stdout);
  pid_t pid = ::fork();
  if (pid == 0) {
    int code = 0;
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ps_bench child: %s\n", e.what());
      code = 1;
    }
    std::fflush(stdout);
    ::_exit(code);
  }
  return pid;
}

void reap(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error(fmt::format("a child process (pid {}) failed", pid));
}

// GB/s of one loopback stream: the receiver spins on non-blocking recv.
double stream_gbs(size_t bytes, int iters) {
  dtrain::net::Fd listener = dtrain::net::listen_tcp("127.0.0.1", 0);
  const uint16_t port = dtrain::net::local_port(listener.get());
  pid_t child = spawn([&] {
    dtrain::net::Fd fd = dtrain::net::connect_tcp({"127.0.0.1", port}, dtrain::Deadline::after(10s),
                                                  "stream");
    std::vector<char> buf(4 << 20);
    const size_t total = bytes * static_cast<size_t>(iters);
    size_t got = 0;
    while (got < total) {
      ssize_t n = ::recv(fd.get(), buf.data(), std::min(buf.size(), total - got), MSG_DONTWAIT);
      if (n > 0) got += static_cast<size_t>(n);
      else if (n == 0) throw std::runtime_error("stream closed early");
    }
    char ack = 1;
    dtrain::net::write_all(fd.get(), &ack, 1, dtrain::Deadline::after(10s), "ack");
  });
  dtrain::net::Fd fd = dtrain::net::accept_tcp(listener.get(), dtrain::Deadline::after(10s), "stream");
  std::vector<char> data(bytes, 1);
  auto start = Clock::now();
  for (int i = 0; i < iters; ++i)
    dtrain::net::write_all(fd.get(), data.data(), data.size(), dtrain::Deadline::after(60s), "stream");
  char ack = 0;
  dtrain::net::read_all(fd.get(), &ack, 1, dtrain::Deadline::after(60s), "ack");
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  reap(child);
  return static_cast<double>(bytes) * iters / seconds / 1e9;
}

std::unique_ptr<dtrain::TcpStoreServer> host_store() {
  dtrain::TcpStoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  return std::make_unique<dtrain::TcpStoreServer>(o);
}

std::shared_ptr<dtrain::TcpStore> store_client(uint16_t port) {
  dtrain::TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.timeout = 120s;
  return std::make_shared<dtrain::TcpStore>(o);
}

pid_t spawn_server(int index, int servers, uint16_t store_port) {
  return spawn([=] {
    dtrain::ps::ServerOptions o;
    o.index = index;
    o.num_servers = servers;
    o.listen_host = "127.0.0.1";
    dtrain::ps::Server server(o);
    auto store = store_client(store_port);
    server.publish(*store);
    server.wait(std::chrono::minutes(10));
  });
}

dtrain::ps::ClientOptions client_options(int worker, int workers, int servers, uint16_t port) {
  auto store = store_client(port);
  dtrain::ps::ClientOptions o;
  o.worker = worker;
  o.num_workers = workers;
  for (int s = 0; s < servers; ++s) o.servers.push_back(store->get_string(fmt::format("ps/server/{}", s)));
  return o;
}

// Median seconds of a push_pull of `bytes` (1 worker, 1 server).
double push_pull_seconds(size_t bytes, int iters) {
  auto store = host_store();
  pid_t server = spawn_server(0, 1, store->port());
  std::vector<double> times;
  {
    dtrain::ps::Client client(client_options(0, 1, 1, store->port()));
    std::vector<float> w(bytes / sizeof(float), 0.5f), g(w.size(), 0.001f);
    dtrain::ps::TableOptions opt;
    opt.consistency = dtrain::ps::Consistency::kAsync;
    client.create_dense("w", dtrain::TensorView::of(w), opt);
    for (int i = 0; i < iters + 2; ++i) {
      auto start = Clock::now();
      client.push_pull("w", dtrain::TensorView::of(g), dtrain::TensorView::of(w)).wait();
      if (i >= 2) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
  }
  reap(server);
  return median(times);
}

struct Io {
  uint64_t sent = 0, received = 0;
};
// Bytes this process's TCP sockets have sent (and had acknowledged) and received so far, summed
// over every socket it holds: the data connections, whoever opened them.
Io read_io() {
  Io io;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    int fd = std::stoi(entry.path().filename().string());
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    tcp_info info{};
    socklen_t len = sizeof(info);
    if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) continue;
    io.sent += info.tcpi_bytes_acked;
    io.received += info.tcpi_bytes_received;
  }
  return io;
}

// Bytes per worker per step, averaged over the workers: {sent, received}.
std::pair<double, double> wire_bytes(bool ps, int workers, int servers, size_t bytes, int steps) {
  auto store = host_store();
  const uint16_t port = store->port();
  std::vector<pid_t> pids;
  if (ps)
    for (int s = 0; s < servers; ++s) pids.push_back(spawn_server(s, servers, port));
  for (int w = 0; w < workers; ++w) {
    pids.push_back(spawn([=] {
      std::vector<float> x(bytes / sizeof(float), 1.0f), g(x.size(), 0.001f);
      auto st = store_client(port);
      Io before, after;
      if (ps) {
        dtrain::ps::Client client(client_options(w, workers, servers, port));
        client.create_dense("w", dtrain::TensorView::of(x));
        client.push_pull("w", dtrain::TensorView::of(g), dtrain::TensorView::of(x)).wait();
        before = read_io();
        for (int i = 0; i < steps; ++i)
          client.push_pull("w", dtrain::TensorView::of(g), dtrain::TensorView::of(x)).wait();
        after = read_io();
      } else {
        dtrain::ProcessGroupOptions po;
        po.transport = "tcp";
        auto pg = dtrain::ProcessGroup::create(st, w, workers, po);
        dtrain::AllreduceOptions ao;
        ao.algorithm = "ring";
        pg->allreduce(dtrain::TensorView::of(x), ao)->wait();
        before = read_io();
        for (int i = 0; i < steps; ++i) pg->allreduce(dtrain::TensorView::of(x), ao)->wait();
        after = read_io();
        pg->barrier()->wait();
      }
      st->add("io/sent", static_cast<int64_t>(after.sent - before.sent));
      st->add("io/received", static_cast<int64_t>(after.received - before.received));
    }));
  }
  for (pid_t p : pids) reap(p);
  auto st = store_client(port);
  const double per = static_cast<double>(workers) * steps;
  return {st->add("io/sent", 0) / per, st->add("io/received", 0) / per};
}

}  // namespace

// The measurements, printed as two tables.
void run(int mib, int iters, int workers, int servers, int wire_mib) {
  const size_t bytes = static_cast<size_t>(mib) << 20;

  const double stream = stream_gbs(bytes, iters);
  const double t = push_pull_seconds(bytes, iters);
  const double ps_gbs = 2.0 * static_cast<double>(bytes) / t / 1e9;
  std::printf("# ps_bench: %d MiB, %d iterations (medians)\n", mib, iters);
  std::printf("%-34s %12s %10s %8s\n", "measure", "time", "GB/s", "ratio");
  std::printf("%-34s %12s %10.2f %8s\n", "loopback TCP stream (busy poll)", "-", stream, "1.00");
  std::printf("%-34s %10.2f ms %10.2f %8.2f\n", "push_pull 1 worker, 1 server", t * 1e3, ps_gbs,
              ps_gbs / stream);

  const size_t wire = static_cast<size_t>(wire_mib) << 20;
  auto [ps_out, ps_in] = wire_bytes(true, workers, servers, wire, 3);
  auto [ring_out, ring_in] = wire_bytes(false, workers, servers, wire, 3);
  const double m = static_cast<double>(wire);
  const double ring_theory = 2.0 * (workers - 1) / workers * m;
  std::printf("\n# bytes per worker per step, model M = %d MiB, %d workers (%d servers)\n", wire_mib,
              workers, servers);
  std::printf("%-22s %14s %14s %14s %14s\n", "scheme", "sent (M)", "received (M)", "theory sent",
              "theory recv");
  std::printf("%-22s %14.3f %14.3f %14.3f %14.3f\n", "parameter server", ps_out / m, ps_in / m, 1.0,
              1.0);
  std::printf("%-22s %14.3f %14.3f %14.3f %14.3f\n", "ring all-reduce", ring_out / m, ring_in / m,
              ring_theory / m, ring_theory / m);
}

int main(int argc, char** argv) {
  CLI::App app{"ps_bench: the parameter server against a loopback stream and ring all-reduce"};
  int mib = 64, iters = 10, workers = 4, servers = 2, wire_mib = 16;
  app.add_option("--mib", mib, "Dense table size for push_pull, MiB");
  app.add_option("--iters", iters, "Timed iterations");
  app.add_option("--workers", workers, "Workers for the wire-bytes comparison");
  app.add_option("--servers", servers, "Servers for the wire-bytes comparison");
  app.add_option("--wire-mib", wire_mib, "Model size for the wire-bytes comparison, MiB");
  CLI11_PARSE(app, argc, argv);
  try {
    run(mib, iters, workers, servers, wire_mib);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
