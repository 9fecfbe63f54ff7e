#include "launch/process_threads.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

namespace dtrain::launch {

std::string change_every_thread(pid_t pid, std::string_view what,
                                const std::function<ThreadChange(pid_t tid)>& change) {
  const std::string tasks = fmt::format("/proc/{}/task", pid);
  for (int pass = 0; pass < 8; ++pass) {
    bool changed = false;
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
      const pid_t tid = static_cast<pid_t>(std::stol(task.path().filename().string()));
      switch (change(tid)) {
        case ThreadChange::kNone:
          break;
        case ThreadChange::kChanged:
          changed = true;
          break;
        case ThreadChange::kFailed:
          if (errno == ESRCH) break;  // it ended meanwhile
          return fmt::format("thread {} of pid {}: {}: {}", tid, pid, what, std::strerror(errno));
      }
    }
    if (ec) return fmt::format("{}: {}", tasks, ec.message());
    if (!changed) return "";
  }
  return fmt::format("pid {} kept starting threads faster than {} could follow", pid, what);
}

}  // namespace dtrain::launch
