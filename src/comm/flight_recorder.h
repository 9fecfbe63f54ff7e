// The flight recorder: every process keeps its last calls (collectives and point to point, of
// every group) in rings, always on, so that a job that hangs or fails can say what each rank
// was doing and since when. `dtrain doctor` reads the dumps of all ranks together
// (launch/doctor.h).
//
// Recording is cheap (docs/performance.md measures it on the smallest all-reduce). A native
// group's collectives are recorded in the entries the group keeps of its calls anyway, for its
// post-mortems (comm/call_history.h), under the lock it numbers them under; every other call
// (point to point, named calls, the collectives of the other backends) into a ring of the
// calling thread's own. Each thread counts in a counter of its own. So a call costs plain stores
// into one cache line, no atomic read-modify-write, no lock of its own, no allocation, no
// formatting, and no clock read of its own for a small call: the time a call was enqueued is the
// clock reading its caller already made for the deadline, and a call of fewer than 16,384
// elements ended at its thread's last reading (common/thread_clock.h), which the call's waits
// made whenever they did not end at their first look, or else at its start (it never waited: it
// took no longer than its own arithmetic). A larger call reads the clock at its end. Each ring,
// and each group's entries, hold DTRAIN_FLIGHT_RECORDER calls (2,000, rounded up to a power of
// two; 0 turns the recorder off).
//
// Python callers are named by their innermost frames of their own (not torch's or dtrain's):
// the bindings through which Python calls hold a PythonSite while they call (PythonSite below).
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
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "comm/call_history.h"
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
  // When it was enqueued, where the caller has read the monotonic clock already (a deadline's
  // start); else the recorder reads it.
  std::chrono::steady_clock::time_point enqueued{};
};

// The page DIR/rank<R>.beat: written by the worker (field by field, each a relaxed atomic store)
// and read by `dtrain run` (launch/hang_monitor.h). Little-endian, 64-bit fields. Each thread
// that records or ends calls counts in a counter of its own, so that counting is a plain store;
// the reader sums them.
struct FlightBeat {
  static constexpr uint64_t kMagic = 0x33746165626c6664;  // "dflbeat3"
  // The page holds 4 KiB. The last counter is shared (atomically) by threads beyond the others.
  static constexpr size_t kCounters = 160;
  struct Counter {
    uint64_t recorded = 0;   // calls recorded by this thread
    uint64_t completed = 0;  // calls ended (successfully or not) by this thread
    uint64_t inside_ns = 0;  // total time between their start and end
  };
  struct Totals {
    uint64_t recorded = 0, completed = 0, inside_ns = 0;
    // Calls this rank is in now.
    int64_t in_calls() const {
      return recorded > completed ? static_cast<int64_t>(recorded - completed) : 0;
    }
  };
  uint64_t magic = kMagic;
  int64_t pid = 0;
  int64_t rank = -1;
  uint64_t counters_used = 0;
  std::array<Counter, kCounters> counters{};

  // The sums over the counters (of a live page, or of a copy the launcher read).
  Totals totals() const;
};
static_assert(sizeof(FlightBeat) <= 4096);

// DIR/rank<R>.exit, beside the records: `dtrain run`'s word on how rank R's process ended ("failed
// with exit code 1", "was killed by SIGKILL (Killed)"), written as it is reaped, so that a peer
// whose connection to it closed can say that it failed rather than that it left.
std::string exit_word_path(const std::string& dir, int rank);
// The launcher's word on world rank `rank`'s exit, waiting up to `wait` for it (the launcher
// reaps a process after its connections have closed); "" without a launcher or a word.
std::string launcher_exit_word(int rank, std::chrono::milliseconds wait);
// Removes the launcher's word on world rank `rank`: a replacement started in a dead rank's place
// (live recovery) does it once its peers no longer count the dead one a member, so that the word
// is not taken for its own.
void forget_launcher_exit_word(int rank);

class FlightRecorder {
 public:
  // The process's recorder (never destroyed: threads may record until the process ends).
  static FlightRecorder& global();

  bool enabled() const { return capacity_ > 0; }
  // A small number for the group's name, kept for the life of the process (at group creation).
  // The dump lists every group this process made, whether it called anything in it or not.
  uint16_t group_id(std::string_view name);
  // The group's calls are not recorded (`muted` false: recorded again): the Horovod
  // coordinator's, whose negotiation runs every millisecond (it records the named calls it serves
  // instead); flight_recorder_bench's, every other block of calls, to weigh the recorder's cost.
  void mute(uint16_t group, bool muted = true);
  bool muted(uint16_t group) const {
    return group < muted_.size() && muted_[group].load(std::memory_order_relaxed);
  }
  // This process's rank and world size, from its world group: names the dump and the beat.
  void set_rank(int rank, int world_size);

  // A native group's collectives. The group keeps its calls in `history()` (made here, so that
  // dumps list its calls, and keep them a while after the group is gone) and records collective
  // #seq by called() under the lock it numbers calls under (an unrecorded call still goes into
  // the history, for the post-mortem), marks it started when it ran queued, and finished.
  std::shared_ptr<CallHistory> history(uint16_t group);
  void called(CallHistory& history, uint16_t group, uint32_t seq, const CollectiveCall& call,
              const char* algorithm, const void* caller,
              std::chrono::steady_clock::time_point enqueued);
  void started(CallHistory& history, uint32_t seq);
  void finished(CallHistory& history, uint32_t seq, bool ok);

  // Any other call: records it as enqueued; returns its ticket (0 when the recorder is off).
  uint64_t record(const FlightCall& call);
  void started(uint64_t ticket);
  // A point-to-point call learns its message number once posted.
  void set_seq(uint64_t ticket, uint32_t seq);
  void ended(uint64_t ticket, bool ok);

  // Where Python calls: the calls the thread records while a PythonSite lives are attributed to
  // it. `site` is an id from python_site(); the bindings through which Python calls make one
  // (python/core/python_site.h), a C++ program never does.
  class PythonSite {
   public:
    explicit PythonSite(uint32_t site);
    ~PythonSite();
    PythonSite(const PythonSite&) = delete;
    PythonSite& operator=(const PythonSite&) = delete;

   private:
    uint32_t previous_;
  };
  // A small number for a Python call site's text ("train.py:42 in step"), kept for the life of
  // the process.
  uint32_t python_site(std::string_view text);

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
  struct Ring;
  struct Thread;
  static Thread& this_thread();
  Thread* attach_thread();
  void detach_thread(Thread* t);
  Ring* ring_of(Thread& t);
  Ring* new_ring(Thread& t);
  Slot* slot_of(uint64_t ticket) const;
  void count(const Thread& t, uint64_t FlightBeat::Counter::*field, uint64_t n);
  void start_dump_thread();

  static constexpr size_t kMaxRings = 1024;  // threads recording at once; more go unrecorded

  std::mutex groups_mu_;  // guards group_names_: few, added at group creation
  std::vector<std::string> group_names_;
  std::mutex sites_mu_;  // guards the sites: added once per call site
  std::unordered_map<std::string, uint32_t> site_ids_;
  std::vector<std::string> site_names_;  // by id - 1
  static thread_local Thread* current_;  // trivial, so that reading it costs a load
  std::mutex threads_mu_;                // guards free_threads_ and ring creation
  std::vector<Thread*> free_threads_;    // of threads that ended: their rings keep their calls
  std::array<std::atomic<Ring*>, kMaxRings> rings_{};
  std::atomic<size_t> ring_count_{0};
  std::mutex histories_mu_;  // guards histories_: changed at group creation
  std::vector<std::pair<uint16_t, std::shared_ptr<CallHistory>>> histories_;  // by group id
  std::mutex dump_mu_;                                                        // one dump at a time
  std::array<std::atomic<bool>, 1024> muted_{};                               // by group id
  const size_t capacity_;
  std::atomic<FlightBeat*> beat_;  // the mapped page under `dtrain run`, else local_beat_
  FlightBeat local_beat_;
  std::atomic<int> rank_{-1};
  int world_size_ = 0;
  std::atomic<int> python_signal_{0};
  std::atomic<int> python_fd_{-1};
  std::atomic<int64_t> last_failure_dump_ns_{0};
};

}  // namespace dtrain::comm
