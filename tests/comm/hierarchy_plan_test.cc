// plan_hierarchy: how a group splits for the hierarchical collectives, from its ranks' hosts and
// racks alone: by host, else by rack; uniform or uneven parts; in rank order or interleaved; the
// cross groups each rank belongs to; no split where it is not worth it or not allowed.
#include "comm/hierarchy_plan.h"

#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace dtrain::comm {
namespace {

using Parts = std::vector<std::vector<int>>;

TEST(HierarchyPlan, TwoHostsInRankOrder) {
  const std::vector<std::string> hosts = {"a", "a", "b", "b"}, racks(4, "r");
  const HierarchyPlan p = plan_hierarchy(hosts, racks, 3, Split::kHostsOrRacks);
  EXPECT_EQ(p.parts, (Parts{{0, 1}, {2, 3}}));
  EXPECT_EQ(p.level, Topology::Level::kHosts);
  EXPECT_TRUE(p.uniform);
  EXPECT_TRUE(p.in_order);
  EXPECT_FALSE(p.spans_racks);
  EXPECT_EQ(p.per_part, 2);
  EXPECT_EQ(p.part, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(p.index, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(p.my_part, 1);
  EXPECT_EQ(p.my_index, 1);
  EXPECT_EQ(p.cross, (std::vector<int>{1, 3}));
  EXPECT_EQ(p.cross_index, 1);
  EXPECT_EQ(p.racks, 1);
  EXPECT_EQ(p.hosts_per_rack, 2);
}

TEST(HierarchyPlan, InterleavedHostsAreNotInOrder) {
  const std::vector<std::string> hosts = {"a", "b", "a", "b"}, racks(4, "r");
  const HierarchyPlan p = plan_hierarchy(hosts, racks, 2, Split::kHostsOrRacks);
  EXPECT_EQ(p.parts, (Parts{{0, 2}, {1, 3}}));
  EXPECT_FALSE(p.in_order);
  EXPECT_EQ(p.my_part, 0);
  EXPECT_EQ(p.my_index, 1);
  EXPECT_EQ(p.cross, (std::vector<int>{2, 3}));
}

TEST(HierarchyPlan, UnevenHostsCrossByTheirFirstRanks) {
  const std::vector<std::string> hosts = {"a", "a", "a", "b"}, racks(4, "r");
  HierarchyPlan p = plan_hierarchy(hosts, racks, 1, Split::kHostsOrRacks);
  EXPECT_EQ(p.parts, (Parts{{0, 1, 2}, {3}}));
  EXPECT_FALSE(p.uniform);
  EXPECT_EQ(p.per_part, 3);
  EXPECT_TRUE(p.cross.empty()) << "rank 1 leads no part";
  p = plan_hierarchy(hosts, racks, 3, Split::kHostsOrRacks);
  EXPECT_EQ(p.cross, (std::vector<int>{0, 3}));
  EXPECT_EQ(p.cross_index, 0);
}

TEST(HierarchyPlan, OneRankPerHostSplitsByRack) {
  const std::vector<std::string> hosts = {"a", "b", "c", "d"}, racks = {"x", "x", "y", "y"};
  const HierarchyPlan p = plan_hierarchy(hosts, racks, 0, Split::kHostsOrRacks);
  EXPECT_EQ(p.level, Topology::Level::kRacks);
  EXPECT_EQ(p.parts, (Parts{{0, 1}, {2, 3}}));
  EXPECT_TRUE(p.spans_racks);
}

TEST(HierarchyPlan, HostsInRacksAreCountedForTheCrossGroups) {
  const std::vector<std::string> hosts = {"a", "a", "b", "b", "c", "c", "d", "d"};
  const std::vector<std::string> racks = {"x", "x", "x", "x", "y", "y", "y", "y"};
  const HierarchyPlan p = plan_hierarchy(hosts, racks, 5, Split::kHostsOrRacks);
  EXPECT_EQ(p.level, Topology::Level::kHosts);
  EXPECT_EQ(p.parts.size(), 4u);
  EXPECT_EQ(p.racks, 2);
  EXPECT_EQ(p.hosts_per_rack, 2);
  EXPECT_EQ(p.cross, (std::vector<int>{1, 3, 5, 7}));
  // A cross group splits by rack only: its ranks, one per host, in two racks.
  const HierarchyPlan cross =
      plan_hierarchy({"a", "b", "c", "d"}, {"x", "x", "y", "y"}, 2, Split::kRacks);
  EXPECT_EQ(cross.level, Topology::Level::kRacks);
  EXPECT_EQ(cross.parts, (Parts{{0, 1}, {2, 3}}));
}

TEST(HierarchyPlan, NoSplitWhereItIsNotWorthItOrNotAllowed) {
  // One host, one rack: nothing to split.
  HierarchyPlan p = plan_hierarchy({"a", "a", "a"}, {"r", "r", "r"}, 0, Split::kHostsOrRacks);
  EXPECT_TRUE(p.parts.empty());
  // Every rank on its own host and rack: parts of one rank each.
  p = plan_hierarchy({"a", "b", "c"}, {"x", "y", "z"}, 0, Split::kHostsOrRacks);
  EXPECT_TRUE(p.parts.empty());
  EXPECT_TRUE(p.spans_racks);
  // A part itself does not split, but still knows it spans racks.
  p = plan_hierarchy({"a", "a", "b", "b"}, {"x", "x", "y", "y"}, 0, Split::kNone);
  EXPECT_TRUE(p.parts.empty());
  EXPECT_TRUE(p.spans_racks);
  // A split by rack only does not split by host.
  p = plan_hierarchy({"a", "a", "b", "b"}, {"r", "r", "r", "r"}, 0, Split::kRacks);
  EXPECT_TRUE(p.parts.empty());
  EXPECT_TRUE(plan_hierarchy({"a"}, {"r"}, 0, Split::kHostsOrRacks).parts.empty());
}

TEST(HierarchyPlan, EveryRankPlansTheSameAndTheCrossGroupsCoverTheGroup) {
  const std::vector<std::string> hosts = {"b", "a", "b", "a", "c", "c"}, racks(6, "r");
  std::set<int> covered;
  const HierarchyPlan first = plan_hierarchy(hosts, racks, 0, Split::kHostsOrRacks);
  for (int rank = 0; rank < 6; ++rank) {
    const HierarchyPlan p = plan_hierarchy(hosts, racks, rank, Split::kHostsOrRacks);
    EXPECT_EQ(p.parts, first.parts);
    EXPECT_EQ(p.parts[p.my_part][p.my_index], rank);
    EXPECT_EQ(p.cross[p.my_part], rank) << "a rank is in its own cross group";
    covered.insert(p.cross.begin(), p.cross.end());
  }
  EXPECT_EQ(first.parts, (Parts{{0, 2}, {1, 3}, {4, 5}}));
  EXPECT_EQ(covered.size(), 6u);
}

}  // namespace
}  // namespace dtrain::comm
