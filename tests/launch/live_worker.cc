// A worker for the live-recovery tests (live_test.cc runs it under `dtrain run --live`): each
// step all-reduces the step number and every member's rank at start, and checks the sum against
// the members it knows; when a peer dies it re-forms the world (dtrain::LiveWorld) and redoes the
// step, and at each step boundary it takes in replacements (`dtrain run --live --replace N`).
// One rank may SIGKILL itself after some steps (its replacement does not).
//
//   live_worker [--steps N] [--step-ms MS] [--die-rank R --die-at S] [--no-reform 1]
//               [--die-in-reform R] [--late-rank R --late-ms MS] [--spare-start-ms MS]
//
// --no-reform 1 fails on a peer's death instead, as a program without live recovery does.
// --die-in-reform R: rank R at start, when a peer dies, takes part in the agreement on the next
// generation as LiveMembership does (through the store) and SIGKILLs itself once the list is
// closed, before the new group connects: a failure within the re-forming. --late-rank R: rank
// R at start, when a peer dies, waits MS before it re-forms (as a rank stopped or cut off
// meanwhile): the others leave it out, and take it in again at a step boundary with their state.
// --spare-start-ms: a spare takes MS to get ready (as a Python program's imports do) before it
// first needs the world.
// Prints "rank R at start: formed, rank K of W" once the first world formed, "generation G rank
// K of W members M rejoined" (the late rank, once taken in again).
// Prints (every member) "generation G rank K of W members M lost L" after each re-forming,
// "generation G rank K of W members M joined J" after taking in replacements, "replacement R:
// rank K of W in generation G from step S" (a replacement, once taken in) and "DONE steps S
// generation G world W checked C cpus L" at the end (L: the CPUs its threads may run on, e.g.
// "0-1", as the launcher bound them).
#include <sched.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/dtrain.h"
#include "dtrain/live_world.h"
#include "dtrain/store.h"
#include "launch/cpu_binding.h"

namespace {

// "0-3" when every thread of this process may run on CPUs 0 to 3, else "mixed".
std::string cpus_of_this_process() {
  std::string all;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    cpu_set_t set;
    CPU_ZERO(&set);
    const auto tid = static_cast<pid_t>(std::stol(task.path().filename().string()));
    if (::sched_getaffinity(tid, sizeof set, &set) != 0) continue;  // ended meanwhile
    std::vector<int> cpus;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    const std::string these = dtrain::launch::describe_cpus(cpus);
    if (!all.empty() && these != all) return "mixed";
    all = these;
  }
  return all;
}

// Announces this rank for generation `generation` (the keys LiveMembership uses), waits until a
// survivor closes the list, and dies.
[[noreturn]] void die_once_listed(int generation) {
  dtrain::TcpStore store({.host = std::getenv("MASTER_ADDR"),
                          .port = static_cast<uint16_t>(std::atoi(std::getenv("MASTER_PORT")))});
  const std::string self = std::getenv("RANK");
  store.set(fmt::format("dtrain/live/g{}/here/{}", generation, self), dtrain::Bytes{'1'});
  store.wait({fmt::format("dtrain/live/g{}/members", generation)}, std::chrono::seconds(30));
  std::printf("rank %s at start: listed for generation %d, dying before its group connects\n",
              self.c_str(), generation);
  std::fflush(stdout);
  ::raise(SIGKILL);
  std::abort();
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 100, step_ms = 5, die_rank = -1, die_at = -1, no_reform = 0, die_in_reform = -1,
      late_rank = -1, late_ms = 0, spare_start_ms = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (flag == "--steps")
      steps = value;
    else if (flag == "--step-ms")
      step_ms = value;
    else if (flag == "--die-rank")
      die_rank = value;
    else if (flag == "--die-at")
      die_at = value;
    else if (flag == "--no-reform")
      no_reform = value;
    else if (flag == "--die-in-reform")
      die_in_reform = value;
    else if (flag == "--late-rank")
      late_rank = value;
    else if (flag == "--late-ms")
      late_ms = value;
    else if (flag == "--spare-start-ms")
      spare_start_ms = value;
    else {
      std::fprintf(stderr, "live_worker: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  try {
    if (std::getenv("DTRAIN_LIVE_SPARE") != nullptr)
      std::this_thread::sleep_for(std::chrono::milliseconds(spare_start_ms));
    dtrain::LiveWorld world({.settle = std::chrono::milliseconds(3000)});
    if (world.too_late() && world.spare() != 0) {
      std::printf("spare %d: not needed, nothing to do\n", world.spare());
      return 0;
    }
    if (world.too_late()) {
      std::printf("replacement %d: too late, nothing to do\n", world.original_rank());
      return 0;
    }
    auto pg = world.group();
    int checked = 0;
    int step = 0;
    // The step to go on from after the world changed: the newest any member reached (a member
    // whose all-reduce of a step completed before a death went on; a replacement has none).
    auto newest_step = [&] {
      std::vector<int64_t> newest = {step};
      dtrain::AllreduceOptions max;
      max.op = dtrain::ReduceOp::kMax;
      pg->allreduce(dtrain::TensorView::of(newest), max)->wait();
      step = static_cast<int>(newest[0]);
    };
    if (!world.replacement()) {
      std::printf("rank %d at start: formed, rank %d of %d\n", world.original_rank(), pg->rank(),
                  pg->size());
      std::fflush(stdout);
    } else {
      newest_step();
      std::printf("replacement %d: rank %d of %d in generation %d from step %d%s\n",
                  world.original_rank(), pg->rank(), pg->size(), world.generation(), step,
                  world.spare() != 0 ? fmt::format(" (spare {})", world.spare()).c_str() : "");
      std::fflush(stdout);
    }
    while (step < steps) {
      if (world.original_rank() == die_rank && step == die_at && !world.replacement())
        ::raise(SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
      std::vector<int64_t> v = {step, world.original_rank()};
      try {
        if (auto grown = world.admit_waiting()) {
          pg = grown->group;
          newest_step();
          std::printf("generation %d rank %d of %d members %s joined %s\n", world.generation(),
                      pg->rank(), pg->size(),
                      fmt::format("{}", fmt::join(world.members(), ",")).c_str(),
                      fmt::format("{}", fmt::join(grown->joined, ",")).c_str());
          std::fflush(stdout);
          continue;  // the step again, in the new world (as the newcomers start it)
        }
        pg->allreduce(dtrain::TensorView::of(v))->wait();
      } catch (const dtrain::PeerFailureError&) {
        if (no_reform != 0) throw;
        if (world.original_rank() == die_in_reform) die_once_listed(world.generation() + 1);
        if (world.original_rank() == late_rank)
          std::this_thread::sleep_for(std::chrono::milliseconds(late_ms));
        const auto reformed = world.reform();
        pg = reformed.group;
        if (reformed.rejoined) step = 0;  // stale: the members' newest step it is
        newest_step();
        std::printf("generation %d rank %d of %d members %s %s\n", world.generation(), pg->rank(),
                    pg->size(), fmt::format("{}", fmt::join(world.members(), ",")).c_str(),
                    reformed.rejoined
                        ? "rejoined"
                        : fmt::format("lost {}", fmt::join(reformed.lost, ",")).c_str());
        std::fflush(stdout);
        continue;  // the step again, in the new world
      }
      int64_t members = 0;
      for (int m : world.members()) members += m;
      if (v[0] != int64_t{step} * pg->size() || v[1] != members) {
        std::fprintf(stderr,
                     "live_worker: step %d summed to %lld and %lld, expected %lld and %lld\n", step,
                     static_cast<long long>(v[0]), static_cast<long long>(v[1]),
                     static_cast<long long>(step) * pg->size(), static_cast<long long>(members));
        return 1;
      }
      ++checked;
      ++step;
    }
    world.close();
    std::printf("DONE steps %d generation %d world %d checked %d cpus %s\n", steps,
                world.generation(), pg->size(), checked, cpus_of_this_process().c_str());
    pg->barrier()->wait();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "live_worker: %s\n", e.what());
    return 1;
  }
}
