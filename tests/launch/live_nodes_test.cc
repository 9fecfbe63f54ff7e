// Live recovery across machines (`dtrain run --live --nnodes N`, issue #48), on network namespaces
// as hosts (scripts/netns-hosts.sh) running live_worker: a worker of one host dies and the
// survivors of both hosts re-form at once; a lone survivor hears of the death from the other
// host's launcher through the store; a host cut off by the network is left out by the majority,
// which goes on, while the cut host stops; and a side that is not a majority (node 0 with the
// store, cut off from the others) stops rather than train on alone.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "launch/launched.h"

namespace dtrain::testing {
namespace {

const std::string kWorker = std::string(DTRAIN_BIN_DIR) + "/live_worker";

std::string dump(const std::vector<Launched*>& launchers) {
  std::string text;
  for (size_t i = 0; i < launchers.size(); ++i)
    text += "--- host " + std::to_string(i) + " stdout:\n" + launchers[i]->out() + "\nstderr:\n" +
            launchers[i]->err() + "\n";
  return text;
}

// `dtrain run --live` of node `node` of `hosts.count`, `per_node` workers each, on its host.
std::unique_ptr<Launched> launch(const NamespaceHosts& hosts, int node, int per_node,
                                 const std::vector<std::string>& worker,
                                 const std::vector<std::string>& flags = {}) {
  std::vector<std::string> args{"run",
                                "-n",
                                std::to_string(per_node),
                                "--nnodes",
                                std::to_string(hosts.count),
                                "--node-rank",
                                std::to_string(node),
                                "--master-addr",
                                hosts.addr(0),
                                "--master-port",
                                "29710",
                                "--live"};
  args.insert(args.end(), flags.begin(), flags.end());
  args.push_back("--");
  args.push_back(kWorker);
  args.insert(args.end(), worker.begin(), worker.end());
  return std::make_unique<Launched>(args, hosts.on(node));
}

// Starts the launchers (node 0's first: it hosts the store) and waits until every worker is in
// the first world.
std::vector<std::unique_ptr<Launched>> start(const NamespaceHosts& hosts, int per_node,
                                             const std::vector<std::string>& worker,
                                             const std::vector<std::string>& flags = {}) {
  std::vector<std::unique_ptr<Launched>> launched;
  for (int node = 0; node < hosts.count; ++node)
    launched.push_back(launch(hosts, node, per_node, worker, flags));
  std::vector<Launched*> all;
  for (auto& l : launched) all.push_back(l.get());
  const int workers = hosts.count * per_node;
  const bool formed = wait_for(
      [&] {
        size_t n = 0;
        for (auto* l : all) n += count_of(l->out(), ": formed, rank ");
        return n == static_cast<size_t>(workers);
      },
      all, seconds(60));
  EXPECT_TRUE(formed) << dump(all);
  return launched;
}

std::vector<Launched*> raw(const std::vector<std::unique_ptr<Launched>>& launched) {
  std::vector<Launched*> all;
  for (auto& l : launched) all.push_back(l.get());
  return all;
}

TEST(LiveNodes, TheSurvivorsOfTwoHostsGoOnWhenAWorkerOfOneDies) {
  NamespaceHosts hosts("lk", 2);
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  // Rank 3 (host 1) dies at step 40: ranks 0 and 1 (host 0) hear of it from host 1's launcher
  // through the store, and all three go on as generation 1.
  auto launched =
      start(hosts, 2, {"--steps", "200", "--step-ms", "20", "--die-rank", "3", "--die-at", "40"});
  auto all = raw(launched);
  for (auto* l : all) EXPECT_EQ(exit_code(l->wait(seconds(90))), 0) << dump(all);
  std::string out;
  for (auto* l : all) out += l->out();
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_TRUE(
        contains(out, "generation 1 rank " + std::to_string(rank) + " of 3 members 0,1,2 lost 3"))
        << dump(all);
  EXPECT_EQ(count_of(out, "DONE steps 200 generation 1 world 3 checked 200"), 3u) << dump(all);
  EXPECT_TRUE(contains(all[1]->err(),
                       "was killed by SIGKILL (Killed); the other workers go on "
                       "without it (--live)"))
      << dump(all);
}

TEST(LiveNodes, TheDeadRanksHostPlacesItsSpareWhichTheMembersOfBothHostsTakeIn) {
  NamespaceHosts hosts("lp", 2);
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  // Each launcher starts a spare. Rank 3 (host 1) dies at step 40: host 1's launcher gives its
  // spare rank 3's place, and the members of both hosts take it in at a step boundary; host 0's
  // spare is not needed.
  auto launched =
      start(hosts, 2, {"--steps", "300", "--step-ms", "20", "--die-rank", "3", "--die-at", "40"},
            {"--spares", "1"});
  auto all = raw(launched);
  for (auto* l : all) EXPECT_EQ(exit_code(l->wait(seconds(90))), 0) << dump(all);
  EXPECT_TRUE(contains(all[1]->err(), ") takes the place of rank 3;")) << dump(all);
  EXPECT_TRUE(contains(all[1]->out(), "[rank 3] replacement 3: rank 3 of 4 in generation 2 from "))
      << dump(all);
  std::string out;
  for (auto* l : all) out += l->out();
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_TRUE(contains(out, "generation 2 rank " + std::to_string(rank) +
                                  " of 4 members 0,1,2,3 joined 3"))
        << dump(all);
  EXPECT_EQ(count_of(out, "DONE steps 300 generation 2 world 4 checked"), 4u) << dump(all);
  EXPECT_TRUE(contains(all[0]->out(), "spare 1: not needed, nothing to do")) << dump(all);
}

TEST(LiveNodes, ALoneSurvivorGoesOnWhenTheDeadRanksLauncherReportsTheDeath) {
  NamespaceHosts hosts("lo", 2);
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  // Rank 1, alone on host 1, dies: rank 0 is one member of two, a majority only of the members
  // not reported ended. Host 1's launcher says so through the store, and rank 0 goes on at
  // once; unheard of, rank 1 would count as cut off, and rank 0 would stop.
  auto launched =
      start(hosts, 1, {"--steps", "200", "--step-ms", "20", "--die-rank", "1", "--die-at", "40"});
  auto all = raw(launched);
  EXPECT_EQ(exit_code(all[0]->wait(seconds(90))), 0) << dump(all);
  // Host 1 lost every worker it had: its launcher fails, naming it, while the job goes on.
  EXPECT_EQ(exit_code(all[1]->wait(seconds(30))), 137) << dump(all);
  EXPECT_TRUE(contains(all[0]->out(), "generation 1 rank 0 of 1 members 0 lost 1")) << dump(all);
  EXPECT_TRUE(contains(all[0]->out(), "DONE steps 200 generation 1 world 1 checked 200"))
      << dump(all);
  EXPECT_TRUE(contains(all[0]->err(), "live world: generation 1 agreed in 0.")) << dump(all);
}

TEST(LiveNodes, TheMajorityGoesOnWithoutACutHostWhichStops) {
  NamespaceHosts hosts("lm", 3);
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  auto launched = start(hosts, 1, {"--steps", "1000", "--step-ms", "20"});
  auto all = raw(launched);
  for (auto* l : all) l->pump(milliseconds(400));  // a few steps in
  ASSERT_TRUE(hosts.cut(2));
  // Ranks 0 and 1 find rank 2 gone when its connections time out, wait the settle time for it
  // and, two of three, go on.
  EXPECT_EQ(exit_code(all[0]->wait(seconds(120))), 0) << dump(all);
  EXPECT_EQ(exit_code(all[1]->wait(seconds(30))), 0) << dump(all);
  EXPECT_NE(exit_code(all[2]->wait(seconds(120))), 0) << dump(all);
  for (int node = 0; node < 2; ++node) {
    EXPECT_TRUE(contains(all[node]->out(),
                         "generation 1 rank " + std::to_string(node) + " of 2 members 0,1 lost 2"))
        << dump(all);
    EXPECT_TRUE(contains(all[node]->out(), "DONE steps 1000 generation 1 world 2")) << dump(all);
  }
  EXPECT_FALSE(contains(all[2]->out(), "DONE")) << dump(all);
}

TEST(LiveNodes, ASideThatIsNotAMajorityStopsRatherThanTrainAlone) {
  NamespaceHosts hosts("ln", 3);
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  auto launched = start(hosts, 1, {"--steps", "1000", "--step-ms", "20"});
  auto all = raw(launched);
  for (auto* l : all) l->pump(milliseconds(400));
  // Host 0 holds the store but only one of three members: it refuses to go on; hosts 1 and 2
  // cannot reach the store and stop too. Nobody trains on alone.
  ASSERT_TRUE(hosts.cut(0));
  for (auto* l : all) EXPECT_NE(exit_code(l->wait(seconds(150))), 0) << dump(all);
  EXPECT_TRUE(contains(all[0]->err(), "no split brain")) << dump(all);
  for (auto* l : all) EXPECT_FALSE(contains(l->out(), "DONE")) << dump(all);
  for (auto* l : all) EXPECT_FALSE(contains(l->out(), "generation 1 rank")) << dump(all);
}

}  // namespace
}  // namespace dtrain::testing
