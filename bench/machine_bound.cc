#include "bench/machine_bound.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace dtrain::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Beyond every cache of this machine's class (the last level is tens of MiB), so that the
// copies stream through memory as a collective's large messages do; and within one core's own
// cache, as a small message's copies are.
constexpr size_t kUncachedBytes = size_t{64} << 20;
constexpr size_t kCachedBytes = size_t{128} << 10;

// GB/s of `copiers` threads copying their own buffers of `bytes` at once, all together, for
// `seconds`.
double copy_gbs(int copiers, size_t bytes, double seconds) {
  std::vector<std::unique_ptr<std::byte[]>> from, to;
  for (int i = 0; i < copiers; ++i) {
    from.emplace_back(new std::byte[bytes]);
    to.emplace_back(new std::byte[bytes]);
    std::memset(from.back().get(), i + 1, bytes);  // touched: no page faults while timed
    std::memset(to.back().get(), 0, bytes);
  }
  std::atomic<uint64_t> copied{0};
  std::barrier start(copiers + 1);
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < copiers; ++i)
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      while (!stop.load(std::memory_order_relaxed)) {
        std::memcpy(to[i].get(), from[i].get(), bytes);
        copied.fetch_add(bytes, std::memory_order_relaxed);
      }
    });
  start.arrive_and_wait();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  return static_cast<double>(copied.load()) / seconds_since(t0) / 1e9;
}

// A connected pair of loopback TCP sockets (client, server side), with Nagle off. Throws
// std::runtime_error saying which step failed; nothing is left open then.
std::pair<int, int> loopback_pair() {
  int listener = -1, client = -1, server = -1;
  auto fail = [&](const char* step) {
    const std::string why = std::string("loopback ") + step + ": " + std::strerror(errno);
    for (int fd : {listener, client, server})
      if (fd >= 0) ::close(fd);
    throw std::runtime_error(why);
  };
  listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    fail("listener");
  client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (client < 0 || ::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    fail("connect");
  server = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  if (server < 0) fail("accept");
  ::close(listener);
  const int one = 1;
  ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return {client, server};
}

// GB/s of `streams` loopback TCP streams at once, all together, each written by one thread
// and read by another. One stream is what a single flow can reach; a collective's ranks send
// and receive at once, and every byte of every flow is copied by the kernel on the same CPUs,
// so the machine's total over as many streams as it has CPUs is what their flows share.
double tcp_streams_gbs(int streams, double seconds) {
  std::vector<std::pair<int, int>> pairs;
  try {
    for (int i = 0; i < streams; ++i) pairs.push_back(loopback_pair());
  } catch (...) {
    for (auto [client, server] : pairs) ::close(client), ::close(server);
    throw;
  }
  constexpr size_t kChunk = size_t{1} << 20;
  std::atomic<uint64_t> received{0};
  std::atomic<bool> stop{false};
  std::barrier start(2 * streams + 1);
  std::vector<std::thread> threads;
  for (auto [client, server] : pairs) {
    threads.emplace_back([&, fd = server] {
      std::vector<std::byte> buf(kChunk);
      start.arrive_and_wait();
      for (;;) {
        const ssize_t n = ::read(fd, buf.data(), buf.size());
        if (n <= 0) return;
        received.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
      }
    });
    threads.emplace_back([&, fd = client] {
      std::vector<std::byte> chunk(kChunk, std::byte{1});
      start.arrive_and_wait();
      while (!stop.load(std::memory_order_relaxed))
        if (::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL) < 0) return;
    });
  }
  start.arrive_and_wait();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const uint64_t moved = received.load();
  const double took = seconds_since(t0);
  stop = true;
  // Shutting both ends down ends the readers and wakes a writer blocked in send().
  for (auto [client, server] : pairs) ::shutdown(client, SHUT_RDWR), ::shutdown(server, SHUT_RDWR);
  for (auto& t : threads) t.join();
  for (auto [client, server] : pairs) ::close(client), ::close(server);
  return static_cast<double>(moved) / took / 1e9;
}

// One byte from `fd`, polling without sleeping, as a waiting rank does while it spins; false
// when the connection closed.
bool spin_read_byte(int fd, char& b) {
  for (;;) {
    const ssize_t n = ::recv(fd, &b, 1, MSG_DONTWAIT);
    if (n == 1) return true;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
  }
}

// Microseconds for one byte over loopback TCP and back, both ends polling, the median of many
// trips.
double socket_round_trip_us(double seconds) {
  auto [client, server] = loopback_pair();
  std::thread echo([fd = server] {
    char b;
    while (spin_read_byte(fd, b))
      if (::write(fd, &b, 1) != 1) return;
  });
  std::vector<double> trips;
  const auto t0 = Clock::now();
  char b = 1;
  while (seconds_since(t0) < seconds) {
    const auto t = Clock::now();
    if (::write(client, &b, 1) != 1 || !spin_read_byte(client, b)) break;
    trips.push_back(seconds_since(t) * 1e6);
  }
  ::shutdown(client, SHUT_RDWR);
  echo.join();
  ::close(client);
  ::close(server);
  return median_of(std::move(trips));
}

bool pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

}  // namespace

double cache_line_round_trip_ns(int cpu_a, int cpu_b, int trips) {
  alignas(64) static std::atomic<int> line{0};
  std::atomic<bool> stop{false};
  std::atomic<int> pinned{0};  // 1: the echo is pinned, -1: it could not be
  line = 0;
  // The echo answers every odd value with the next even one.
  std::thread echo([&] {
    pinned = pin(cpu_b) ? 1 : -1;
    while (!stop.load(std::memory_order_relaxed)) {
      const int v = line.load(std::memory_order_acquire);
      if (v & 1) line.store(v + 1, std::memory_order_release);
    }
  });
  cpu_set_t before;
  pthread_getaffinity_np(pthread_self(), sizeof(before), &before);
  while (pinned == 0) std::this_thread::yield();
  double ns = 0;
  if (pinned == 1 && pin(cpu_a)) {
    const auto t0 = Clock::now();
    for (int i = 0; i < trips; ++i) {
      const int v = line.load(std::memory_order_relaxed) + 1;  // even: the echo answered
      line.store(v, std::memory_order_release);
      while (line.load(std::memory_order_acquire) == v) {
      }
    }
    ns = seconds_since(t0) * 1e9 / trips;
    pthread_setaffinity_np(pthread_self(), sizeof(before), &before);
  }
  stop = true;
  echo.join();
  return ns;
}

MachineBound measure_machine_bound(double seconds) {
  MachineBound b;
  b.copiers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // A rate is the best of three samples: a shared machine's neighbours and its vCPUs' placement
  // slow a sample down by as much as half (docs/performance.md), and a bound is what the machine
  // can do, not what it did once.
  auto best = [seconds](auto rate) {
    double top = 0;
    for (int i = 0; i < 3; ++i) top = std::max(top, rate(seconds / 2));
    return top;
  };
  b.memcpy_gbs = best([](double s) { return copy_gbs(1, kUncachedBytes, s); });
  b.memcpy_all_gbs = b.copiers > 1
                         ? best([&](double s) { return copy_gbs(b.copiers, kUncachedBytes, s); })
                         : b.memcpy_gbs;
  b.memcpy_cached_gbs = best([](double s) { return copy_gbs(1, kCachedBytes, s); });
  b.tcp_stream_gbs = best([](double s) { return tcp_streams_gbs(1, s); });
  b.tcp_all_gbs = b.copiers > 1 ? best([&](double s) { return tcp_streams_gbs(b.copiers, s); })
                                : b.tcp_stream_gbs;
  b.socket_round_trip_us = socket_round_trip_us(seconds);
  if (b.copiers > 1) {
    std::vector<double> samples;
    for (int i = 0; i < 5; ++i) samples.push_back(cache_line_round_trip_ns(0, 1, 20'000));
    b.cache_line_round_trip_ns = median_of(std::move(samples));
  }
  return b;
}

std::string to_json(const MachineBound& b) {
  nlohmann::ordered_json j;
  j["memcpy_gbs"] = b.memcpy_gbs;
  j["memcpy_all_gbs"] = b.memcpy_all_gbs;
  j["copiers"] = b.copiers;
  j["memcpy_cached_gbs"] = b.memcpy_cached_gbs;
  j["tcp_stream_gbs"] = b.tcp_stream_gbs;
  j["tcp_all_gbs"] = b.tcp_all_gbs;
  j["socket_round_trip_us"] = b.socket_round_trip_us;
  j["cache_line_round_trip_ns"] = b.cache_line_round_trip_ns;
  return j.dump();
}

MachineBound parse_machine_bound(const std::string& json) {
  const auto j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    throw std::invalid_argument("the machine's bound is not a JSON object: " + json);
  MachineBound b;
  try {
    b.memcpy_gbs = j.at("memcpy_gbs").get<double>();
    b.memcpy_all_gbs = j.at("memcpy_all_gbs").get<double>();
    b.copiers = j.at("copiers").get<int>();
    b.memcpy_cached_gbs = j.at("memcpy_cached_gbs").get<double>();
    b.tcp_stream_gbs = j.at("tcp_stream_gbs").get<double>();
    b.tcp_all_gbs = j.at("tcp_all_gbs").get<double>();
    b.socket_round_trip_us = j.at("socket_round_trip_us").get<double>();
    b.cache_line_round_trip_ns = j.at("cache_line_round_trip_ns").get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("the machine's bound: ") + e.what() + ": " + json);
  }
  if (b.memcpy_gbs <= 0 || b.memcpy_all_gbs <= 0 || b.memcpy_cached_gbs <= 0 ||
      b.tcp_stream_gbs <= 0 || b.tcp_all_gbs <= 0 || b.copiers < 1)
    throw std::invalid_argument("the machine's bound holds a rate of 0 or less: " + json);
  return b;
}

}  // namespace dtrain::bench
