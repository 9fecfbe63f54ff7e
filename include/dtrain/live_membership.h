// Who is still in a live job: the survivors' agreement on the next generation's members, through
// the store the launcher hosts (`dtrain run --live`).
//
// After a failure every survivor announces itself for the next generation and waits until each
// member of the last one has either announced itself or been reported ended by the launcher
// (DTRAIN_FLIGHT_DIR), or until `settle` has passed (a stopped or stuck member is then left out).
// The first survivor to close the list decides it for all (compare-and-set); the members keep
// their order (their rank at start), so member i of a generation has rank i in it. A survivor
// that announces itself after the list closed (it was stopped, slow or cut off meanwhile) is
// refused: its state is stale. It asks to be taken in again as a replacement does, and takes
// the members' state.
//
// A job on several nodes (`dtrain run --live --nnodes N`: GROUP_WORLD_SIZE above 1) hears of
// deaths on other nodes from their launchers through the store (publish_ended), and closes a
// list only with a quorum: the members here must be more than half of those not reported
// ended. A side cut off from the others by a network partition then stops rather than train on
// alone: without the store it cannot agree at all, and with it but without a majority it refuses
// to (no split brain).
//
// A replacement (`dtrain run --live --replace N` starts one in a dead member's place, with its
// rank at start) waits until the members have left its predecessor out, then asks to be taken
// in. The members look for such requests at a step boundary (waiting(), asked by one member and
// told to the others) and admit() them together: the next generation is theirs and the
// newcomers', each again in its place by rank at start.
//
// A spare (`dtrain run --live --spares K` starts K ahead of any failure, with no rank of their
// own) waits in the constructor until its launcher gives it a dead member's rank, then asks to be
// taken in as a replacement does: the members take it in at their next step boundary, without
// waiting for a process to start.
//
// LiveWorld forms dtrain's group for each generation on it; Python's hvd.elastic forms torch's
// (dtrain.torch re-initializes torch.distributed with the rank and size it returns).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/store.h"

namespace dtrain {

struct LiveMembershipOptions {
  // How long survivors wait for a member neither announced nor reported ended by the launcher.
  std::chrono::milliseconds settle{5000};
  // The whole agreement, store calls included.
  std::chrono::milliseconds timeout{60000};
  // Of the job's store (as ProcessGroupOptions has them).
  std::string job_id;
  std::string token;
};

class LiveMembership {
 public:
  // Generation 0: every rank of the job's world (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
  // A replacement (DTRAIN_LIVE_REPLACEMENT=1) returns once the members took it in, or once they
  // ended training without it (too_late()); TimeoutError when neither happens within `timeout`
  // of its asking. A spare (DTRAIN_LIVE_SPARE) first waits, as long as training lasts, for its
  // place (it then sets RANK and LOCAL_RANK to the place's, for whatever reads them later).
  // Throws InvalidArgumentError when the launcher does not host the store (the store must
  // outlive any worker: run under `dtrain run --live`).
  explicit LiveMembership(LiveMembershipOptions options = {});

  int generation() const { return generation_; }
  // This process's rank at start: it names the process across generations.
  int original_rank() const { return original_rank_; }
  // This process's rank in this generation.
  int rank() const;
  // The members of this generation, by their rank at start; member i has rank i.
  const std::vector<int>& members() const { return members_; }
  // Whether this process was started in a dead member's place; it then holds no training state
  // yet and must receive it from the members it joined.
  bool replacement() const { return replacement_; }
  // A spare's number (DTRAIN_LIVE_SPARE), 0 for a process started with a rank of its own.
  int spare() const { return spare_; }
  // For a replacement: the members ended training before taking it in (nothing is left to do).
  bool too_late() const { return too_late_; }
  int size_at_start() const { return world_size_; }
  // The ranks at start that this generation lacks.
  std::vector<int> missing() const;
  // Of the missing ranks, those whose replacement asks to be taken in (store lookups: one
  // member asks and tells the others). It looks at most every 100 ms; [] in between.
  std::vector<int> waiting();
  // No more newcomers: training is over, and replacements still waiting are told so. Any
  // member may call it.
  void close();
  // The launcher's store, where each generation's group meets (under its own prefix).
  const std::shared_ptr<Store>& store() const { return store_; }

  // The members of this generation the launcher reports ended (by rank at start), waiting up to
  // `wait` for one: whether an error a collective raised was a member's death.
  std::vector<int> ended(std::chrono::milliseconds wait) const;
  // For the launchers of a job on several nodes: says in the job's store how the worker of
  // rank `rank` (at start) ended, for the members on every node.
  static void publish_ended(Store& store, int rank, const std::string& how);

  struct Next {
    int rank = 0;           // this process's rank in the new generation
    int size = 0;           // its members
    std::vector<int> lost;  // members of the last generation left out, by rank at start
    double seconds = 0;     // the agreement took
    // This process was left out (it announced itself after the others closed the list) and has
    // been taken in again by a later generation, as a newcomer: its training state is stale,
    // and it takes the members' as a replacement does.
    bool rejoined = false;
  };
  // Collective among the survivors: agrees on who is left and moves to the next generation. A
  // survivor the others left out waits until they take it in again (at a step boundary, as a
  // replacement). Throws TimeoutError when the survivors do not agree in time, AbortedError
  // on a survivor left out whom training ended without, and StoreError when the store is gone.
  Next next();
  // Collective among the members, each with the same `joiners` (from waiting()): the next
  // generation is this one's members and the joiners. Throws AbortedError when a re-forming
  // after a failure took that generation first.
  Next admit(const std::vector<int>& joiners);

  struct Formed {
    Next place;             // where this process ended: its rank and the size
    std::vector<int> lost;  // members left out meanwhile, by rank at start
    bool rejoined = false;  // this process was left out and taken in again meanwhile
  };
  // Forms the group of the newest generation, this process at `place`: `make(place)` forms it
  // (LiveWorld: dtrain's group; Python: torch.distributed's world). A later generation's
  // members announced themselves a moment before, so make() connects within the settle time;
  // when it throws (a member died or stopped after the list closed), the survivors agree again
  // (next()) and make() is called at the new place. Each time round leaves a member out, or
  // gives up rethrowing make()'s error when everyone came again.
  Formed form(Next place, const std::function<void(const Next&)>& make);

 private:
  Next agree_next();  // next(), whose store errors it explains
  // Asks to be taken in and waits for it, as a replacement (or a survivor left out) does.
  void join();
  // A spare's wait for its place; false when training ended first (too_late_ is then set).
  bool take_place();
  // Whether a launcher said that member `m` ended: this node's (its file in DTRAIN_FLIGHT_DIR)
  // or, on several nodes, any node's (the store).
  bool reported_ended(int m) const;
  Next rejoin(int generation, const std::vector<int>& agreed,
              std::chrono::steady_clock::time_point start);
  LiveMembershipOptions options_;
  std::shared_ptr<Store> store_;
  std::vector<int> members_;
  int original_rank_ = 0;
  int world_size_ = 0;  // at start
  int generation_ = 0;
  bool replacement_ = false;
  int spare_ = 0;
  bool too_late_ = false;
  bool several_nodes_ = false;  // deaths are also told through the store; lists need a quorum
  std::chrono::steady_clock::time_point next_look_{};  // waiting()'s
};

}  // namespace dtrain
