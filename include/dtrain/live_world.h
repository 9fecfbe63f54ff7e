// Live recovery: a world whose survivors go on when a member dies, without restarting.
//
//   dtrain::LiveWorld world;                     // under `dtrain run --live`
//   auto pg = world.group();
//   ... a step fails with dtrain::PeerFailureError (a peer died):
//   pg = world.reform().group;                   // the survivors, ranked anew
//   ... agree on the state to go on from (the newest step any member finished), redo the step
//   ... at each step boundary:
//   if (auto grown = world.admit_waiting()) pg = grown->group;   // replacements taken in
//   ... bring them the state (as after a re-forming)
//
// A replacement (`dtrain run --live --replace N`) constructs its LiveWorld as any worker does:
// the constructor returns once the members took it in (replacement() is then true, and the
// program takes the state from them first) or ended training without it (too_late()).
//
// The launcher hosts the store and outlives the workers; `dtrain run --live` keeps the others
// running when one dies. Who goes on is LiveMembership's agreement (live_membership.h); the next
// group is made among them, each keeping its order.
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/live_membership.h"
#include "dtrain/process_group.h"

namespace dtrain {

struct LiveWorldOptions {
  // How long survivors wait for a member neither announced nor reported ended by the launcher,
  // and then for the members agreed on to connect the new group: one that does not (it died or
  // stopped after the list was closed) is left out by agreeing again.
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

  // Null for a replacement that came too late.
  std::shared_ptr<ProcessGroup> group() const { return group_; }
  int generation() const { return membership_.generation(); }
  // This process's rank at start: it names the process across generations.
  int original_rank() const { return membership_.original_rank(); }
  // The members of this generation, by their rank at start; member i has rank i.
  const std::vector<int>& members() const { return membership_.members(); }
  // The job's world size when it started (what a program may scale its batch or rate against).
  int size_at_start() const { return membership_.size_at_start(); }

  // Whether this process was started in a dead member's place: it holds no training state yet
  // and takes the members' (they call admit_waiting() at their step boundary).
  bool replacement() const { return membership_.replacement(); }
  // A spare's number (`dtrain run --live --spares K`), 0 otherwise: a spare is a replacement
  // started ahead, whose constructor waited for its place first.
  int spare() const { return membership_.spare(); }
  // For a replacement: training ended before the members took it in; there is nothing to do.
  bool too_late() const { return membership_.too_late(); }

  struct Reformed {
    std::shared_ptr<ProcessGroup> group;
    std::vector<int> lost;    // members of the last generation left out, by rank at start
    std::vector<int> joined;  // replacements taken in, by rank at start
    double seconds = 0;       // the re-forming took
    // This process was left out (it came after the others closed the list: stopped, slow or
    // cut off) and has been taken in again as a newcomer: its state is stale, and it takes the
    // members' as a replacement does (they see it in `joined` of admit_waiting()).
    bool rejoined = false;
  };
  // Collective among the survivors: aborts this generation's group, agrees on who is left and
  // forms the next generation's group among them. A survivor the others left out (it announced
  // itself after they closed the list) returns once they took it in again (`rejoined`). Throws
  // TimeoutError when the survivors do not agree in time, and AbortedError on a survivor left
  // out whom training ended without.
  Reformed reform();
  // Collective among the members, at a step boundary: when members were lost and replacements
  // wait to take their place, the next generation takes them in and its group is formed; the
  // program then brings them the state, as after reform(). Nothing happens, and nothing is sent,
  // while no member is missing; while one is, one member looks for replacements in the store (at
  // most every 100 ms) and broadcasts what it found.
  std::optional<Reformed> admit_waiting();
  // Training is over: replacements still waiting are told so. Any member may call it.
  void close() { membership_.close(); }
  // Whether an error of a step means a peer is gone (or this group was aborted for it): what a
  // live world recovers from. LibTorch's autograd engine rethrows an error of a gradient hook
  // (DDP's, ZeRO's) as its own, with the original message, which names the failure's kind.
  static bool peer_lost(const std::exception& e);
  // The members of this generation the launcher reports ended (by rank at start), waiting up to
  // `wait` for one: whether an error that does not say so was a member's death.
  std::vector<int> ended(std::chrono::milliseconds wait) const { return membership_.ended(wait); }

 private:
  // Forms the group of the membership's newest generation (`next`: this process's place in it;
  // LiveMembership::form agrees again while a member does not come). Fills `formed` (its group,
  // seconds since `start`; the members lost meanwhile are added, and taken out of the joined).
  void form(LiveMembership::Next next, std::chrono::steady_clock::time_point start,
            Reformed& formed);

  LiveWorldOptions options_;
  LiveMembership membership_;
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace dtrain
