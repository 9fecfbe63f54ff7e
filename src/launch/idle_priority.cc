#include "launch/idle_priority.h"

#include <sched.h>

#include <string>
#include <thread>

#include "launch/process_threads.h"

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
  return change_every_thread(pid, "sched_setscheduler(SCHED_OTHER)", [](pid_t tid) {
    if (::sched_getscheduler(tid) != SCHED_IDLE) return ThreadChange::kNone;  // or gone
    return set_policy(tid, SCHED_OTHER) ? ThreadChange::kChanged : ThreadChange::kFailed;
  });
}

}  // namespace dtrain::launch
