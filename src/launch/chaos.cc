#include "launch/chaos.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/env.h"
#include "dtrain/error.h"
#include "launch/hang_monitor.h"
#include "launch/spawn.h"

namespace dtrain::launch {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The state letter of /proc/PID/stat ('R', 'S', 'T' stopped, 'Z' a zombie), or 0 when gone.
char process_state(int64_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  std::getline(in, stat);
  const auto close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? 0 : stat[close + 2];
}

struct Worker {
  int rank;
  int64_t pid;
  // Of a job made of replica groups that each number their ranks from 0 (torchft's:
  // REPLICA_GROUP_ID in the worker's environment), else -1.
  int replica_group = -1;
  auto operator<=>(const Worker&) const = default;
  std::string describe() const {
    return replica_group < 0
               ? fmt::format("rank {} (pid {})", rank, pid)
               : fmt::format("rank {} of replica group {} (pid {})", rank, replica_group, pid);
  }
};

// The job's workers that run now (neither ended nor stopped), from the beat pages under `dir`
// (elastic runs keep one directory per round), by rank.
std::vector<Worker> running_workers(const std::string& dir) {
  std::set<std::string> dirs;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".beat") dirs.insert(it->path().parent_path().string());
  std::set<Worker> workers;
  for (const std::string& d : dirs)
    for (const BeatReading& b : read_beats(d)) {
      const char state = b.pid > 0 ? process_state(b.pid) : 0;
      if (state != 0 && state != 'Z' && state != 'X' && state != 'T' && state != 't')
        workers.insert({b.rank, b.pid});
    }
  return {workers.begin(), workers.end()};
}

bool has_beats(const std::string& dir) {
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".beat") return true;
  return false;
}

// The parent of `pid` (the fourth field of /proc/PID/stat), or 0 when gone.
int64_t parent_of(int64_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  std::getline(in, stat);
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  char state = 0;
  int64_t parent = 0;
  fields >> state >> parent;
  return parent;
}

// The value of the integer `variable` in the environment `pid` started with, or -1.
int integer_in_environment(int64_t pid, std::string_view variable) {
  const std::string prefix = fmt::format("{}=", variable);
  std::ifstream in(fmt::format("/proc/{}/environ", pid), std::ios::binary);
  for (std::string entry; std::getline(in, entry, '\0');)
    if (entry.rfind(prefix, 0) == 0) {
      try {
        return std::stoi(entry.substr(prefix.size()));
      } catch (const std::exception&) {
        return -1;
      }
    }
  return -1;
}
int rank_in_environment(int64_t pid) { return integer_in_environment(pid, "RANK"); }

// The processes whose names are numbers in /proc.
std::vector<int64_t> all_processes() {
  std::vector<int64_t> pids;
  std::error_code ec;
  for (fs::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.empty() && name.find_first_not_of("0123456789") == std::string::npos)
      pids.push_back(std::stoll(name));
  }
  return pids;
}

// The processes under `job` (its descendants), each with its parent.
std::map<int64_t, int64_t> processes_under(int64_t job) {
  std::map<int64_t, int64_t> parent;
  for (const int64_t pid : all_processes()) parent[pid] = parent_of(pid);
  auto under_job = [&](int64_t pid) {
    for (int depth = 0; pid > 1 && depth < 64; ++depth) {
      auto it = parent.find(pid);
      if (it == parent.end()) return false;
      pid = it->second;
      if (pid == job) return true;
    }
    return false;
  };
  std::map<int64_t, int64_t> under;
  for (const auto& [pid, up] : parent)
    if (under_job(pid)) under[pid] = up;
  return under;
}

// A job whose workers write no beat pages (another launcher, such as torchrun, and another
// backend): its workers are the processes under `job` whose environment names a RANK that their
// parent's does not (a worker's own children inherit it), running and not stopped.
std::vector<Worker> workers_under(int64_t job) {
  std::set<Worker> workers;
  for (const auto& [pid, up] : processes_under(job)) {
    const int rank = rank_in_environment(pid);
    if (rank < 0 || rank_in_environment(up) == rank) continue;
    const char state = process_state(pid);
    if (state != 0 && state != 'Z' && state != 'X' && state != 'T' && state != 't')
      workers.insert({rank, pid, integer_in_environment(pid, "REPLICA_GROUP_ID")});
  }
  return {workers.begin(), workers.end()};
}

// The calls the workers under `dir` have completed, all rounds together.
uint64_t completed_calls(const std::string& dir) {
  uint64_t calls = 0;
  for (const BeatReading& b : read_beats(dir)) calls += b.completed;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_directory(ec))
      for (const BeatReading& b : read_beats(it->path().string())) calls += b.completed;
  return calls;
}

// The sample log as it grows: how many lines, and the latest attempt (the restart count, its
// fourth field) that logged one.
class LogTail {
 public:
  explicit LogTail(std::string path) : path_(std::move(path)) {}
  void poll() {
    std::ifstream in(path_, std::ios::binary);
    if (!in) return;
    in.seekg(offset_);
    std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    offset_ += static_cast<std::streamoff>(chunk.size());
    partial_ += chunk;
    size_t begin = 0;
    for (size_t end; (end = partial_.find('\n', begin)) != std::string::npos; begin = end + 1) {
      std::istringstream fields(partial_.substr(begin, end - begin));
      int64_t epoch, index, step, attempt;
      if (fields >> epoch >> index >> step >> attempt) attempt_ = std::max(attempt_, attempt);
      ++lines_;
    }
    partial_.erase(0, begin);
  }
  int64_t lines() const { return lines_; }
  int64_t attempt() const { return attempt_; }

 private:
  std::string path_;
  std::streamoff offset_ = 0;
  std::string partial_;
  int64_t lines_ = 0;
  int64_t attempt_ = -1;
};

// A job that keeps no sample log starts its schedule this long after its first call.
constexpr std::chrono::seconds kSampleGrace{10};

off_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : 0;
}

// A number of the job's last `RESULT {...}` line holding it (after `dtrain run`'s "[rank 0] ").
std::optional<double> result_number(const std::string& path, const char* key) {
  std::ifstream in(path);
  std::optional<double> value;
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("RESULT {");
    if (at == std::string::npos || (at > 0 && line[at - 1] != ' ')) continue;
    const auto result = nlohmann::json::parse(line.substr(at + 7), nullptr, false);
    if (result.is_object() && result.contains(key) && result[key].is_number())
      value = result[key].get<double>();
  }
  return value;
}

void say(int fd, const std::string& line) {
  const std::string text = "dtrain chaos: " + line + "\n";
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // progress lines only: the CHAOS line says the result
    done += static_cast<size_t>(n);
  }
}

int open_output(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw InvalidArgumentError(
        fmt::format("dtrain chaos: cannot create {}: {}", path, std::strerror(errno)));
  return fd;
}

// The network namespace a process is in (an emulated host of scripts/netns-hosts.sh, or this
// machine's own).
struct Netns {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const Netns&) const = default;
};
std::optional<Netns> netns_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return Netns{st.st_dev, st.st_ino};
}
std::optional<Netns> netns_of(int64_t pid) { return netns_of(fmt::format("/proc/{}/ns/net", pid)); }

// The processes in network namespace `ns`.
std::vector<int64_t> processes_in(const Netns& ns) {
  std::vector<int64_t> in;
  for (const int64_t pid : all_processes())
    if (netns_of(pid) == ns) in.push_back(pid);
  return in;
}

// The name `ip netns` gives the namespace ("cx-h2"), or "".
std::string netns_name(const Netns& ns) {
  std::error_code ec;
  for (fs::directory_iterator it("/run/netns", ec), end; !ec && it != end; it.increment(ec))
    if (netns_of(it->path().string()) == ns) return it->path().filename().string();
  return "";
}

std::string command_name(int64_t pid) {
  std::ifstream in(fmt::format("/proc/{}/comm", pid));
  std::string name;
  std::getline(in, name);
  return name;
}

// The process of job `job` (itself or one under it) that listens on TCP `port` (the job's
// store: its workers' MASTER_PORT), in whichever network namespace it runs; the lowest pid when
// several hold the socket; 0 when none. (Another job's store on the same port elsewhere is not
// this one's.)
int64_t listener_of(int64_t job, uint16_t port) {
  std::vector<int64_t> pids = {job};
  for (const auto& [pid, up] : processes_under(job)) pids.push_back(pid);
  std::sort(pids.begin(), pids.end());
  std::set<std::string> sockets;  // "socket:[inode]"
  std::set<std::pair<dev_t, ino_t>> read;
  for (const int64_t pid : pids) {
    const auto ns = netns_of(pid);
    if (!ns || !read.insert({ns->dev, ns->ino}).second) continue;
    for (const char* table : {"tcp", "tcp6"}) {
      std::ifstream in(fmt::format("/proc/{}/net/{}", pid, table));
      std::string line;
      std::getline(in, line);  // the header
      while (std::getline(in, line)) {
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
        std::istringstream f(line);
        std::string sl, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
        if (!(f >> sl >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
              timeout >> inode))
          continue;
        const auto colon = local.rfind(':');
        if (state != "0A" || colon == std::string::npos) continue;  // 0A: LISTEN
        if (std::stoul(local.substr(colon + 1), nullptr, 16) == port)
          sockets.insert("socket:[" + inode + "]");
      }
    }
  }
  if (sockets.empty()) return 0;
  for (const int64_t pid : pids) {  // ascending
    std::error_code ec;
    for (fs::directory_iterator it(fmt::format("/proc/{}/fd", pid), ec), end; !ec && it != end;
         it.increment(ec)) {
      std::error_code link_ec;
      if (sockets.count(fs::read_symlink(it->path(), link_ec).string()) > 0) return pid;
    }
  }
  return 0;
}

// The nftables table that cuts a host off: every packet in or out, but loopback's, dropped.
constexpr const char* kCutTable = "dtrain_chaos_cut";

// Runs nft with `args` inside the namespace `netns_fd`; throws with what nft said.
void nft_in(int netns_fd, const std::vector<std::string>& args, const std::string& log) {
  SpawnOptions so;
  try {
    so.path = find_executable("nft");
  } catch (const InvalidArgumentError&) {
    so.path = "/usr/sbin/nft";  // root's, often off other users' PATH
    if (::access(so.path.c_str(), X_OK) != 0)
      throw InvalidArgumentError(
          "dtrain chaos: cut faults need nftables' nft (apt install nftables), found neither on "
          "PATH nor at /usr/sbin/nft");
  }
  so.argv = {"nft"};
  so.argv.insert(so.argv.end(), args.begin(), args.end());
  so.netns_fd = netns_fd;
  so.output_file = log;
  fs::remove(log);
  const Spawned nft = spawn(so);
  int status = 0;
  ::waitpid(nft.pid, &status, 0);
  if (!nft.failure.empty() || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::ifstream in(log);
    const std::string said((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    throw InvalidArgumentError(fmt::format(
        "dtrain chaos: nft {} failed{}: {} (cut faults need root and nftables)",
        fmt::join(args, " "), nft.failure.empty() ? "" : " to start", nft.failure + said));
  }
}

// Cuts the host of `victim` off the network: nftables in its network namespace drops every packet
// but loopback's. Returns the namespace's descriptor, which mend_host() needs (it keeps the
// namespace even when the host's processes end meanwhile).
int cut_host(const Worker& victim, const std::string& run_dir) {
  const int fd = ::open(fmt::format("/proc/{}/ns/net", victim.pid).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw InvalidArgumentError(
        fmt::format("dtrain chaos: cannot open the network namespace of {}: {}", victim.describe(),
                    std::strerror(errno)));
  struct stat st {};
  ::fstat(fd, &st);
  if (netns_of("/proc/self/ns/net") == Netns{st.st_dev, st.st_ino}) {
    ::close(fd);
    throw InvalidArgumentError(fmt::format(
        "dtrain chaos: a cut fault cuts a worker's host off the network, but {} runs in this "
        "machine's own network namespace (cutting it would cut this machine, and the job's "
        "store with it): run the job's nodes on emulated hosts, scripts/netns-hosts.sh up NAME N "
        "SUBNET, then the job as scripts/netns-hosts.sh job NAME dtrain run --nnodes N "
        "--node-rank {{node}} --master-addr {{host0}} ...",
        victim.describe()));
  }
  const std::string rules = run_dir + "/cut.nft";
  std::ofstream(rules) << "table inet " << kCutTable << " {\n"
                       << "  chain in { type filter hook input priority -100; policy accept; "
                          "iifname != \"lo\" drop; }\n"
                       << "  chain out { type filter hook output priority -100; policy accept; "
                          "oifname != \"lo\" drop; }\n"
                       << "}\n";
  try {
    nft_in(fd, {"-f", rules}, run_dir + "/nft.log");
  } catch (...) {
    ::close(fd);
    throw;
  }
  return fd;
}

void mend_host(int& netns_fd, const std::string& run_dir) {
  if (netns_fd < 0) return;
  try {
    nft_in(netns_fd, {"delete", "table", "inet", kCutTable}, run_dir + "/nft.log");
  } catch (const std::exception&) {
    // The namespace went away with its host (netns-hosts.sh down): nothing left to mend.
  }
  ::close(netns_fd);
  netns_fd = -1;
}

// The fault in progress: what was done, and when the job must show it trains again.
struct Pending {
  bool active = false;  // a fault is in progress
  FaultKind kind = FaultKind::kKill;
  Clock::time_point at{};         // injected
  Clock::time_point resume_at{};  // a stop's SIGCONT; the kill itself for a kill
  int64_t stopped_pid = 0;        // a stopped worker, still to continue
  std::string filled;             // a disk fault's file, still to remove
  int cut_netns = -1;             // a cut host's network namespace, still to mend
  bool ended = false;             // SIGCONT sent, the disk freed, the host mended (or a kill)
  bool recovered = false;         // the job trained again after it
  // Where the job was when the fault ended.
  int64_t lines = 0, attempt = -1;
  uint64_t calls = 0;
};

// Whether the job trains again after `p`: after a kill, a sample of a later attempt (a restarted
// or re-formed job: the lines its survivors were writing do not count); after a stop, any new
// sample; after a cut, either (the others re-formed without the host, or all went on once it was
// back); in a job that logs none, a completed call after the fault ended.
bool trains_again(const Pending& p, const LogTail& log, uint64_t calls) {
  if (log.lines() == 0) return p.ended && calls > p.calls;
  switch (p.kind) {
    case FaultKind::kKill:
    case FaultKind::kStore:
      return log.attempt() > p.attempt;
    case FaultKind::kCut:
      return log.attempt() > p.attempt || (p.ended && log.lines() > p.lines);
    case FaultKind::kStop:
    case FaultKind::kDisk:
      return p.ended && log.lines() > p.lines;
  }
  return false;
}

// SIGKILL to the host of the job's store: the process listening on the workers' MASTER_PORT and,
// when it runs on an emulated host, every process there. Returns what it did.
std::string kill_store_host(int64_t job, const std::vector<Worker>& workers) {
  int port = -1;
  for (const Worker& w : workers)
    if (port <= 0) port = integer_in_environment(w.pid, "MASTER_PORT");
  if (port <= 0 || port > 65535)
    throw InvalidArgumentError(
        "dtrain chaos: a store fault kills the host of the job's store, found as the process "
        "listening on the workers' MASTER_PORT, which their environment does not name");
  const int64_t store = listener_of(job, static_cast<uint16_t>(port));
  if (store == 0)
    throw InvalidArgumentError(fmt::format(
        "dtrain chaos: a store fault kills the host of the job's store, but no process of the "
        "job listens on the workers' MASTER_PORT {}",
        port));
  const auto ns = netns_of(store);
  const std::string what = fmt::format("the store's host: pid {} ({}, listening on port {})", store,
                                       command_name(store), port);
  if (!ns || netns_of("/proc/self/ns/net") == ns) {
    ::kill(static_cast<pid_t>(store), SIGKILL);
    return "SIGKILL to " + what;
  }
  const std::vector<int64_t> host = processes_in(*ns);
  for (const int64_t pid : host) ::kill(static_cast<pid_t>(pid), SIGKILL);
  return fmt::format("SIGKILL to {} and every process of its host {} ({} in all)", what,
                     netns_name(*ns), host.size());
}

// Fills the file system of `dir` with one file (DIR/.dtrain-chaos-fill) of all its free space;
// returns the file's path and its size.
std::pair<std::string, uint64_t> fill_file_system(const std::string& dir) {
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0)
    throw InvalidArgumentError(
        fmt::format("dtrain chaos: --fill-dir {}: {}", dir, std::strerror(errno)));
  const uint64_t free = uint64_t{s.f_bavail} * s.f_frsize;
  const std::string path = dir + "/.dtrain-chaos-fill";
  const int fd = open_output(path);
  // Without fallocate (some file systems), written out until the disk says it is full.
  if (::posix_fallocate(fd, 0, static_cast<off_t>(free)) != 0) {
    const std::vector<char> zeros(1 << 20, 0);
    while (::write(fd, zeros.data(), zeros.size()) > 0) {
    }
  }
  ::close(fd);
  return {path, free};
}

void free_file_system(Pending& p) {
  if (p.filled.empty()) return;
  std::error_code ignored;  // removed already: nothing to free
  fs::remove(p.filled, ignored);
  p.filled.clear();
}

ChaosRun run_job(const ChaosOptions& o, const std::string& name, bool with_faults) {
  ChaosRun run;
  run.name = name;
  run.dir = o.dir + "/" + name;
  fs::remove_all(run.dir);
  fs::create_directories(run.dir + "/flight");
  const std::string samples = run.dir + "/samples.log";
  const int out = open_output(run.dir + "/stdout.log");
  const int err = open_output(run.dir + "/stderr.log");

  SpawnOptions so;
  so.path = find_executable(o.command[0]);
  so.argv = o.command;
  for (std::string& arg : so.argv)
    for (size_t at = arg.find("{run}"); at != std::string::npos;
         at = arg.find("{run}", at + name.size()))
      arg.replace(at, 5, name);
  so.env = {{std::string(env::kFlightDir.name), run.dir + "/flight"},
            {std::string(env::kSampleLog.name), samples}};
  so.stdout_fd = out;
  so.stderr_fd = err;
  so.die_with_parent = true;
  const auto start = Clock::now();
  const Spawned job = spawn(so);
  ::close(out);
  ::close(err);
  if (!job.failure.empty()) {
    ::waitpid(job.pid, nullptr, 0);
    throw InvalidArgumentError("dtrain chaos: " + job.failure);
  }
  say(o.out_fd, fmt::format("{} run started (pid {}; its output: {})", name, job.pid, run.dir));

  FaultClock clock(o.schedule, o.seed);
  LogTail log(samples);
  std::optional<Clock::time_point> training;    // the first sample logged
  std::optional<Clock::time_point> first_call;  // a worker's first completed call
  Pending pending;
  int status = 0;
  bool timed_out = false;
  std::string failure;  // a fault that could not be injected: the run stops
  // Stops the job (SIGTERM, SIGKILL 3 s later) and undoes the fault in progress.
  auto stop_job = [&] {
    ::kill(-job.pid, SIGTERM);
    if (pending.active && pending.stopped_pid > 0)
      ::kill(static_cast<pid_t>(pending.stopped_pid), SIGCONT);
    free_file_system(pending);
    mend_host(pending.cut_netns, run.dir);
    std::this_thread::sleep_for(std::chrono::seconds(3));
    ::kill(-job.pid, SIGKILL);
    ::waitpid(job.pid, &status, 0);
  };
  while (true) {
    const pid_t done = ::waitpid(job.pid, &status, WNOHANG);
    if (done == job.pid) break;
    const auto now = Clock::now();
    const int64_t lines_before = log.lines();
    log.poll();
    if (log.lines() != lines_before) run.progress.emplace_back(seconds_since(start), log.lines());
    if (log.lines() > 0 && !training) training = now;
    // For a job that logs no samples, its calls tell how far it has come.
    const uint64_t calls =
        log.lines() > 0 || !with_faults ? 0 : completed_calls(run.dir + "/flight");
    if (!training && !first_call && calls > 0) first_call = now;
    if (!training && first_call && now - *first_call >= kSampleGrace) {
      training = first_call;
      say(o.out_fd, fmt::format("{} run: no sample logged {} s after the workers' first call (the "
                                "job keeps no sample log?): the schedule counts from that call",
                                name, kSampleGrace.count()));
    }
    if (pending.active && !pending.ended && now >= pending.resume_at) {
      if (pending.stopped_pid > 0) ::kill(static_cast<pid_t>(pending.stopped_pid), SIGCONT);
      free_file_system(pending);
      if (pending.cut_netns >= 0) {
        mend_host(pending.cut_netns, run.dir);
        say(o.out_fd, fmt::format("{} run: the host is back on the network", name));
      }
      pending.ended = true;
      pending.lines = log.lines();
      pending.calls = calls;
    }
    if (pending.active && !pending.recovered && trains_again(pending, log, calls)) {
      run.recovery_s.push_back(std::chrono::duration<double>(now - pending.at).count());
      ++run.recovered;
      pending.recovered = true;
      say(o.out_fd, fmt::format("{} run: training again {:.2f} s after the fault", name,
                                run.recovery_s.back()));
    }
    if (pending.active && pending.ended && pending.recovered) pending = {};
    if (with_faults && training && !pending.active && run.faults != o.max_faults &&
        now - *training >= clock.next().at) {
      const std::string flight = run.dir + "/flight";
      const auto workers = has_beats(flight) ? running_workers(flight) : workers_under(job.pid);
      if (!workers.empty()) {
        const FaultRule& rule = clock.fire();
        const Worker victim = workers[clock.pick(workers.size())];
        const double into = seconds_since(*training);
        Pending p{.active = true,
                  .kind = rule.kind,
                  .at = now,
                  .resume_at = now,
                  .lines = log.lines(),
                  .attempt = log.attempt(),
                  .calls = calls};
        if (rule.kind == FaultKind::kKill) {
          ::kill(static_cast<pid_t>(victim.pid), SIGKILL);
          p.ended = true;
          say(o.out_fd, fmt::format("{} run, {:.1f} s into training: SIGKILL to {}", name, into,
                                    victim.describe()));
        } else if (rule.kind == FaultKind::kCut) {
          const auto ns = netns_of(victim.pid);
          try {
            p.cut_netns = cut_host(victim, run.dir);
          } catch (const std::exception& e) {
            failure = e.what();
          }
          p.resume_at = now + rule.lasting;
          if (failure.empty())
            say(o.out_fd,
                fmt::format("{} run, {:.1f} s into training: cut the host of {}, {}, "
                            "off the network for {:g} s",
                            name, into, victim.describe(), ns ? netns_name(*ns) : "gone meanwhile",
                            rule.lasting.count() / 1000.0));
        } else if (rule.kind == FaultKind::kStore) {
          try {
            const std::string did = kill_store_host(job.pid, workers);
            p.ended = true;
            say(o.out_fd, fmt::format("{} run, {:.1f} s into training: {}", name, into, did));
          } catch (const std::exception& e) {
            failure = e.what();
          }
        } else if (rule.kind == FaultKind::kDisk) {
          uint64_t bytes = 0;
          std::tie(p.filled, bytes) = fill_file_system(o.fill_dir);
          p.resume_at = now + rule.lasting;
          say(o.out_fd, fmt::format("{} run, {:.1f} s into training: filled the file system of {} "
                                    "({:.1f} MiB) for {:g} s",
                                    name, into, o.fill_dir, static_cast<double>(bytes) / (1 << 20),
                                    rule.lasting.count() / 1000.0));
        } else {
          ::kill(static_cast<pid_t>(victim.pid), SIGSTOP);
          p.stopped_pid = victim.pid;
          p.resume_at = now + rule.lasting;
          say(o.out_fd, fmt::format("{} run, {:.1f} s into training: SIGSTOP to {} for {:g} s",
                                    name, into, victim.describe(), rule.lasting.count() / 1000.0));
        }
        ++run.faults;
        const double injected = seconds_since(start);
        run.fault_spans.emplace_back(
            injected, injected + std::chrono::duration<double>(p.resume_at - p.at).count());
        pending = p;
        if (!failure.empty()) {
          say(o.out_fd, fmt::format("{} run: stopping it: its fault cannot be injected", name));
          stop_job();
          throw InvalidArgumentError(failure);
        }
      }
    }
    if (now - start > o.timeout) {
      timed_out = true;
      say(o.out_fd, fmt::format("{} run: still running after {} s (the timeout): stopping it", name,
                                o.timeout.count()));
      stop_job();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  free_file_system(pending);              // the job ended while the disk was full
  mend_host(pending.cut_netns, run.dir);  // or while its host was cut off
  run.wall_s = seconds_since(start);
  run.exit_code = timed_out           ? 124
                  : WIFEXITED(status) ? WEXITSTATUS(status)
                                      : 128 + WTERMSIG(status);
  // A fault after the last step (the job evaluating, saving) is survived when the job ends well.
  if (pending.active && !pending.recovered && run.exit_code == 0) ++run.recovered;
  if (with_faults && run.faults == 0)
    say(o.out_fd, fmt::format("{} run: the job ended before its first fault was due ({:g} s into "
                              "training): give it more to do, or the schedule shorter times",
                              name, clock.next().at.count() / 1000.0));
  run.final_loss = result_number(run.dir + "/stdout.log", "final_loss");
  run.eval_loss = result_number(run.dir + "/stdout.log", "eval_loss");
  if (file_size(samples) > 0) {
    run.ledger = SampleLedger::read(samples);
    int64_t trained = 0;
    for (const auto& [sample, times] : run.ledger->trained) trained += times;
    run.goodput_in_run = goodput_in_run(run.progress, trained, run.fault_spans);
    // For a plot of the run's pace: where each fault slowed it, and for how long.
    std::ofstream out(run.dir + "/progress.tsv");
    out << "seconds\tsamples_logged\n";
    for (const auto& [seconds, lines] : run.progress) out << seconds << '\t' << lines << '\n';
  }
  say(o.out_fd,
      fmt::format(
          "{} run ended with exit code {} after {:.1f} s{}", name, run.exit_code, run.wall_s,
          run.faults > 0 ? fmt::format(" ({} fault(s), {} recovered)", run.faults, run.recovered)
                         : ""));
  return run;
}

}  // namespace

std::optional<double> goodput_in_run(const std::vector<std::pair<double, int64_t>>& progress,
                                     int64_t trained,
                                     const std::vector<std::pair<double, double>>& fault_spans,
                                     const PaceOptions& options) {
  if (progress.empty() || trained <= 0) return std::nullopt;
  const double first = progress.front().first, last = progress.back().first;
  // The stretches: from the first sample, or a fault lifted, to the next fault (or the end).
  std::vector<std::pair<double, double>> stretches;
  double from = first;
  for (const auto& [at, lifted] : fault_spans) {
    stretches.emplace_back(from + options.settle_s, at);
    from = std::max(from, lifted);
  }
  stretches.emplace_back(from + options.settle_s, last);
  std::vector<double> paces;
  for (const auto& [begin, end] : stretches) {
    if (end - begin < options.min_stretch_s) continue;
    // Least squares of lines against time over the stretch's entries, centred for precision.
    double n = 0, st = 0, sl = 0;
    for (const auto& [t, lines] : progress)
      if (t >= begin && t <= end) n += 1, st += t, sl += static_cast<double>(lines);
    if (n < 3) continue;
    const double mt = st / n, ml = sl / n;
    double stt = 0, stl = 0;
    for (const auto& [t, lines] : progress)
      if (t >= begin && t <= end) {
        stt += (t - mt) * (t - mt);
        stl += (t - mt) * (static_cast<double>(lines) - ml);
      }
    if (stt > 0) paces.push_back(stl / stt);
  }
  if (paces.empty()) return std::nullopt;
  std::sort(paces.begin(), paces.end());
  const size_t n = paces.size();
  const double pace = n % 2 == 1 ? paces[n / 2] : (paces[n / 2 - 1] + paces[n / 2]) / 2;
  if (pace <= 0 || last <= first) return std::nullopt;
  return static_cast<double>(trained) / pace / (last - first);
}

ChaosReport run_chaos(const ChaosOptions& options) {
  if (options.command.empty())
    throw InvalidArgumentError("dtrain chaos needs the job's command after --");
  const bool disk = std::any_of(options.schedule.begin(), options.schedule.end(),
                                [](const FaultRule& r) { return r.kind == FaultKind::kDisk; });
  if (disk && (options.fill_dir.empty() || !fs::is_directory(options.fill_dir)))
    throw InvalidArgumentError(fmt::format(
        "dtrain chaos: disk faults fill the file system of --fill-dir DIR, a directory on the "
        "disk the job writes its checkpoints to{}: give one",
        options.fill_dir.empty() ? "" : fmt::format(" ({} is none)", options.fill_dir)));
  ChaosReport report;
  if (options.baseline) report.baseline = run_job(options, "baseline", false);
  report.faults = run_job(options, "faults", true);
  return report;
}

std::string chaos_line(const ChaosReport& report) {
  using nlohmann::ordered_json;
  const ChaosRun& f = report.faults;
  const ChaosRun* b = report.baseline ? &*report.baseline : nullptr;
  auto optional = [](const std::optional<double>& v) {
    return v ? ordered_json(*v) : ordered_json(nullptr);
  };
  ordered_json line;
  line["faults"] = f.faults;
  line["recovered"] = f.recovered;
  line["goodput"] = b != nullptr && f.exit_code == 0 && b->exit_code == 0
                        ? ordered_json(b->wall_s / f.wall_s)
                        : ordered_json(nullptr);
  line["goodput_in_run"] = optional(f.goodput_in_run);
  line["baseline_goodput_in_run"] =
      b != nullptr ? optional(b->goodput_in_run) : ordered_json(nullptr);
  line["steps_lost"] = f.ledger ? ordered_json(f.ledger->steps_redone) : ordered_json(nullptr);
  if (b != nullptr && b->ledger && f.ledger) {
    const LedgerComparison c = compare_ledgers(*f.ledger, *b->ledger);
    line["samples_lost"] = c.lost;
    line["samples_repeated"] = c.repeated;
  } else {
    line["samples_lost"] = nullptr;
    line["samples_repeated"] = nullptr;
  }
  line["final_loss"] = optional(f.final_loss);
  line["baseline_loss"] = b != nullptr ? optional(b->final_loss) : ordered_json(nullptr);
  line["eval_loss"] = optional(f.eval_loss);
  line["baseline_eval_loss"] = b != nullptr ? optional(b->eval_loss) : ordered_json(nullptr);
  line["recovery_s"] = f.recovery_s;
  line["wall_s"] = f.wall_s;
  line["baseline_wall_s"] = b != nullptr ? ordered_json(b->wall_s) : ordered_json(nullptr);
  line["exit_code"] = f.exit_code;
  return "CHAOS " + line.dump();
}

}  // namespace dtrain::launch
