// Which CPUs a launcher gives each of the processes it starts on a host, as mpirun does by
// default: with no more processes than CPUs, each gets its own equal, contiguous share of the
// CPUs the launcher may use; with more, none is bound and the scheduler places them.
//
// Unbound, two ranks that take turns (one sends, the other answers) tend to end up on one CPU:
// the kernel places a task it wakes near the task that woke it, and a pair that alternates never
// looks unbalanced, and a small all-reduce between them takes about three times as long
// (docs/performance.md).
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace dtrain::launch {

// The CPUs this process may run on, in order.
std::vector<int> allowed_cpus();

// The CPUs of process `index` of `count` (empty: do not bind) out of `cpus`.
std::vector<int> cpu_share(int index, int count, const std::vector<int>& cpus);

// "0-3,6" for logs.
std::string describe_cpus(const std::vector<int>& cpus);

// The set for sched_setaffinity (built before fork: the child may only make system calls).
cpu_set_t to_cpu_set(const std::vector<int>& cpus);

// Binds every thread of running process `pid` to `cpus` (a spare given a bound worker's place).
// Returns why it could not ("" when done).
std::string bind_every_thread(pid_t pid, const std::vector<int>& cpus);

}  // namespace dtrain::launch
