// Live recovery: a world whose survivors go on when a member dies, without restarting.
//
//   dtrain::LiveWorld world;                     // under `dtrain run --live`
//   auto pg = world.group();
//   ... a step fails with dtrain::PeerFailureError (a peer died):
//   pg = world.reform().group;                   // the survivors, ranked anew
//   ... agree on the state to go on from (the newest step any member finished), redo the step
//
// The launcher hosts the store and outlives the workers; `dtrain run --live` keeps the others
// running when one dies. Who goes on is LiveMembership's agreement (live_membership.h); the next
// group is made among them, each keeping its order.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/live_membership.h"
#include "dtrain/process_group.h"

namespace dtrain {

struct LiveWorldOptions {
  // How long survivors wait for a member neither announced nor reported ended by the launcher.
  std::chrono::milliseconds settle{5000};
  // The whole re-forming, store calls and the new group's connections included.
  std::chrono::milliseconds timeout{60000};
  ProcessGroupOptions group;  // of each generation's group (its name gets "-g<N>" after the first)
};

class LiveWorld {
 public:
  // The job's world from the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), as
  // generation 0. Throws InvalidArgumentError when the launcher does not host the store (the
  // store must outlive any worker: run under `dtrain run --live`).
  explicit LiveWorld(LiveWorldOptions options = {});

  std::shared_ptr<ProcessGroup> group() const { return group_; }
  int generation() const { return membership_.generation(); }
  // This process's rank at start: it names the process across generations.
  int original_rank() const { return membership_.original_rank(); }
  // The members of this generation, by their rank at start; member i has rank i.
  const std::vector<int>& members() const { return membership_.members(); }

  struct Reformed {
    std::shared_ptr<ProcessGroup> group;
    std::vector<int> lost;  // members of the last generation left out, by rank at start
    double seconds = 0;     // the re-forming took
  };
  // Collective among the survivors: aborts this generation's group, agrees on who is left and
  // forms the next generation's group among them. Throws TimeoutError when the survivors do not
  // agree in time, and AbortedError on a survivor the others left out (it announced itself after
  // they closed the list).
  Reformed reform();

 private:
  LiveWorldOptions options_;
  LiveMembership membership_;
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace dtrain
