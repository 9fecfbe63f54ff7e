#include "common/thread_stacks.h"

#include <cxxabi.h>
#include <dirent.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/format.h>

namespace dtrain {
namespace {

// The one request in flight: the thread asked, and where its handler leaves the addresses.
struct Capture {
  std::atomic<int> tid{0};
  std::atomic<int> depth{-1};  // -1 until the thread has written its frames
  std::array<void*, 64> frames{};
};
Capture capture;

int stack_signal() { return SIGRTMIN + 4; }

void on_stack_signal(int) {
  const int saved = errno;
  if (static_cast<int>(syscall(SYS_gettid)) == capture.tid.load(std::memory_order_acquire)) {
    const int n = backtrace(capture.frames.data(), static_cast<int>(capture.frames.size()));
    capture.depth.store(n, std::memory_order_release);
  }
  errno = saved;
}

void install_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    // backtrace() loads libgcc_s the first time, which allocates: never inside the handler.
    void* warm[2];
    backtrace(warm, 2);
    struct sigaction sa {};
    sa.sa_handler = on_stack_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(stack_signal(), &sa, nullptr);
  });
}

std::string demangled(const char* symbol) {
  // backtrace_symbols: "/path/lib.so(_ZN6dtrain4commE+0x4c) [0x7f...]"
  std::string s(symbol);
  const auto open = s.find('('), plus = s.find('+', open), close = s.find(')', open);
  if (open == std::string::npos || close == std::string::npos) return s;
  const std::string module = s.substr(0, open);
  const std::string short_module = module.substr(module.rfind('/') + 1);
  if (plus == std::string::npos || plus == open + 1)  // no symbol: module and offset
    return fmt::format("{} {}", short_module, s.substr(open + 1, close - open - 1));
  const std::string mangled = s.substr(open + 1, plus - open - 1);
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> name(
      abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status), &std::free);
  return fmt::format("{} {} ({})", status == 0 ? name.get() : mangled, s.substr(plus, close - plus),
                     short_module);
}

std::vector<std::string> symbolized(void* const* frames, int n) {
  std::vector<std::string> out;
  std::unique_ptr<char*, decltype(&std::free)> symbols(backtrace_symbols(frames, n), &std::free);
  for (int i = 0; i < n; ++i)
    out.push_back(symbols ? demangled(symbols.get()[i]) : fmt::format("{}", frames[i]));
  return out;
}

std::string thread_name(int tid) {
  std::ifstream in(fmt::format("/proc/self/task/{}/comm", tid));
  std::string name;
  std::getline(in, name);
  return name;
}

}  // namespace

std::string code_address_name(const void* address) {
  void* frames[1] = {const_cast<void*>(address)};
  return symbolized(frames, 1)[0];
}

std::vector<ThreadStack> all_thread_stacks(std::chrono::milliseconds per_thread) {
  static std::mutex one_at_a_time;
  std::lock_guard lock(one_at_a_time);
  install_handler();
  const int self = static_cast<int>(syscall(SYS_gettid));
  std::vector<ThreadStack> stacks;
  {
    std::array<void*, 64> frames{};
    const int n = backtrace(frames.data(), static_cast<int>(frames.size()));
    stacks.push_back({self, thread_name(self), symbolized(frames.data(), n), ""});
  }
  struct CloseDir {
    void operator()(DIR* d) const { closedir(d); }
  };
  std::unique_ptr<DIR, CloseDir> dir(opendir("/proc/self/task"));
  if (!dir) return stacks;
  std::vector<int> tids;
  while (dirent* e = readdir(dir.get()))
    if (e->d_name[0] != '.') tids.push_back(std::atoi(e->d_name));
  for (int tid : tids) {
    if (tid == self) continue;
    ThreadStack stack{tid, thread_name(tid), {}, ""};
    capture.depth.store(-1, std::memory_order_relaxed);
    capture.tid.store(tid, std::memory_order_release);
    if (syscall(SYS_tgkill, getpid(), tid, stack_signal()) != 0) continue;  // it just ended
    const auto deadline = std::chrono::steady_clock::now() + per_thread;
    int depth = -1;
    while ((depth = capture.depth.load(std::memory_order_acquire)) < 0 &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    capture.tid.store(0, std::memory_order_release);
    if (depth < 0) {
      stack.missing = fmt::format(
          "no stack: the thread did not answer within {} ms (it blocks "
          "signal {}, or did not get a CPU)",
          per_thread.count(), stack_signal());
    } else {
      // The first two are the handler and the kernel's signal trampoline: not the thread's.
      const int skip = std::min(depth, 2);
      stack.frames = symbolized(capture.frames.data() + skip, depth - skip);
    }
    stacks.push_back(std::move(stack));
  }
  return stacks;
}

}  // namespace dtrain
