#include "launch/cpu_binding.h"

#include <fmt/format.h>

#include "launch/process_threads.h"

namespace dtrain::launch {

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

std::vector<int> cpu_share(int index, int count, const std::vector<int>& cpus) {
  const int n = static_cast<int>(cpus.size());
  if (count <= 0 || index < 0 || index >= count || count > n) return {};
  // The first n % count processes get one CPU more than the others.
  const int per = n / count, extra = n % count;
  const int begin = index * per + std::min(index, extra);
  const int size = per + (index < extra ? 1 : 0);
  return {cpus.begin() + begin, cpus.begin() + begin + size};
}

std::string describe_cpus(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return out;
}

cpu_set_t to_cpu_set(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  return set;
}

std::string bind_every_thread(pid_t pid, const std::vector<int>& cpus) {
  const cpu_set_t wanted = to_cpu_set(cpus);
  return change_every_thread(
      pid, fmt::format("sched_setaffinity({})", describe_cpus(cpus)), [&](pid_t tid) {
        cpu_set_t now;
        CPU_ZERO(&now);
        if (::sched_getaffinity(tid, sizeof now, &now) != 0) return ThreadChange::kFailed;
        if (CPU_EQUAL(&now, &wanted)) return ThreadChange::kNone;
        return ::sched_setaffinity(tid, sizeof wanted, &wanted) == 0 ? ThreadChange::kChanged
                                                                     : ThreadChange::kFailed;
      });
}

}  // namespace dtrain::launch
