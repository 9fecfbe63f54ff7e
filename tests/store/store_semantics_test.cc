// The Store contract, checked the same way on every store: TcpStore, FileStore, and PrefixStore
// over each. `peer()` gives a second handle on the same data (another connection, another open of
// the file) so that visibility across clients is tested too.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "store/store_test_util.h"

namespace dtrain::testing {
namespace {

using namespace std::chrono_literals;

enum class Kind { kTcp, kFile, kPrefixTcp, kPrefixFile };

std::string kind_name(const ::testing::TestParamInfo<Kind>& info) {
  switch (info.param) {
    case Kind::kTcp:
      return "Tcp";
    case Kind::kFile:
      return "File";
    case Kind::kPrefixTcp:
      return "PrefixOverTcp";
    case Kind::kPrefixFile:
      return "PrefixOverFile";
  }
  return "Unknown";
}

class StoreSemantics : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    Kind k = GetParam();
    if (k == Kind::kTcp || k == Kind::kPrefixTcp) server_ = start_server();
    store_ = open_store(0);
  }

  // A new handle on the same store, as another rank would have.
  std::shared_ptr<Store> open_store(int rank) {
    std::shared_ptr<Store> base;
    switch (GetParam()) {
      case Kind::kTcp:
      case Kind::kPrefixTcp:
        base = std::make_shared<TcpStore>(client_options(server_->port(), rank));
        break;
      case Kind::kFile:
      case Kind::kPrefixFile:
        base = std::make_shared<FileStore>(dir_.file("store"), 20s);
        break;
    }
    if (GetParam() == Kind::kPrefixTcp || GetParam() == Kind::kPrefixFile)
      return std::make_shared<PrefixStore>("group0", base);
    return base;
  }
  std::shared_ptr<Store> peer() { return open_store(1); }
  bool prefixed() const {
    return GetParam() == Kind::kPrefixTcp || GetParam() == Kind::kPrefixFile;
  }

  TempDir dir_;
  std::unique_ptr<TcpStoreServer> server_;
  std::shared_ptr<Store> store_;
};

TEST_P(StoreSemantics, SetThenGetFromAnotherClient) {
  store_->set("a", std::string_view("hello"));
  auto other = peer();
  EXPECT_EQ(other->get_string("a"), "hello");
  store_->set("a", std::string_view("again"));
  EXPECT_EQ(other->get_string("a"), "again");
  Bytes binary = {0, 1, 0, 255, 0};
  other->set("bin", binary);
  EXPECT_EQ(store_->get("bin"), binary);
  store_->set("empty", Bytes{});
  EXPECT_EQ(other->get("empty"), Bytes{});
  EXPECT_TRUE(other->check({"empty"}));
}

TEST_P(StoreSemantics, GetWaitsForALaterSet) {
  auto other = peer();
  std::jthread setter([&] {
    std::this_thread::sleep_for(100ms);  // so that get has to wait; the assertion holds either way
    other->set("late", std::string_view("value"));
  });
  auto start = Clock::now();
  EXPECT_EQ(store_->get_string("late"), "value");
  EXPECT_LT(Clock::now() - start, 10s);
}

TEST_P(StoreSemantics, AddCountsAndStoresDecimalText) {
  EXPECT_EQ(store_->add("c", 5), 5);
  EXPECT_EQ(store_->add("c", -2), 3);
  EXPECT_EQ(peer()->add("c", 10), 13);
  EXPECT_EQ(store_->get_string("c"), "13");
  EXPECT_EQ(store_->add("c", 0), 13);
  store_->set("text", std::string_view("not a number"));
  try {
    store_->add("text", 1);
    FAIL() << "add to a non-integer value succeeded";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("not a decimal integer"), std::string::npos) << e.what();
  }
  store_->set("big", std::string_view("9223372036854775807"));
  EXPECT_THROW(store_->add("big", 1), InvalidArgumentError);
  EXPECT_EQ(store_->get_string("big"), "9223372036854775807");
}

TEST_P(StoreSemantics, CompareSet) {
  // Missing key, empty expected: created.
  EXPECT_EQ(store_->compare_set("k", {}, to_bytes("first")), to_bytes("first"));
  EXPECT_EQ(store_->get_string("k"), "first");
  // Present, expected matches: swapped.
  EXPECT_EQ(store_->compare_set("k", to_bytes("first"), to_bytes("second")), to_bytes("second"));
  EXPECT_EQ(peer()->get_string("k"), "second");
  // Present, expected does not match: unchanged, current value returned.
  EXPECT_EQ(store_->compare_set("k", to_bytes("first"), to_bytes("third")), to_bytes("second"));
  EXPECT_EQ(store_->get_string("k"), "second");
  // Present, empty expected does not match a non-empty value.
  EXPECT_EQ(store_->compare_set("k", {}, to_bytes("fourth")), to_bytes("second"));
  // Missing key, non-empty expected: nothing to compare with, the key stays missing.
  EXPECT_EQ(store_->compare_set("absent", to_bytes("x"), to_bytes("y")), Bytes{});
  EXPECT_FALSE(store_->check({"absent"}));
  // Present with an empty value, empty expected: matches.
  store_->set("e", Bytes{});
  EXPECT_EQ(store_->compare_set("e", {}, to_bytes("filled")), to_bytes("filled"));
}

TEST_P(StoreSemantics, CheckNeverWaits) {
  EXPECT_TRUE(store_->check({}));
  auto start = Clock::now();
  EXPECT_FALSE(store_->check({"x"}));
  EXPECT_LT(Clock::now() - start, 2s);
  store_->set("x", std::string_view("1"));
  EXPECT_TRUE(store_->check({"x"}));
  EXPECT_FALSE(store_->check({"x", "y"}));
  peer()->set("y", std::string_view("2"));
  EXPECT_TRUE(store_->check({"x", "y"}));
}

TEST_P(StoreSemantics, WaitReturnsOnceKeysExist) {
  store_->set("w1", std::string_view("1"));
  store_->wait({"w1"}, 1s);
  auto other = peer();
  std::jthread setter([&] {
    std::this_thread::sleep_for(50ms);  // so that wait has to block; holds either way
    other->set("w2", std::string_view("2"));
  });
  store_->wait({"w1", "w2"}, 10s);
  EXPECT_TRUE(store_->check({"w2"}));
}

TEST_P(StoreSemantics, WaitTimeoutNamesTheMissingKeys) {
  store_->set("here", std::string_view("1"));
  auto start = Clock::now();
  try {
    store_->wait({"here", "addr/5", "addr/7"}, 300ms);
    FAIL() << "wait for keys nobody sets returned";
  } catch (const TimeoutError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("2 of 3 key(s) still missing: \"" + std::string(prefixed() ? "group0/" : "") +
                     "addr/5\""),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("addr/7"), std::string::npos) << m;
    EXPECT_NE(m.find("of a 0.3 s limit"), std::string::npos) << m;
  }
  auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, 300ms);
  EXPECT_LT(elapsed, 5s);
}

TEST_P(StoreSemantics, GetTimeoutUsesTheStoreTimeout) {
  store_->set_timeout(200ms);
  auto start = Clock::now();
  try {
    store_->get("never/set");
    FAIL() << "get of a key nobody sets returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("never/set"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("get(\"never/set\")"), std::string::npos) << e.what();
  }
  auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, 200ms);
  EXPECT_LT(elapsed, 5s);
  // The store is still usable after a timeout.
  store_->set("after", std::string_view("ok"));
  EXPECT_EQ(store_->get_string("after"), "ok");
}

TEST_P(StoreSemantics, MultiSetAndMultiGet) {
  store_->multi_set({"m1", "m2", "m3"}, {to_bytes("one"), to_bytes("two"), Bytes{}});
  auto values = peer()->multi_get({"m3", "m1", "m2"});
  ASSERT_EQ(values.size(), 3u);
  EXPECT_EQ(values[0], Bytes{});
  EXPECT_EQ(to_text(values[1]), "one");
  EXPECT_EQ(to_text(values[2]), "two");
  EXPECT_TRUE(store_->multi_get({}).empty());
  EXPECT_THROW(store_->multi_set({"a", "b"}, {to_bytes("1")}), InvalidArgumentError);
  EXPECT_FALSE(store_->check({"a"}));
  store_->set_timeout(200ms);
  try {
    store_->multi_get({"m1", "missing"});
    FAIL() << "multi_get with a missing key returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("1 of 2 key(s) still missing"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("missing\""), std::string::npos) << e.what();
  }
}

TEST_P(StoreSemantics, DeleteKey) {
  store_->set("d", std::string_view("x"));
  EXPECT_TRUE(peer()->delete_key("d"));
  EXPECT_FALSE(store_->check({"d"}));
  EXPECT_FALSE(store_->delete_key("d"));
  EXPECT_FALSE(store_->delete_key("never"));
  store_->set("d", std::string_view("back"));
  EXPECT_EQ(store_->get_string("d"), "back");
}

TEST_P(StoreSemantics, NumKeys) {
  EXPECT_EQ(store_->num_keys(), 0);
  store_->set("n1", std::string_view("1"));
  store_->add("n2", 1);
  store_->multi_set({"n3", "n4"}, {to_bytes("3"), to_bytes("4")});
  store_->set("n1", std::string_view("again"));  // overwriting does not add a key
  EXPECT_EQ(store_->num_keys(), 4);
  store_->delete_key("n2");
  EXPECT_EQ(peer()->num_keys(), 3);
}

TEST_P(StoreSemantics, OversizedKeyIsRefused) {
  EXPECT_THROW(store_->set(std::string(70'000, 'k'), std::string_view("v")), InvalidArgumentError);
  EXPECT_THROW(store_->add(std::string(70'000, 'k'), 1), InvalidArgumentError);
  // And the store still works.
  store_->set("ok", std::string_view("v"));
  EXPECT_EQ(store_->get_string("ok"), "v");
}

TEST_P(StoreSemantics, LargeValue) {
  Bytes big(8 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 131 + 7);
  store_->set("big", big);
  EXPECT_EQ(peer()->get("big"), big);
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreSemantics,
                         ::testing::Values(Kind::kTcp, Kind::kFile, Kind::kPrefixTcp,
                                           Kind::kPrefixFile),
                         kind_name);

// PrefixStore specifics: separate namespaces on one base, num_keys over the whole base.
TEST(PrefixStore, GroupsDoNotSeeEachOther) {
  auto server = start_server();
  auto base = std::make_shared<TcpStore>(client_options(server->port()));
  PrefixStore a("a", base), b("b", base);
  a.set("k", std::string_view("from a"));
  b.set("k", std::string_view("from b"));
  EXPECT_EQ(a.get_string("k"), "from a");
  EXPECT_EQ(b.get_string("k"), "from b");
  EXPECT_EQ(base->get_string("a/k"), "from a");
  EXPECT_EQ(base->get_string("b/k"), "from b");
  EXPECT_EQ(a.add("n", 2), 2);
  EXPECT_FALSE(b.check({"n"}));
  base->set("unprefixed", std::string_view("x"));
  EXPECT_EQ(a.num_keys(), 4);  // a/k, b/k, a/n, unprefixed: the whole base, as in c10d
  PrefixStore nested("inner", std::make_shared<PrefixStore>("outer", base));
  nested.set("k", std::string_view("deep"));
  EXPECT_EQ(base->get_string("outer/inner/k"), "deep");
}

TEST(PrefixStore, OwnTimeoutAppliesToGet) {
  auto server = start_server();
  auto base = std::make_shared<TcpStore>(client_options(server->port()));
  base->set_timeout(20s);
  PrefixStore p("p", base);
  EXPECT_EQ(p.timeout(), 20s);
  p.set_timeout(200ms);
  auto start = Clock::now();
  try {
    p.get("missing");
    FAIL() << "get of a missing key returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("p/missing"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, 5s);
}

TEST(PrefixStore, RefusesNoBase) { EXPECT_THROW(PrefixStore("p", nullptr), InvalidArgumentError); }

}  // namespace
}  // namespace dtrain::testing
