#include "comm/flight_recorder.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/durable.h"
#include "common/env.h"
#include "common/log.h"
#include "common/thread_clock.h"
#include "common/thread_stacks.h"

namespace dtrain::comm {
namespace {

int64_t ns_of(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// A call of this many elements or more reads the clock at its end; a smaller one takes its
// thread's last reading (see the header).
constexpr uint64_t kTimedEndCount = 16384;

// A ring's entries keep their state as a group's history does.
using State = CallHistory::State;

std::string_view state_name(uint8_t s) {
  switch (static_cast<State>(s)) {
    case State::kQueued:
      return "queued";
    case State::kRunning:
      return "running";
    case State::kCompleted:
      return "completed";
    case State::kFailed:
      return "failed";
    case State::kUnrecorded:
      break;
  }
  return "unknown";
}

std::string_view kind_name(FlightCall::Kind k) {
  switch (k) {
    case FlightCall::Kind::kCollective:
      return "collective";
    case FlightCall::Kind::kSend:
      return "send";
    case FlightCall::Kind::kRecv:
      return "recv";
    case FlightCall::Kind::kRecvAny:
      return "recv_any";
    case FlightCall::Kind::kNamed:
      return "named";
  }
  return "unknown";
}

// SIGUSR2 wakes the dump thread through this pipe (write(2) is async-signal-safe).
int wake_fd = -1;
void on_dump_signal(int) {
  const int saved = errno;
  const char byte = 1;
  [[maybe_unused]] auto n = ::write(wake_fd, &byte, 1);
  errno = saved;
}

}  // namespace

// One entry, a cache line: recording a call writes one line. What few calls need lives beside the
// slots (Ring).
struct alignas(64) FlightRecorder::Slot {
  // Seqlock: 0 while the recording thread fills the slot, then the ticket (release).
  std::atomic<uint64_t> ticket{0};
  // kind, collective, dtype, op, state (a byte each), the group in the top 16 bits (What)
  std::atomic<uint64_t> what{0};
  std::atomic<uint32_t> seq{0}, site{0};
  std::atomic<int32_t> peer{-1};  // a collective's root
  std::atomic<int32_t> tag{0};
  std::atomic<uint64_t> count{0};
  std::atomic<const void*> caller{nullptr};
  std::atomic<int64_t> enqueued_ns{0};
  // Microseconds after enqueued_ns, plus one; 0 until it happens.
  std::atomic<uint32_t> started_us{0}, ended_us{0};
};

// One thread's ring: only that thread records into it (others mark its calls started and ended),
// so the entry's number is a plain counter. A ticket is the ring's index + 1 above the entry's
// number. Alone in its cache lines, as Thread is: a line shared with what other threads write
// would make every record wait for it.
struct alignas(64) FlightRecorder::Ring {
  using Name = std::array<std::atomic<uint64_t>, 6>;  // up to 47 bytes, NUL-terminated
  Ring(uint32_t index, size_t capacity)
      : index(index),
        mask(capacity - 1),
        slots(std::make_unique<Slot[]>(capacity)),
        algorithms(std::make_unique<std::atomic<const char*>[]>(capacity)) {}
  const uint32_t index;
  const uint64_t mask;  // the capacity is a power of two: a slot is a mask away, not a division
  std::atomic<uint64_t> last{0};  // the newest entry's number
  std::unique_ptr<Slot[]> slots;
  std::unique_ptr<std::atomic<const char*>[]> algorithms;  // collectives'
  std::atomic<Name*> names{nullptr};                       // named calls' (made by the first)
  // The threads that recorded here: (first entry, tid), guarded by threads_mu_.
  std::vector<std::pair<uint64_t, int>> owners;
};
constexpr int kTicketShift = 40;

// A thread that records or ends calls: its ring (made on its first record) and its counter in the
// beat. When the thread ends, the next new thread takes both over: the ring keeps its calls.
struct alignas(64) FlightRecorder::Thread {
  Ring* ring = nullptr;
  uint32_t counter = 0;
  bool shared_counter = false;  // beyond the beat's own counters: counts atomically
  int tid = 0;
  uint32_t site = 0;  // the PythonSite the thread is in
  // The thread's newest call: a synchronous call ends on the thread that recorded it, which then
  // finds its slot without looking it up.
  uint64_t last_ticket = 0;
  Slot* last_slot = nullptr;
};

}  // namespace dtrain::comm

// Each Python extension of dtrain (dtrain._core, dtrain._torch, dtrain._tensorflow) holds its
// own copy of this code, loaded privately (RTLD_LOCAL): one process must still have one
// recorder. Every copy exports this function; the first loaded object that has it makes the
// recorder, and every copy finds that one through the loader. Versioned, since a copy of
// another layout must not share it.
extern "C" __attribute__((visibility("default"))) void* dtrain_flight_recorder_v1() {
  static auto* recorder = new dtrain::comm::FlightRecorder();
  return recorder;
}

namespace dtrain::comm {
namespace {

using RecorderFn = void* (*)();

int find_first_copy(dl_phdr_info* info, size_t, void* out) {
  if (info->dlpi_name == nullptr) return 0;
  void* handle =
      dlopen(info->dlpi_name[0] == '\0' ? nullptr : info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return 0;
  void* fn = dlsym(handle, "dtrain_flight_recorder_v1");
  dlclose(handle);
  if (fn == nullptr) return 0;
  *static_cast<RecorderFn*>(out) = reinterpret_cast<RecorderFn>(fn);
  return 1;  // the first in load order
}

}  // namespace

FlightRecorder& FlightRecorder::global() {
  static FlightRecorder* const recorder = [] {
    RecorderFn first = nullptr;
    dl_iterate_phdr(find_first_copy, &first);
    if (first == nullptr) first = &dtrain_flight_recorder_v1;
    return static_cast<FlightRecorder*>(first());
  }();
  return *recorder;
}

thread_local FlightRecorder::Thread* FlightRecorder::current_ = nullptr;

FlightRecorder::FlightRecorder()
    : capacity_([] {
        const int64_t n = env::get_int(env::kFlightRecorder).value_or(2000);
        return n <= 0 ? size_t{0} : std::bit_ceil(static_cast<size_t>(n));
      }()),
      beat_(&local_beat_) {
  local_beat_.pid = getpid();
  start_dump_thread();
}

FlightBeat::Totals FlightBeat::totals() const {
  Totals t;
  constexpr auto r = std::memory_order_relaxed;
  // Ended before recorded: a call ended between the two reads is counted in neither.
  for (const Counter& c : counters)
    t.completed += std::atomic_ref(const_cast<uint64_t&>(c.completed)).load(r);
  for (const Counter& c : counters) {
    t.recorded += std::atomic_ref(const_cast<uint64_t&>(c.recorded)).load(r);
    t.inside_ns += std::atomic_ref(const_cast<uint64_t&>(c.inside_ns)).load(r);
  }
  return t;
}

// The hot paths' helpers are inlined (private: used by this file only).
[[gnu::always_inline]] inline FlightRecorder::Thread& FlightRecorder::this_thread() {
  Thread* t = current_;
  if (t == nullptr) [[unlikely]]
    t = global().attach_thread();
  return *t;
}

[[gnu::noinline]] FlightRecorder::Thread* FlightRecorder::attach_thread() {
  // Gives the thread's Thread back when the thread ends (constructed on the first attach).
  struct Detach {
    FlightRecorder* recorder;
    ~Detach() {
      if (current_ != nullptr) recorder->detach_thread(current_);
      current_ = nullptr;
    }
  };
  thread_local Detach detach{this};
  Thread* t;
  {
    std::lock_guard lock(threads_mu_);
    if (!free_threads_.empty()) {
      t = free_threads_.back();
      free_threads_.pop_back();
    } else {
      t = new Thread();
      const uint64_t n = std::atomic_ref(beat_.load()->counters_used).fetch_add(1);
      t->counter = static_cast<uint32_t>(std::min<uint64_t>(n, FlightBeat::kCounters - 1));
      t->shared_counter = n >= FlightBeat::kCounters - 1;
    }
  }
  t->tid = static_cast<int>(syscall(SYS_gettid));
  t->site = 0;
  if (t->ring != nullptr) {
    std::lock_guard lock(threads_mu_);
    t->ring->owners.emplace_back(t->ring->last.load() + 1, t->tid);
  }
  current_ = t;
  return t;
}

void FlightRecorder::detach_thread(Thread* t) {
  std::lock_guard lock(threads_mu_);
  free_threads_.push_back(t);
}

[[gnu::always_inline]] inline FlightRecorder::Ring* FlightRecorder::ring_of(Thread& t) {
  if (t.ring != nullptr) [[likely]]
    return t.ring;
  return new_ring(t);
}

[[gnu::noinline]] FlightRecorder::Ring* FlightRecorder::new_ring(Thread& t) {
  std::lock_guard lock(threads_mu_);
  const size_t index = ring_count_.load();
  if (index >= kMaxRings) return nullptr;  // this thread's calls go unrecorded
  t.ring = new Ring(static_cast<uint32_t>(index), capacity_);
  t.ring->owners.emplace_back(1, t.tid);
  rings_[index].store(t.ring, std::memory_order_release);
  ring_count_.store(index + 1, std::memory_order_release);
  return t.ring;
}

[[gnu::always_inline]] inline FlightRecorder::Slot* FlightRecorder::slot_of(uint64_t ticket) const {
  const uint64_t ring = (ticket >> kTicketShift) - 1;
  if (ring >= kMaxRings) return nullptr;
  const Ring* r = rings_[ring].load(std::memory_order_acquire);
  if (r == nullptr) return nullptr;
  Slot& s = r->slots[ticket & r->mask];
  // Overwritten since: a call older than the ring.
  return s.ticket.load(std::memory_order_relaxed) == ticket ? &s : nullptr;
}

[[gnu::always_inline]] inline void FlightRecorder::count(const Thread& t,
                                                         uint64_t FlightBeat::Counter::*field,
                                                         uint64_t n) {
  std::atomic_ref c(beat_.load(std::memory_order_relaxed)->counters[t.counter].*field);
  if (t.shared_counter)
    c.fetch_add(n, std::memory_order_relaxed);
  else
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

void FlightRecorder::start_dump_thread() {
  struct sigaction current {};
  sigaction(SIGUSR2, nullptr, &current);
  // A program that handles SIGUSR2 itself keeps it; dump() is still there to call.
  if (current.sa_handler != SIG_DFL || (current.sa_flags & SA_SIGINFO)) return;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return;
  wake_fd = fds[1];
  std::thread([read_fd = fds[0], this] {
    char byte;
    while (true) {
      const ssize_t n = ::read(read_fd, &byte, 1);
      if (n == 1) {
        dump("SIGUSR2");
      } else if (n < 0 && errno != EINTR) {
        return;
      }
    }
  }).detach();
  struct sigaction sa {};
  sa.sa_handler = on_dump_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR2, &sa, nullptr);
}

uint16_t FlightRecorder::group_id(std::string_view name) {
  std::lock_guard lock(groups_mu_);
  for (size_t i = 0; i < group_names_.size(); ++i)
    if (group_names_[i] == name) return static_cast<uint16_t>(i);
  if (group_names_.size() >= 0xffff) return 0xffff;  // "(unknown)"
  group_names_.emplace_back(name);
  return static_cast<uint16_t>(group_names_.size() - 1);
}

void FlightRecorder::set_rank(int rank, int world_size) {
  int expected = -1;
  if (!rank_.compare_exchange_strong(expected, rank)) return;  // the first world group names it
  world_size_ = world_size;
  local_beat_.rank = rank;
  const std::string dir = env::get_string(env::kFlightDir);
  if (dir.empty()) return;  // no launcher to read a beat
  const std::string path = fmt::format("{}/rank{}.beat", dir, rank);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || ::ftruncate(fd, sizeof(FlightBeat)) != 0) {
    DTRAIN_LOG_WARN(
        "flight recorder: cannot create {}: {} (dtrain run will not see this rank's "
        "progress)",
        path, durable::errno_text(errno));
    if (fd >= 0) ::close(fd);
    return;
  }
  void* page = ::mmap(nullptr, sizeof(FlightBeat), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (page == MAP_FAILED) return;
  auto* beat = new (page) FlightBeat(local_beat_);
  beat->pid = getpid();
  beat->rank = rank;
  beat_.store(beat);  // set before this process's world group makes its first call
}

void FlightRecorder::mute(uint16_t group, bool muted) {
  if (group < muted_.size()) muted_[group].store(muted);
}

namespace {

// Where each field of Slot::what sits (its shift).
enum class What : int {
  kKind = 0,
  kCollective = 8,
  kDtype = 16,
  kOp = 24,
  kState = 32,
  kGroup = 48,  // 16 bits
};
uint64_t what_field(uint64_t what, What f) { return (what >> static_cast<int>(f)) & 0xff; }
uint64_t with_state(uint64_t what, State state) {
  constexpr uint64_t kMask = uint64_t{0xff} << static_cast<int>(What::kState);
  return (what & ~kMask) | static_cast<uint64_t>(state) << static_cast<int>(What::kState);
}
// Microseconds after `since`, plus one (0 means "not yet").
uint32_t micros_after(int64_t since, int64_t now) {
  const int64_t us = now > since ? (now - since) / 1000 : 0;
  return static_cast<uint32_t>(std::min<int64_t>(us, UINT32_MAX - 1) + 1);
}
// When a call of `count` elements, enqueued at `enqueued` and started `started_us` after it (0:
// when enqueued), ended now (see the header); and when it started.
struct Span {
  int64_t since, end;
};
Span ending_now(int64_t enqueued, uint32_t started_us, uint64_t count) {
  const int64_t since = started_us == 0 ? enqueued : enqueued + int64_t{started_us - 1} * 1000;
  return {since, count >= kTimedEndCount ? ns_of(thread_clock::now())
                                         : std::max(since, ns_of(thread_clock::last()))};
}

}  // namespace

uint64_t FlightRecorder::record(const FlightCall& call) {
  static_assert(sizeof(Slot) == 64);
  if (capacity_ == 0 || muted(call.group)) return 0;
  Thread& t = this_thread();
  Ring* ring = ring_of(t);
  if (ring == nullptr) return 0;
  const uint64_t n = ring->last.load(std::memory_order_relaxed) + 1;
  const uint64_t ticket = (uint64_t{ring->index + 1} << kTicketShift) | n;
  Slot& s = ring->slots[n & ring->mask];
  constexpr auto r = std::memory_order_relaxed;
  s.ticket.store(0, r);
  std::atomic_thread_fence(std::memory_order_release);
  s.what.store(static_cast<uint64_t>(call.kind) |
                   static_cast<uint64_t>(call.call.kind) << static_cast<int>(What::kCollective) |
                   static_cast<uint64_t>(call.call.dtype) << static_cast<int>(What::kDtype) |
                   static_cast<uint64_t>(call.call.op) << static_cast<int>(What::kOp) |
                   uint64_t{call.group} << static_cast<int>(What::kGroup),
               r);  // the state: queued (0)
  s.seq.store(call.seq, r);
  s.site.store(t.site, r);
  s.peer.store(call.kind == FlightCall::Kind::kCollective ? call.call.root : call.peer, r);
  s.tag.store(call.tag, r);
  s.count.store(call.call.count, r);
  s.caller.store(call.caller, r);
  s.enqueued_ns.store(
      ns_of(call.enqueued == Clock::time_point{} ? thread_clock::now() : call.enqueued), r);
  s.started_us.store(0, r);
  s.ended_us.store(0, r);
  if (call.kind == FlightCall::Kind::kCollective) {
    ring->algorithms[n & ring->mask].store(call.algorithm, r);
  } else if (call.kind == FlightCall::Kind::kNamed) {
    Ring::Name* names = ring->names.load(std::memory_order_acquire);
    if (names == nullptr) {
      names = new Ring::Name[ring->mask + 1];
      ring->names.store(names, std::memory_order_release);
    }
    std::array<char, sizeof(Ring::Name)> text{};
    std::memcpy(text.data(), call.name.data(), std::min(call.name.size(), text.size() - 1));
    for (size_t i = 0; i < text.size() / 8; ++i) {
      uint64_t word;
      std::memcpy(&word, text.data() + i * 8, 8);
      names[n & ring->mask][i].store(word, r);
    }
  }
  s.ticket.store(ticket, std::memory_order_release);
  ring->last.store(n, std::memory_order_release);
  t.last_ticket = ticket;
  t.last_slot = &s;
  count(t, &FlightBeat::Counter::recorded, 1);
  return ticket;
}

void FlightRecorder::started(uint64_t ticket) {
  if (ticket == 0) return;
  Slot* s = slot_of(ticket);
  if (s == nullptr) return;
  constexpr auto r = std::memory_order_relaxed;
  // The starting thread's last reading, when it is later than the enqueue: it read it finishing
  // what it ran before, which is when it turned to this call.
  const int64_t enqueued = s->enqueued_ns.load(r);
  s->started_us.store(micros_after(enqueued, std::max(enqueued, ns_of(thread_clock::last()))), r);
  s->what.store(with_state(s->what.load(r), State::kRunning), r);
}

void FlightRecorder::set_seq(uint64_t ticket, uint32_t seq) {
  if (ticket == 0) return;
  if (Slot* s = slot_of(ticket)) s->seq.store(seq, std::memory_order_relaxed);
}

void FlightRecorder::ended(uint64_t ticket, bool ok) {
  if (ticket == 0) return;
  constexpr auto r = std::memory_order_relaxed;
  const Thread& t = this_thread();
  count(t, &FlightBeat::Counter::completed, 1);
  Slot* s = ticket == t.last_ticket ? t.last_slot : slot_of(ticket);
  if (s == nullptr) return;  // older than the ring: its start is not known
  const int64_t enqueued = s->enqueued_ns.load(r);
  const Span span = ending_now(enqueued, s->started_us.load(r), s->count.load(r));
  s->ended_us.store(micros_after(enqueued, span.end), r);
  s->what.store(with_state(s->what.load(r), ok ? State::kCompleted : State::kFailed), r);
  if (span.end > span.since)
    count(t, &FlightBeat::Counter::inside_ns, static_cast<uint64_t>(span.end - span.since));
}

std::shared_ptr<CallHistory> FlightRecorder::history(uint16_t group) {
  auto history = std::make_shared<CallHistory>(capacity_);
  if (capacity_ == 0) return history;
  std::lock_guard lock(histories_mu_);
  // The groups that are gone (only this list holds them) keep their calls while they are among
  // the latest few: a job that makes its groups anew (elastic, live recovery) still shows what
  // the previous ones did.
  constexpr size_t kGoneKept = 8;
  size_t gone = 0;
  for (auto it = histories_.end(); it != histories_.begin();) {
    --it;
    if (it->second.use_count() == 1 && ++gone > kGoneKept) it = histories_.erase(it);
  }
  histories_.emplace_back(group, history);
  return history;
}

void FlightRecorder::called(CallHistory& history, uint16_t group, uint32_t seq,
                            const CollectiveCall& call, const char* algorithm, const void* caller,
                            Clock::time_point enqueued) {
  if (capacity_ == 0 || muted(group)) return history.called(seq, call);
  Thread& t = this_thread();
  constexpr auto r = std::memory_order_relaxed;
  CallHistory::Entry& e = history.open(seq, call);
  e.site.store(t.site, r);
  e.caller.store(caller, r);
  e.algorithm.store(algorithm, r);
  e.enqueued_ns.store(ns_of(enqueued), r);
  e.started_us.store(0, r);
  e.ended_us.store(0, r);
  e.tid.store(t.tid, r);
  e.state.store(CallHistory::State::kQueued, r);
  history.publish(e, seq);
  count(t, &FlightBeat::Counter::recorded, 1);
}

void FlightRecorder::started(CallHistory& history, uint32_t seq) {
  constexpr auto r = std::memory_order_relaxed;
  CallHistory::Entry& e = history.entry(seq);
  if (e.seq.load(r) != seq || e.state.load(r) == CallHistory::State::kUnrecorded) return;
  const int64_t enqueued = e.enqueued_ns.load(r);
  e.started_us.store(micros_after(enqueued, std::max(enqueued, ns_of(thread_clock::last()))), r);
  e.state.store(CallHistory::State::kRunning, r);
}

void FlightRecorder::finished(CallHistory& history, uint32_t seq, bool ok) {
  if (ok) history.finished(seq);
  constexpr auto r = std::memory_order_relaxed;
  CallHistory::Entry& e = history.entry(seq);
  // Unrecorded: never counted. Overwritten by as many calls queued behind it as the history
  // holds: its times are lost, and the beat counts it as still running.
  if (e.seq.load(r) != seq || e.state.load(r) == CallHistory::State::kUnrecorded) return;
  const Thread& t = this_thread();
  count(t, &FlightBeat::Counter::completed, 1);
  const int64_t enqueued = e.enqueued_ns.load(r);
  const Span span = ending_now(enqueued, e.started_us.load(r), e.count.load(r));
  e.ended_us.store(micros_after(enqueued, span.end), r);
  e.state.store(ok ? CallHistory::State::kCompleted : CallHistory::State::kFailed, r);
  if (span.end > span.since)
    count(t, &FlightBeat::Counter::inside_ns, static_cast<uint64_t>(span.end - span.since));
}

FlightRecorder::PythonSite::PythonSite(uint32_t site) {
  Thread& t = this_thread();
  previous_ = t.site;
  t.site = site;
}

FlightRecorder::PythonSite::~PythonSite() { this_thread().site = previous_; }

uint32_t FlightRecorder::python_site(std::string_view text) {
  std::lock_guard lock(sites_mu_);
  auto [it, added] =
      site_ids_.try_emplace(std::string(text), static_cast<uint32_t>(site_names_.size() + 1));
  if (added) site_names_.emplace_back(text);
  return it->second;
}

std::string exit_word_path(const std::string& dir, int rank) {
  return fmt::format("{}/rank{}.exit", dir, rank);
}

std::string launcher_exit_word(int rank, std::chrono::milliseconds wait) {
  const std::string dir = env::get_string(env::kFlightDir);
  if (dir.empty() || rank < 0) return "";
  const std::string path = exit_word_path(dir, rank);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    std::ifstream in(path);
    std::string word;
    if (in && std::getline(in, word) && !word.empty()) return word;
    if (std::chrono::steady_clock::now() >= deadline) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void forget_launcher_exit_word(int rank) {
  const std::string dir = env::get_string(env::kFlightDir);
  if (dir.empty() || rank < 0) return;
  std::error_code ignored;  // none written: nothing to forget
  std::filesystem::remove(exit_word_path(dir, rank), ignored);
}

void FlightRecorder::set_python_stacks(int signal, int fd) {
  python_fd_.store(fd);
  python_signal_.store(signal);
}

std::string FlightRecorder::directory() const {
  std::string dir = env::get_string(env::kFlightDir);
  if (!dir.empty()) return dir;
  const char* tmp = std::getenv("TMPDIR");
  return fmt::format("{}/dtrain-flight", tmp != nullptr && *tmp != '\0' ? tmp : "/tmp");
}

std::string FlightRecorder::dump_on_failure(std::string_view reason) {
  // The first failure explains the others: a rank whose peers fail after it keeps its first dump.
  const int64_t now = ns_of(Clock::now());
  int64_t last = last_failure_dump_ns_.load();
  if (last != 0 && now - last < std::chrono::nanoseconds(std::chrono::seconds(10)).count())
    return "";
  if (!last_failure_dump_ns_.compare_exchange_strong(last, now)) return "";
  return dump(reason);
}

std::string FlightRecorder::dump(std::string_view reason) {
  using nlohmann::json;
  std::lock_guard lock(dump_mu_);
  const int64_t clock_now = ns_of(Clock::now());
  const auto unix_now = std::chrono::system_clock::now();
  const double unix_s = std::chrono::duration<double>(unix_now.time_since_epoch()).count();
  auto to_unix = [&](int64_t ns) {
    return ns == 0 ? json(nullptr) : json(unix_s - (clock_now - ns) * 1e-9);
  };
  std::vector<std::string> groups;
  {
    std::lock_guard g(groups_mu_);
    groups = group_names_;
  }
  std::vector<std::string> sites;
  {
    std::lock_guard g(sites_mu_);
    sites = site_names_;
  }
  constexpr auto r = std::memory_order_relaxed;
  // The code that called, and the Python frames it called from.
  auto name_caller = [&](json& c, const void* caller, uint32_t site) {
    if (caller != nullptr) c["caller"] = code_address_name(caller);
    if (site != 0 && site <= sites.size()) c["python"] = sites[site - 1];
  };
  // One entry, or nothing when its thread overwrote it while it was read.
  auto describe = [&](const Ring& ring, uint64_t n, int tid) -> std::optional<json> {
    const uint64_t t = (uint64_t{ring.index + 1} << kTicketShift) | n;
    const Slot& s = ring.slots[n & ring.mask];
    if (s.ticket.load(std::memory_order_acquire) != t) return std::nullopt;
    json c;
    const uint64_t what = s.what.load(r);
    const auto kind = static_cast<FlightCall::Kind>(what_field(what, What::kKind));
    const auto group = static_cast<uint16_t>(what >> static_cast<int>(What::kGroup));
    CollectiveCall call;
    call.kind = static_cast<CollectiveKind>(what_field(what, What::kCollective));
    call.dtype = static_cast<DType>(what_field(what, What::kDtype));
    call.op = static_cast<ReduceOp>(what_field(what, What::kOp));
    call.root = s.peer.load(r);
    call.count = s.count.load(r);
    const int64_t enqueued = s.enqueued_ns.load(r);
    auto after = [&](uint32_t us) { return us == 0 ? 0 : enqueued + int64_t{us - 1} * 1000; };
    c["id"] = t;
    c["kind"] = kind_name(kind);
    c["group"] = group < groups.size() ? groups[group] : "(unknown)";
    c["seq"] = s.seq.load(r);
    c["state"] = state_name(static_cast<uint8_t>(what_field(what, What::kState)));
    c["thread"] = tid;
    c["enqueued"] = to_unix(enqueued);
    c["started"] = to_unix(after(s.started_us.load(r)));
    c["ended"] = to_unix(after(s.ended_us.load(r)));
    if (kind == FlightCall::Kind::kNamed) {
      std::array<char, sizeof(Ring::Name)> text{};
      if (const Ring::Name* names = ring.names.load(std::memory_order_acquire)) {
        for (size_t i = 0; i < text.size() / 8; ++i) {
          const uint64_t word = names[n & ring.mask][i].load(r);
          std::memcpy(text.data() + i * 8, &word, 8);
        }
      }
      text.back() = '\0';
      c["name"] = std::string(text.data());
      c["op"] = to_string(call.kind);
      const std::string op = call.count == 0 ? std::string(to_string(call.kind)) : call.describe();
      c["call"] =
          text[0] == '\0' ? op + ", unnamed" : fmt::format("{} of tensor '{}'", op, text.data());
    } else if (kind == FlightCall::Kind::kCollective) {
      c["op"] = to_string(call.kind);
      c["call"] = call.describe();
      c["dtype"] = to_string(call.dtype);
      c["count"] = call.count;
      const char* algorithm = ring.algorithms[n & ring.mask].load(r);
      c["algorithm"] = algorithm != nullptr ? algorithm : "";
    } else {
      const int peer = s.peer.load(r);
      c["op"] = kind_name(kind);
      c["bytes"] = call.count;
      c["peer"] = peer;
      c["tag"] = s.tag.load(r);
      c["call"] =
          kind == FlightCall::Kind::kSend
              ? fmt::format("send({} bytes to rank {}, tag {})", call.count, peer, s.tag.load(r))
          : kind == FlightCall::Kind::kRecv
              ? fmt::format("recv({} bytes from rank {}, tag {})", call.count, peer, s.tag.load(r))
              : fmt::format("recv({} bytes from any rank, tag {})", call.count, s.tag.load(r));
    }
    name_caller(c, s.caller.load(r), s.site.load(r));
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.ticket.load(r) != t) return std::nullopt;
    return c;
  };
  // Collective #seq of a group's history, when the recorder recorded it, or nothing.
  auto describe_collective = [&](const CallHistory& history, uint16_t group,
                                 uint32_t seq) -> std::optional<json> {
    const CallHistory::Entry& e = history.entry(seq);
    if (e.seq.load(std::memory_order_acquire) != seq) return std::nullopt;
    const auto state = e.state.load(r);
    if (state == CallHistory::State::kUnrecorded) return std::nullopt;
    const CollectiveCall call = CollectiveCall::from_head(e.head.load(r), e.count.load(r));
    const int64_t enqueued = e.enqueued_ns.load(r);
    auto after = [&](uint32_t us) { return us == 0 ? 0 : enqueued + int64_t{us - 1} * 1000; };
    const char* algorithm = e.algorithm.load(r);
    json c{{"kind", kind_name(FlightCall::Kind::kCollective)},
           {"group", group < groups.size() ? groups[group] : "(unknown)"},
           {"seq", seq},
           {"state", state_name(static_cast<uint8_t>(state))},
           {"thread", e.tid.load(r)},
           {"enqueued", to_unix(enqueued)},
           {"started", to_unix(after(e.started_us.load(r)))},
           {"ended", to_unix(after(e.ended_us.load(r)))},
           {"op", to_string(call.kind)},
           {"call", call.describe()},
           {"dtype", to_string(call.dtype)},
           {"count", call.count},
           {"algorithm", algorithm != nullptr ? algorithm : ""}};
    name_caller(c, e.caller.load(r), e.site.load(r));
    std::atomic_thread_fence(std::memory_order_acquire);
    if (e.seq.load(r) != seq) return std::nullopt;
    return c;
  };
  // Every thread's ring, merged oldest first.
  std::vector<std::pair<int64_t, json>> entries;
  for (size_t i = 0; i < ring_count_.load(std::memory_order_acquire); ++i) {
    const Ring& ring = *rings_[i].load(std::memory_order_acquire);
    std::vector<std::pair<uint64_t, int>> owners;
    {
      std::lock_guard lock(threads_mu_);
      owners = ring.owners;
    }
    const uint64_t end = ring.last.load(std::memory_order_acquire) + 1;
    size_t owner = 0;
    for (uint64_t n = end > ring.mask + 1 ? end - ring.mask - 1 : 1; n < end; ++n) {
      while (owner + 1 < owners.size() && owners[owner + 1].first <= n) ++owner;
      const int tid = owners.empty() ? 0 : owners[owner].second;
      const int64_t enqueued = ring.slots[n & ring.mask].enqueued_ns.load(r);
      if (auto c = describe(ring, n, tid)) entries.emplace_back(enqueued, std::move(*c));
    }
  }
  // Every group's collectives.
  std::vector<std::pair<uint16_t, std::shared_ptr<CallHistory>>> histories;
  {
    std::lock_guard lock(histories_mu_);
    histories = histories_;
  }
  for (const auto& [group, history] : histories) {
    const uint32_t last = history->last_called();
    const uint32_t kept = history->mask_ + 1;
    for (uint32_t seq = last > kept ? last - kept + 1 : 1; seq != 0 && seq <= last; ++seq)
      if (auto c = describe_collective(*history, group, seq))
        entries.emplace_back(history->entry(seq).enqueued_ns.load(r), std::move(*c));
  }
  std::stable_sort(entries.begin(), entries.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  json calls = json::array();
  for (auto& [at, c] : entries) calls.push_back(std::move(c));
  json threads = json::array();
  for (const ThreadStack& t : all_thread_stacks()) {
    json th{{"tid", t.tid}, {"name", t.name}, {"stack", t.frames}};
    if (!t.missing.empty()) th["missing"] = t.missing;
    threads.push_back(std::move(th));
  }
  std::string python;
  if (const int sig = python_signal_.load(), fd = python_fd_.load(); sig != 0 && fd >= 0) {
    // faulthandler writes every Python thread's stack to fd from the signal handler, at once.
    if (::ftruncate(fd, 0) == 0 && ::lseek(fd, 0, SEEK_SET) == 0) {
      pthread_kill(pthread_self(), sig);
      const off_t size = ::lseek(fd, 0, SEEK_END);
      if (size > 0) {
        python.resize(static_cast<size_t>(size));
        if (::pread(fd, python.data(), python.size(), 0) != size) python.clear();
      }
    }
  }
  const int rank = rank_.load();
  const FlightBeat::Totals totals = beat_.load()->totals();
  json out{{"format", "dtrain-flight-1"},
           {"groups", groups},
           {"rank", rank},
           {"world_size", world_size_},
           {"pid", getpid()},
           {"reason", reason},
           {"time", unix_s},
           {"completed", totals.completed},
           {"in_calls", totals.in_calls()},
           {"capacity", capacity_},  // per thread, and per group
           {"calls", std::move(calls)},
           {"threads", std::move(threads)},
           {"python_stacks", python}};
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  out["host"] = host;
  const std::string dir = directory();
  const std::string name = rank >= 0 ? fmt::format("rank{}", rank) : fmt::format("pid{}", getpid());
  const std::string path = fmt::format("{}/{}.json", dir, name);
  try {
    std::filesystem::create_directories(dir);
    const std::string tmp = fmt::format("{}/.{}.json.tmp", dir, name);
    durable::write_file(tmp, out.dump(1));
    std::filesystem::rename(tmp, path);
  } catch (const std::exception& e) {
    DTRAIN_LOG_WARN("flight recorder: cannot write {}: {}", path, e.what());
    return "";
  }
  DTRAIN_LOG_INFO("flight record ({}) written to {}", reason, path);
  return path;
}

}  // namespace dtrain::comm
