// TF_CONFIG for `dtrain run --tf-config` (src/launch/tf_config.h): every task's role and index,
// one cluster for all, a distinct port each, and the ports free to bind.
#include "launch/tf_config.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "common/socket.h"

namespace dtrain::launch {
namespace {

TEST(TfConfig, WorkersOnlyAreMultiWorkerMirroredStrategysCluster) {
  const TfConfigs c = tf_configs("127.0.0.1", 3, 0);
  ASSERT_EQ(c.workers.size(), 3u);
  EXPECT_TRUE(c.servers.empty());
  for (int r = 0; r < 3; ++r) {
    const auto j = nlohmann::json::parse(c.workers[r]);
    EXPECT_EQ(j["task"]["type"], "worker");
    EXPECT_EQ(j["task"]["index"], r);
    EXPECT_EQ(j["cluster"], nlohmann::json::parse(c.workers[0])["cluster"]);
    EXPECT_FALSE(j["cluster"].contains("chief"));
  }
}

TEST(TfConfig, WithServersRankZeroIsTheChiefAndTheServersPsTasks) {
  const TfConfigs c = tf_configs("127.0.0.1", 3, 2);
  const auto chief = nlohmann::json::parse(c.workers[0]);
  EXPECT_EQ(chief["task"]["type"], "chief");
  EXPECT_EQ(chief["task"]["index"], 0);
  EXPECT_EQ(nlohmann::json::parse(c.workers[2])["task"]["index"], 1);  // worker 1
  EXPECT_EQ(nlohmann::json::parse(c.servers[1])["task"]["type"], "ps");
  EXPECT_EQ(nlohmann::json::parse(c.servers[1])["task"]["index"], 1);
  const auto& cluster = chief["cluster"];
  EXPECT_EQ(cluster["chief"].size(), 1u);
  EXPECT_EQ(cluster["worker"].size(), 2u);
  EXPECT_EQ(cluster["ps"].size(), 2u);
  // Five tasks, five ports, each free to listen on.
  std::set<std::string> addresses;
  for (const auto& [type, list] : cluster.items())
    for (const auto& a : list) addresses.insert(a.get<std::string>());
  EXPECT_EQ(addresses.size(), 5u);
  for (const auto& a : addresses) {
    const auto hp = net::parse_host_port(a, "test");
    EXPECT_NO_THROW(net::listen_tcp(hp.host, hp.port)) << a;
  }
}

}  // namespace
}  // namespace dtrain::launch
