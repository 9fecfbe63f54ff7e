// The flight recorder: every process keeps its last calls (collectives and point to point, of
// every group) in a ring, always on, so that a job that hangs or fails can say what each rank
// was doing and since when. `dtrain doctor` reads the dumps of all ranks together
// (launch/doctor.h).
//
// Recording costs two atomic increments, two reads of the kernel's coarse clock and a few
// relaxed stores per call: no lock, no allocation, no formatting (docs/performance.md measures
// it on the smallest all-reduce). The coarse clock (CLOCK_MONOTONIC_COARSE, 5 ns against 28 ns
// for the precise one on a VM) ticks every few milliseconds: a record's times are to the tick,
// and sums of many short calls (the beat's inside time) are right on average. The ring holds
// DTRAIN_FLIGHT_RECORDER entries (2,000; 0 turns it off).
//
// A dump, DIR/rank<R>.json with DIR = DTRAIN_FLIGHT_DIR (set by `dtrain run`; else
// $TMPDIR/dtrain-flight), is written when a collective fails or times out, on SIGUSR2 (which
// `dtrain run` sends when it finds the job stuck), and by dump(). It holds the calls, oldest
// first, and the stack of every thread: C++ (common/thread_stacks.h) and, when the process runs
// Python, Python's (faulthandler, registered by the dtrain package).
//
// Under `dtrain run`, DIR/rank<R>.beat is a page the launcher reads while the job runs (see
// FlightBeat): how many calls this rank completed, how many it is in, and the time it spent in
// them, from which it tells a stuck job from a slow rank without asking the workers.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "comm/collective.h"

extern "C" void* dtrain_flight_recorder_v1();

namespace dtrain::comm {

// What one call is. For collectives `call` says it all; for point to point, `call.count` is the
// bytes, `peer` the other rank and `tag` the user's tag. A named call is one of Horovod's
// (src/horovod/coordinator.h): ranks match them by `name` (kept up to 47 bytes), not by number.
struct FlightCall {
  enum class Kind : uint8_t { kCollective, kSend, kRecv, kRecvAny, kNamed };
  Kind kind = Kind::kCollective;
  uint16_t group = 0;  // FlightRecorder::group_id(name)
  uint32_t seq = 0;    // collectives: the group's sequence number; point to point: the n-th
                       // message in this direction between the two ranks (0 = not known yet)
  CollectiveCall call;
  int peer = -1;  // group rank
  int tag = 0;
  const char* algorithm = "";    // static storage (the algorithm table's names)
  const void* caller = nullptr;  // the return address in the code that called dtrain
  std::string_view name;         // kNamed: the tensor's name
};

// The page DIR/rank<R>.beat: written by the worker (atomically, field by field) and read by
// `dtrain run` (launch/hang_monitor.h). Little-endian, 64-bit fields.
struct FlightBeat {
  static constexpr uint64_t kMagic = 0x32746165626c6664;  // "dflbeat2"
  uint64_t magic = kMagic;
  int64_t pid = 0;
  int64_t rank = -1;
  std::atomic<uint64_t> recorded{0};   // calls recorded: the last ticket
  std::atomic<uint64_t> completed{0};  // calls ended (successfully or not)
  std::atomic<int64_t> inside_ns{0};   // total time between a call's start and end
  // Calls this rank is in now.
  int64_t in_calls() const {
    return static_cast<int64_t>(recorded.load(std::memory_order_relaxed) -
                                completed.load(std::memory_order_relaxed));
  }
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// DIR/rank<R>.exit, beside the records: `dtrain run`'s word on how rank R's process ended ("failed
// with exit code 1", "was killed by SIGKILL (Killed)"), written as it is reaped, so that a peer
// whose connection to it closed can say that it failed rather than that it left.
std::string exit_word_path(const std::string& dir, int rank);
// The launcher's word on world rank `rank`'s exit, waiting up to `wait` for it (the launcher
// reaps a process after its connections have closed); "" without a launcher or a word.
std::string launcher_exit_word(int rank, std::chrono::milliseconds wait);

class FlightRecorder {
 public:
  // The process's recorder (never destroyed: threads may record until the process ends).
  static FlightRecorder& global();

  bool enabled() const { return capacity_ > 0; }
  // A small number for the group's name, kept for the life of the process (at group creation).
  // The dump lists every group this process made, whether it called anything in it or not.
  uint16_t group_id(std::string_view name);
  // The group's calls are not recorded: the Horovod coordinator's, whose negotiation runs every
  // millisecond (it records the named calls it serves instead).
  void mute(uint16_t group);
  bool muted(uint16_t group) const {
    return group < muted_.size() && muted_[group].load(std::memory_order_relaxed);
  }
  // This process's rank and world size, from its world group: names the dump and the beat.
  void set_rank(int rank, int world_size);

  // Records a call as enqueued now; returns its ticket (0 when the recorder is off).
  uint64_t record(const FlightCall& call);
  void started(uint64_t ticket);
  // A point-to-point call learns its message number once posted.
  void set_seq(uint64_t ticket, uint32_t seq);
  void ended(uint64_t ticket, bool ok);

  // Writes the dump and returns its path ("" when it could not; the log says why). `reason`:
  // "collective #7 of group world timed out", "SIGUSR2". A failure dumps at most once every few
  // seconds (the ranks' errors cascade); dump() itself always writes.
  std::string dump(std::string_view reason);
  std::string dump_on_failure(std::string_view reason);
  // Where dumps go.
  std::string directory() const;

  // The Python package registers faulthandler for `signal` writing to `fd`: a dump raises it in
  // its own thread to get every Python thread's stack.
  void set_python_stacks(int signal, int fd);

 private:
  FlightRecorder();
  friend void* ::dtrain_flight_recorder_v1();
  struct Slot;
  void start_dump_thread();

  std::mutex groups_mu_;  // guards group_names_: few, added at group creation
  std::vector<std::string> group_names_;
  std::mutex dump_mu_;                           // one dump at a time
  std::array<std::atomic<bool>, 1024> muted_{};  // by group id
  const size_t capacity_;
  Slot* slots_ = nullptr;
  FlightBeat* beat_;  // the mapped page under `dtrain run`, else local_beat_
  FlightBeat local_beat_;
  std::atomic<int> rank_{-1};
  int world_size_ = 0;
  std::atomic<int> python_signal_{0};
  std::atomic<int> python_fd_{-1};
  std::atomic<int64_t> last_failure_dump_ns_{0};
};

}  // namespace dtrain::comm
