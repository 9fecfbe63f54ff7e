// Pipeline schedules as data: for each pipeline rank, the list of actions it runs in one training
// step (forward and backward passes of micro-batches, sends and receives between stages). The
// runners (dtrain::Pipeline in C++, dtrain.pipeline in Python) execute these lists as they are;
// the verifier (verifier.h) runs them offline to prove they end and to measure them.
//
//   auto s = dtrain::pipeline::make_schedule({.name = "1f1b", .ranks = 4, .microbatches = 8});
//   for (const Action& a : s.actions[rank]) ...
//
// A model of `stages()` stages (ranks x virtual_stages) is cut into consecutive pieces; stage s
// lives on rank s % ranks, so a rank with several virtual stages holds every ranks-th piece (the
// interleaved layout of Megatron-LM), unless the schedule places its stages itself (`placement`:
// torch's V-shaped schedules put stages r and 2p-1-r on rank r). Generators are registered by name
// (registry below); each lives in a file of its own that explains how it orders the passes, its
// bubble and its memory.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::pipeline {

enum class Op : uint8_t {
  kForward,         // F: the stage's forward of a micro-batch
  kBackward,        // B: the whole backward (input and weight gradients)
  kBackwardInput,   // B of split schedules: the input gradient only (what the previous stage waits
                    // for)
  kBackwardWeight,  // W: the weight gradient, any time after its kBackwardInput
  kSendActivation,  // the stage's forward output to stage + 1
  kRecvActivation,  // the stage's forward input from stage - 1
  kSendGradient,    // the gradient of the stage's input to stage - 1
  kRecvGradient,    // the gradient of the stage's output from stage + 1
};

// "forward", "backward", "backward_input", ... and back (nullopt-like: false when unknown).
std::string_view to_string(Op op);
bool parse_op(std::string_view text, Op* op);

struct Action {
  Op op;
  int stage;       // the (virtual) stage it belongs to, 0 .. stages()-1
  int microbatch;  // 0 .. microbatches-1
  bool operator==(const Action&) const = default;
};

// "F3 of stage 1", "B3 of stage 1" (also split schedules' input-gradient pass), "W3 of stage 1",
// "send activation 3 from stage 1 to stage 2", "recv gradient 3 of stage 1 from stage 2".
std::string describe(const Action& action);

struct Schedule {
  std::string name;
  int ranks = 1;                             // pipeline ranks (p)
  int virtual_stages = 1;                    // stages per rank (v)
  int microbatches = 1;                      // m
  std::vector<std::vector<Action>> actions;  // actions[r]: rank r's list, in order
  // placement[stage]: the rank holding it, virtual_stages stages each; empty: stage % ranks.
  // Only verified and drawn: dtrain's runners run their own schedules, which leave it empty.
  std::vector<int> placement;

  int stages() const { return ranks * virtual_stages; }
  int rank_of(int stage) const { return placement.empty() ? stage % ranks : placement[stage]; }
  // This rank's stages, in model order (round robin: r, r + p, r + 2p, ...).
  std::vector<int> stages_of(int rank) const;
  // Whether backward is split into input- and weight-gradient passes.
  bool split_backward() const;
};

// The most forward passes (stages x micro-batches) a schedule may have: the verifier keeps a few
// numbers per pass, and no pipeline needs more.
constexpr int64_t kMaxPasses = int64_t{1} << 24;

struct ScheduleOptions {
  std::string name = "1f1b";  // a registered schedule: gpipe, 1f1b, interleaved-1f1b, zb-h1
  int ranks = 2;
  int microbatches = 4;
  int virtual_stages = 1;  // > 1 only for schedules that interleave (interleaved-1f1b)
};

// Builds the schedule; throws InvalidArgumentError naming the option that does not fit (unknown
// name, ranks or micro-batches < 1, virtual stages for a schedule without them).
Schedule make_schedule(const ScheduleOptions& options);

// The registry: one generator per schedule file, registered at static initialisation.
struct ScheduleInfo {
  std::string name;
  std::string summary;       // one line for `dtrain pipeline-plan --help`
  bool interleaved = false;  // takes virtual_stages > 1
  // Fills schedule.actions with the compute passes (F, B, or B and W) of each rank, in order;
  // make_schedule then places the sends and receives around them.
  std::function<void(Schedule&)> order;
};
void register_schedule(ScheduleInfo info);
std::vector<ScheduleInfo> registered_schedules();

// Serialisation (JSON), so a schedule can be written, edited and checked by the verifier:
//   {"schedule": NAME, "ranks": p, "virtual_stages": v, "microbatches": m,
//    "placement": [rank of stage 0, ...] (optional), "actions": [[{"op", "stage", "microbatch"}]]}
// Lists of compute passes only (no send or receive anywhere, as torch's pipelining schedules
// describe themselves) get their transfers placed as make_schedule places them.
std::string to_json(const Schedule& schedule);
Schedule schedule_from_json(std::string_view text);  // InvalidArgumentError on malformed input

}  // namespace dtrain::pipeline
