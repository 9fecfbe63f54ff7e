#include "launch/idle_priority.h"

#include <sched.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <thread>

#include <fmt/format.h>

namespace dtrain::launch {
namespace {

bool set_policy(pid_t tid, int policy) {
  const sched_param none{};
  return ::sched_setscheduler(tid, policy, &none) == 0;
}

}  // namespace

bool can_leave_idle_priority() {
  bool can = false;
  std::thread([&] { can = set_policy(0, SCHED_IDLE) && set_policy(0, SCHED_OTHER); }).join();
  return can;
}

std::string leave_idle_priority(pid_t pid) {
  const std::string tasks = fmt::format("/proc/{}/task", pid);
  // A thread being started while the others are raised is started idle by its idle parent: look
  // again until a pass finds none left idle.
  for (int pass = 0; pass < 8; ++pass) {
    bool idle_left = false;
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
      const pid_t tid = static_cast<pid_t>(std::stol(task.path().filename().string()));
      const int policy = ::sched_getscheduler(tid);
      if (policy != SCHED_IDLE) continue;  // gone, raised already, or not ours to change
      idle_left = true;
      if (!set_policy(tid, SCHED_OTHER) && errno != ESRCH)
        return fmt::format("thread {} of pid {}: sched_setscheduler(SCHED_OTHER): {}", tid, pid,
                           std::strerror(errno));
    }
    if (ec) return fmt::format("{}: {}", tasks, ec.message());
    if (!idle_left) return "";
  }
  return fmt::format("pid {} kept starting threads at the idle priority", pid);
}

}  // namespace dtrain::launch
