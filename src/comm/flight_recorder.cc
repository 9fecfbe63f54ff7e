#include "comm/flight_recorder.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/durable.h"
#include "common/env.h"
#include "common/log.h"
#include "common/thread_stacks.h"

namespace dtrain::comm {
namespace {

// The kernel's coarse monotonic clock (see the header): the recorder's only clock.
int64_t now_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  return t.tv_sec * 1'000'000'000 + t.tv_nsec;
}

int this_thread_id() {
  thread_local const int tid = static_cast<int>(syscall(SYS_gettid));
  return tid;
}

enum class State : uint8_t { kQueued, kRunning, kCompleted, kFailed };

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

struct FlightRecorder::Slot {
  // Seqlock: 0 while the recording thread fills the slot, then the ticket (release).
  std::atomic<uint64_t> ticket{0};
  std::atomic<uint8_t> kind{0}, state{0}, collective{0}, dtype{0}, op{0};
  std::atomic<uint16_t> group{0};
  std::atomic<uint32_t> seq{0};
  std::atomic<int32_t> root{0}, peer{-1}, tag{0}, tid{0};
  std::atomic<uint64_t> count{0};
  std::atomic<const char*> algorithm{""};
  std::atomic<const void*> caller{nullptr};
  std::atomic<int64_t> enqueued_ns{0}, started_ns{0}, ended_ns{0};
  std::array<std::atomic<uint64_t>, 6> name{};  // kNamed: up to 47 bytes, NUL-terminated
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

FlightRecorder::FlightRecorder()
    : capacity_(static_cast<size_t>(
          std::max<int64_t>(0, env::get_int(env::kFlightRecorder).value_or(2000)))),
      beat_(&local_beat_) {
  if (capacity_ > 0) slots_ = new Slot[capacity_];
  local_beat_.pid = getpid();
  start_dump_thread();
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
  auto* beat = new (page) FlightBeat();
  beat->pid = getpid();
  beat->rank = rank;
  beat->recorded.store(local_beat_.recorded.load());
  beat->completed.store(local_beat_.completed.load());
  beat->inside_ns.store(local_beat_.inside_ns.load());
  beat_ = beat;  // set before this process's world group makes its first call
}

void FlightRecorder::mute(uint16_t group) {
  if (group < muted_.size()) muted_[group].store(true);
}

uint64_t FlightRecorder::record(const FlightCall& call) {
  if (capacity_ == 0 || muted(call.group)) return 0;
  const uint64_t ticket = beat_->recorded.fetch_add(1, std::memory_order_relaxed) + 1;
  Slot& s = slots_[ticket % capacity_];
  constexpr auto r = std::memory_order_relaxed;
  s.ticket.store(0, r);
  std::atomic_thread_fence(std::memory_order_release);
  s.kind.store(static_cast<uint8_t>(call.kind), r);
  s.state.store(static_cast<uint8_t>(State::kQueued), r);
  s.collective.store(static_cast<uint8_t>(call.call.kind), r);
  s.dtype.store(static_cast<uint8_t>(call.call.dtype), r);
  s.op.store(static_cast<uint8_t>(call.call.op), r);
  s.group.store(call.group, r);
  s.seq.store(call.seq, r);
  s.root.store(call.call.root, r);
  s.peer.store(call.peer, r);
  s.tag.store(call.tag, r);
  s.tid.store(this_thread_id(), r);
  s.count.store(call.call.count, r);
  s.algorithm.store(call.algorithm, r);
  s.caller.store(call.caller, r);
  if (call.kind == FlightCall::Kind::kNamed) {
    std::array<char, sizeof(Slot::name)> text{};
    std::memcpy(text.data(), call.name.data(), std::min(call.name.size(), text.size() - 1));
    for (size_t i = 0; i < s.name.size(); ++i) {
      uint64_t word;
      std::memcpy(&word, text.data() + i * 8, 8);
      s.name[i].store(word, r);
    }
  }
  s.enqueued_ns.store(now_ns(), r);
  s.started_ns.store(0, r);
  s.ended_ns.store(0, r);
  s.ticket.store(ticket, std::memory_order_release);
  return ticket;
}

void FlightRecorder::started(uint64_t ticket) {
  if (ticket == 0) return;
  Slot& s = slots_[ticket % capacity_];
  if (s.ticket.load(std::memory_order_relaxed) != ticket) return;  // overwritten since
  s.started_ns.store(now_ns(), std::memory_order_relaxed);
  s.state.store(static_cast<uint8_t>(State::kRunning), std::memory_order_relaxed);
}

void FlightRecorder::set_seq(uint64_t ticket, uint32_t seq) {
  if (ticket == 0) return;
  Slot& s = slots_[ticket % capacity_];
  if (s.ticket.load(std::memory_order_relaxed) == ticket)
    s.seq.store(seq, std::memory_order_relaxed);
}

void FlightRecorder::ended(uint64_t ticket, bool ok) {
  if (ticket == 0) return;
  constexpr auto r = std::memory_order_relaxed;
  const int64_t now = now_ns();
  Slot& s = slots_[ticket % capacity_];
  int64_t since = 0;
  if (s.ticket.load(r) == ticket) {
    since = s.started_ns.load(r);
    if (since == 0) since = s.enqueued_ns.load(r);
    s.ended_ns.store(now, r);
    s.state.store(static_cast<uint8_t>(ok ? State::kCompleted : State::kFailed), r);
  }
  FlightBeat& beat = *beat_;
  beat.completed.fetch_add(1, r);
  // The coarse clock makes most short calls 0 ns long: nothing to add then.
  if (since != 0 && now > since) beat.inside_ns.fetch_add(now - since, r);
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
  const int64_t now = now_ns();
  int64_t last = last_failure_dump_ns_.load();
  if (last != 0 && now - last < std::chrono::nanoseconds(std::chrono::seconds(10)).count())
    return "";
  if (!last_failure_dump_ns_.compare_exchange_strong(last, now)) return "";
  return dump(reason);
}

std::string FlightRecorder::dump(std::string_view reason) {
  using nlohmann::json;
  std::lock_guard lock(dump_mu_);
  const int64_t clock_now = now_ns();
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
  json calls = json::array();
  const uint64_t end = beat_->recorded.load() + 1;
  const uint64_t begin = end > capacity_ ? end - capacity_ : 1;
  constexpr auto r = std::memory_order_relaxed;
  for (uint64_t t = begin; t < end && capacity_ > 0; ++t) {
    const Slot& s = slots_[t % capacity_];
    if (s.ticket.load(std::memory_order_acquire) != t) continue;
    json c;
    const auto kind = static_cast<FlightCall::Kind>(s.kind.load(r));
    const uint16_t group = s.group.load(r);
    CollectiveCall call;
    call.kind = static_cast<CollectiveKind>(s.collective.load(r));
    call.dtype = static_cast<DType>(s.dtype.load(r));
    call.op = static_cast<ReduceOp>(s.op.load(r));
    call.root = s.root.load(r);
    call.count = s.count.load(r);
    c["id"] = t;
    c["kind"] = kind_name(kind);
    c["group"] = group < groups.size() ? groups[group] : "(unknown)";
    c["seq"] = s.seq.load(r);
    c["state"] = state_name(s.state.load(r));
    c["thread"] = s.tid.load(r);
    c["enqueued"] = to_unix(s.enqueued_ns.load(r));
    c["started"] = to_unix(s.started_ns.load(r));
    c["ended"] = to_unix(s.ended_ns.load(r));
    if (kind == FlightCall::Kind::kNamed) {
      std::array<char, sizeof(Slot::name)> text{};
      for (size_t i = 0; i < s.name.size(); ++i) {
        const uint64_t word = s.name[i].load(r);
        std::memcpy(text.data() + i * 8, &word, 8);
      }
      text.back() = '\0';
      c["name"] = std::string(text.data());
      c["op"] = to_string(call.kind);
      const std::string what =
          call.count == 0 ? std::string(to_string(call.kind)) : call.describe();
      c["call"] = text[0] == '\0' ? what + ", unnamed"
                                  : fmt::format("{} of tensor '{}'", what, text.data());
    } else if (kind == FlightCall::Kind::kCollective) {
      c["op"] = to_string(call.kind);
      c["call"] = call.describe();
      c["dtype"] = to_string(call.dtype);
      c["count"] = call.count;
      c["algorithm"] = s.algorithm.load(r);
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
    if (const void* caller = s.caller.load(r)) c["caller"] = code_address_name(caller);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.ticket.load(r) != t) continue;  // overwritten while read
    calls.push_back(std::move(c));
  }
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
  const FlightBeat& beat = *beat_;
  json out{{"format", "dtrain-flight-1"},
           {"groups", groups},
           {"rank", rank},
           {"world_size", world_size_},
           {"pid", getpid()},
           {"reason", reason},
           {"time", unix_s},
           {"completed", beat.completed.load()},
           {"in_calls", beat.in_calls()},
           {"capacity", capacity_},
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
