// The store wire format on a socketpair: round trips, and bytes that must be refused before
// anything is allocated for them.
#include "store/store_protocol.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <thread>

#include "common/socket.h"
#include "store/store_test_util.h"

namespace dtrain::store {
namespace {

using testing::to_bytes;

struct SocketPair {
  net::Fd a, b;
  SocketPair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a = net::Fd(fds[0]);
    b = net::Fd(fds[1]);
  }
};

void send_bytes(int fd, const std::vector<uint8_t>& bytes) {
  net::write_all(fd, bytes.data(), bytes.size(), Deadline::after(std::chrono::seconds(5)), "test");
}

std::vector<uint8_t> u64_bytes(uint64_t v) {
  std::vector<uint8_t> out(8);
  std::memcpy(out.data(), &v, 8);
  return out;
}

void append(std::vector<uint8_t>& out, const std::vector<uint8_t>& more) {
  out.insert(out.end(), more.begin(), more.end());
}

TEST(StoreProtocol, RequestRoundTrip) {
  SocketPair p;
  Request req{.command = Command::kMultiSet,
              .keys = {"a", "", std::string(1000, 'k')},
              .values = {to_bytes("1"), Bytes{}, Bytes(70'000, 0xab)},
              .delta = -42,
              .timeout = std::chrono::milliseconds(1234)};
  send_bytes(p.a.get(), encode_request(req));
  auto got = read_request(p.b.get(), std::chrono::seconds(5), "test");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->command, Command::kMultiSet);
  EXPECT_EQ(got->keys, req.keys);
  EXPECT_EQ(got->values, req.values);
  EXPECT_EQ(got->delta, -42);
  EXPECT_EQ(got->timeout, std::chrono::milliseconds(1234));
}

TEST(StoreProtocol, ResponseRoundTrip) {
  SocketPair p;
  Response resp{.status = Status::kTimeout,
                .integer = 7,
                .values = {to_bytes("v")},
                .missing_keys = {"x", "y"},
                .error = "why"};
  send_bytes(p.a.get(), encode_response(resp));
  Response got = read_response(p.b.get(), Deadline::after(std::chrono::seconds(5)), "test");
  EXPECT_EQ(got.status, Status::kTimeout);
  EXPECT_EQ(got.integer, 7);
  EXPECT_EQ(got.values, resp.values);
  EXPECT_EQ(got.missing_keys, resp.missing_keys);
  EXPECT_EQ(got.error, "why");
}

TEST(StoreProtocol, CleanCloseBetweenRequestsIsNotAnError) {
  SocketPair p;
  p.a.reset();
  EXPECT_FALSE(read_request(p.b.get(), std::chrono::seconds(5), "test").has_value());
}

TEST(StoreProtocol, CloseMidRequestIsPeerFailure) {
  SocketPair p;
  std::vector<uint8_t> bytes = encode_request(
      Request{.command = Command::kSet, .keys = {"key"}, .values = {to_bytes("value")}});
  bytes.resize(bytes.size() / 2);
  send_bytes(p.a.get(), bytes);
  p.a.reset();
  EXPECT_THROW(read_request(p.b.get(), std::chrono::seconds(5), "test"), PeerFailureError);
}

TEST(StoreProtocol, StalledRequestTimesOut) {
  SocketPair p;
  send_bytes(p.a.get(), {static_cast<uint8_t>(Command::kGet)});
  auto start = Clock::now();
  EXPECT_THROW(read_request(p.b.get(), std::chrono::milliseconds(200), "test"), TimeoutError);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
}

TEST(StoreProtocol, UnknownCommandIsRefused) {
  SocketPair p;
  send_bytes(p.a.get(), {0xee, 1, 2, 3});
  EXPECT_THROW(read_request(p.b.get(), std::chrono::seconds(5), "test"), ProtocolError);
}

// A header claiming a key of 2^62 bytes is refused before reading (or allocating) anything more.
TEST(StoreProtocol, HugeKeyLengthIsRefused) {
  SocketPair p;
  std::vector<uint8_t> bytes = {static_cast<uint8_t>(Command::kGet)};
  append(bytes, u64_bytes(0));                  // delta
  append(bytes, u64_bytes(0));                  // timeout
  append(bytes, u64_bytes(1));                  // one key
  append(bytes, u64_bytes(uint64_t{1} << 62));  // of an absurd size
  send_bytes(p.a.get(), bytes);
  try {
    read_request(p.b.get(), std::chrono::seconds(5), "test");
    FAIL() << "a key of 2^62 bytes was accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the limit"), std::string::npos) << e.what();
  }
}

TEST(StoreProtocol, TooManyItemsAreRefused) {
  SocketPair p;
  std::vector<uint8_t> bytes = {static_cast<uint8_t>(Command::kMultiGet)};
  append(bytes, u64_bytes(0));
  append(bytes, u64_bytes(0));
  append(bytes, u64_bytes(~uint64_t{0}));  // 2^64-1 keys
  send_bytes(p.a.get(), bytes);
  EXPECT_THROW(read_request(p.b.get(), std::chrono::seconds(5), "test"), ProtocolError);
}

TEST(StoreProtocol, ValueOverOneGiBIsRefused) {
  SocketPair p;
  std::vector<uint8_t> bytes = {static_cast<uint8_t>(Command::kSet)};
  append(bytes, u64_bytes(0));
  append(bytes, u64_bytes(0));
  append(bytes, u64_bytes(1));
  append(bytes, u64_bytes(1));
  bytes.push_back('k');
  append(bytes, u64_bytes(1));
  append(bytes, u64_bytes(kMaxValueBytes + 1));
  send_bytes(p.a.get(), bytes);
  EXPECT_THROW(read_request(p.b.get(), std::chrono::seconds(5), "test"), ProtocolError);
}

// Address-space size of this process, from /proc/self/status (kB).
uint64_t vm_size_bytes() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t kb = 0;
  while (std::fgets(line, sizeof(line), f))
    if (std::sscanf(line, "VmSize: %lu kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

// A value that claims 512 MiB but sends 10 bytes and stalls: the reader must time out having
// allocated only what arrived. The child runs with its address space capped 128 MiB above what it
// uses, so allocating the claimed size up front would fail with bad_alloc instead.
TEST(StoreProtocol, ClaimedSizeIsNotAllocatedUpFront) {
  SocketPair p;
  std::vector<uint8_t> bytes = {static_cast<uint8_t>(Command::kSet)};
  append(bytes, u64_bytes(0));
  append(bytes, u64_bytes(0));
  append(bytes, u64_bytes(1));
  append(bytes, u64_bytes(1));
  bytes.push_back('k');
  append(bytes, u64_bytes(1));
  append(bytes, u64_bytes(uint64_t{512} << 20));
  append(bytes, std::vector<uint8_t>(10, 'x'));
  send_bytes(p.a.get(), bytes);
  auto results = testing::run_ranks(
      1,
      [&](int) {
        uint64_t vm = vm_size_bytes();
        if (vm == 0) ::_exit(4);
        rlimit limit{vm + (uint64_t{128} << 20), vm + (uint64_t{128} << 20)};
        if (::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(5);
        try {
          read_request(p.b.get(), std::chrono::milliseconds(200), "test");
        } catch (const TimeoutError&) {
          ::_exit(0);
        }
        ::_exit(6);  // bad_alloc escapes as exit code 1 from run_ranks
      },
      std::chrono::seconds(30));
  EXPECT_TRUE(testing::all_ok(results)) << testing::describe(results);
}

TEST(StoreProtocol, UnknownStatusIsRefused) {
  SocketPair p;
  send_bytes(p.a.get(), {0x77});
  EXPECT_THROW(read_response(p.b.get(), Deadline::after(std::chrono::seconds(5)), "test"),
               ProtocolError);
}

TEST(StoreProtocol, ClientLimitsNameTheProblem) {
  try {
    check_limits({std::string(kMaxKeyBytes + 1, 'k')}, {}, "rank 1: store x:1 set(...)");
    FAIL() << "an oversized key passed";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("65537"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_limits({std::string(kMaxKeyBytes, 'k')}, {Bytes(1 << 20)}, "ok"));
}

}  // namespace
}  // namespace dtrain::store
