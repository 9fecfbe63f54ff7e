#include "slurm_cluster.h"

#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "command.h"
#include "support/multiproc.h"

namespace dtrain::testing {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

constexpr std::string_view kMarker = "DTRAIN_TEST_SLURM";
constexpr std::string_view kDirPrefix = "/tmp/dtrain-slurm-";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const std::string& path, const std::string& text, mode_t mode = 0644) {
  std::ofstream(path, std::ios::binary) << text;
  ::chmod(path.c_str(), mode);
}

std::string tail(const std::string& text, int lines) {
  size_t pos = text.size();
  for (int n = 0; n <= lines && pos != std::string::npos && pos > 0; ++n)
    pos = text.rfind('\n', pos - 1);
  return pos == std::string::npos ? text : text.substr(pos + 1);
}

// The directory a cluster's processes carry: their working directory (slurmd, slurmstepd) or
// the marker variable (the daemons, srun, sbatch and every task), or "" when neither.
std::string cluster_dir_of(pid_t pid) {
  std::error_code ec;
  fs::path cwd = fs::read_symlink(fmt::format("/proc/{}/cwd", pid), ec);
  if (!ec && cwd.string().starts_with(kDirPrefix)) return cwd.string();
  std::string environ_text = read_file(fmt::format("/proc/{}/environ", pid));
  std::string key = std::string(kMarker) + "=";
  for (size_t at = 0; at < environ_text.size();) {
    size_t end = environ_text.find('\0', at);
    if (end == std::string::npos) end = environ_text.size();
    std::string_view entry(environ_text.data() + at, end - at);
    if (entry.starts_with(key)) return std::string(entry.substr(key.size()));
    at = end + 1;
  }
  return "";
}

std::vector<pid_t> all_pids() {
  std::vector<pid_t> pids;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return pids;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long v = std::strtol(e->d_name, &end, 10);
    if (*end == '\0' && v > 0 && v != ::getpid()) pids.push_back(static_cast<pid_t>(v));
  }
  ::closedir(d);
  return pids;
}

// The pid in "/tmp/dtrain-slurm-<pid>-XXXXXX/...", or 0.
pid_t owner_of(const std::string& dir) {
  if (!dir.starts_with(kDirPrefix)) return 0;
  return static_cast<pid_t>(std::strtol(dir.c_str() + kDirPrefix.size(), nullptr, 10));
}

bool alive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

// SIGKILLs every process whose cluster directory satisfies `match`, until none is left (5 s at
// most: a zombie keeps its /proc entry but no longer its cwd or environ).
void kill_matching(const std::function<bool(const std::string&)>& match) {
  const auto end = Clock::now() + std::chrono::seconds(5);
  for (;;) {
    int found = 0;
    for (pid_t pid : all_pids()) {
      std::string dir = cluster_dir_of(pid);
      if (dir.empty() || !match(dir)) continue;
      ::kill(pid, SIGKILL);
      ++found;
    }
    if (found == 0 || Clock::now() > end) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// Clusters of tests that were killed before their destructor ran: their job steps and tasks,
// and their directories.
void sweep_stale_clusters() {
  auto stale = [](const std::string& dir) { return !alive(owner_of(dir)); };
  kill_matching(stale);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/tmp", ec)) {
    std::string path = entry.path().string();
    if (path.starts_with(kDirPrefix) && stale(path)) fs::remove_all(path, ec);
  }
}

std::string short_hostname() {
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "";
  std::string h = host;
  return h.substr(0, h.find('.'));
}

bool resolves(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  ::freeaddrinfo(res);
  return true;
}

}  // namespace

SlurmCluster::SlurmCluster(std::chrono::milliseconds timeout) {
  sweep_stale_clusters();
  if (::geteuid() != 0) {
    skip_reason_ = "the throwaway Slurm needs root (its daemons run as SlurmUser=root)";
    return;
  }
  for (const char* program :
       {"munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo", "scontrol", "scancel"}) {
    if (find_program(program).empty()) {
      skip_reason_ = fmt::format(
          "{} is not installed (Debian: apt-get install slurm-wlm munge, "
          "as scripts/install-deps.sh does)",
          program);
      return;
    }
  }
  node_ = short_hostname();
  if (node_.empty() || !resolves(node_)) {
    skip_reason_ = fmt::format(
        "this host's short name '{}' does not resolve, so a node list "
        "naming it names no reachable master (add it to /etc/hosts)",
        node_);
    return;
  }
  std::string pattern = fmt::format("{}{}-XXXXXX", kDirPrefix, ::getpid());
  if (::mkdtemp(pattern.data()) == nullptr) {
    skip_reason_ = fmt::format("mkdtemp {}: {}", pattern, std::strerror(errno));
    return;
  }
  dir_ = pattern;
  up_ = start(timeout);
  if (!up_) stop();
}

SlurmCluster::~SlurmCluster() {
  if (!dir_.empty()) stop();
}

std::map<std::string, std::optional<std::string>> SlurmCluster::client_env() const {
  return {{"SLURM_CONF", dir_ + "/slurm.conf"}, {std::string(kMarker), dir_}};
}

pid_t SlurmCluster::spawn(const std::string& name, const std::vector<std::string>& argv) {
  std::vector<std::string> env = clean_environment(client_env());
  std::vector<std::string> args = argv;
  args[0] = find_program(args[0]);
  std::vector<char*> argp, envp;
  for (auto& a : args) argp.push_back(a.data());
  argp.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string out = fmt::format("{}/log/{}.out", dir_, name);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the daemons never outlive the test
    if (::getppid() != parent) ::_exit(126);
    int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (fd < 0 || devnull < 0 || ::chdir(dir_.c_str()) != 0) ::_exit(126);
    ::dup2(devnull, 0);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execve(argp[0], argp.data(), envp.data());
    ::_exit(127);
  }
  if (pid > 0) daemons_.emplace_back(name, pid);
  return pid;
}

bool SlurmCluster::start(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (const char* sub : {"munge", "state", "spool", "log"})
    fs::create_directories(dir_ + "/" + sub);
  ::chmod((dir_ + "/munge").c_str(), 0700);
  ::chmod(dir_.c_str(), 0755);  // munged wants the socket's directories searchable

  // A key of our own: the machine's /etc/munge/munge.key may be missing or owned by munge.
  std::string key(128, '\0');
  std::ifstream("/dev/urandom", std::ios::binary).read(key.data(), key.size());
  write_file(dir_ + "/munge/munge.key", key, 0600);
  const std::string socket = dir_ + "/munge/munge.socket";
  spawn("munged",
        {"munged", "--foreground", "--force", "--socket=" + socket,
         "--key-file=" + dir_ + "/munge/munge.key", "--log-file=" + dir_ + "/log/munged.log",
         "--pid-file=" + dir_ + "/munge/munged.pid", "--seed-file=" + dir_ + "/munge/munged.seed"});

  auto daemon_died = [&]() -> std::string {
    for (const auto& [name, pid] : daemons_) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid)
        return fmt::format("{} exited ({}) during start-up", name,
                           WIFEXITED(status) ? fmt::format("status {}", WEXITSTATUS(status))
                                             : fmt::format("signal {}", WTERMSIG(status)));
    }
    return "";
  };
  auto fail = [&](const std::string& why) {
    skip_reason_ =
        fmt::format("the throwaway Slurm in {} did not come up: {}\n{}", dir_, why, logs());
    return false;
  };

  while (::access(socket.c_str(), F_OK) != 0) {
    if (auto died = daemon_died(); !died.empty()) return fail(died);
    if (Clock::now() > deadline) return fail("munged made no socket");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  const int ctld_port = free_port();
  int slurmd_port = free_port();
  while (slurmd_port == ctld_port) slurmd_port = free_port();
  // Four stand-in GPUs, character devices as Slurm wants (each another /dev/null): it hands
  // them out and sets each task's CUDA_VISIBLE_DEVICES as for real ones. A machine where they
  // cannot be made (no CAP_MKNOD) gets a node without GPUs.
  bool& gpus = gpus_;
  gpus = true;
  for (int g = 0; g < 4 && gpus; ++g)
    gpus = ::mknod(fmt::format("{}/gpu{}", dir_, g).c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0;
  const std::string conf = fmt::format(
      R"(# Written by tests/launch/slurm_cluster.cc: a single-node Slurm for one test.
ClusterName=dtraintest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/log/slurmctld.log
SlurmdLogFile={dir}/log/slurmd.log
PlugStackConfig={dir}/plugstack.conf
TmpFS={dir}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
PropagateResourceLimits=NONE
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
InactiveLimit=0
KillWait=2
MessageTimeout=10
GresTypes=gpu
NodeName={node} NodeAddr=127.0.0.1 CPUs=4 {gres}State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
)",
      fmt::arg("node", node_), fmt::arg("gres", gpus ? "Gres=gpu:4 " : ""),
      fmt::arg("ctld_port", ctld_port), fmt::arg("slurmd_port", slurmd_port),
      fmt::arg("socket", socket), fmt::arg("dir", dir_));
  write_file(dir_ + "/slurm.conf", conf);
  write_file(dir_ + "/plugstack.conf", "");  // not the machine's /etc/slurm/plugstack.conf
  write_file(dir_ + "/gres.conf", gpus ? fmt::format("Name=gpu File={}/gpu[0-3]\n", dir_) : "");

  const std::string conf_path = dir_ + "/slurm.conf";
  spawn("slurmctld", {"slurmctld", "-D", "-i", "-f", conf_path});
  spawn("slurmd", {"slurmd", "-D", "-f", conf_path, "-N", node_});

  CommandOptions o;
  o.env = client_env();
  o.timeout = std::chrono::seconds(5);
  std::string last;
  for (;;) {
    if (auto died = daemon_died(); !died.empty()) return fail(died);
    CommandResult r = run_command({"sinfo", "-h", "-N", "-n", node_, "-o", "%T"}, o);
    last = r.output;
    if (r.ok() && last.starts_with("idle")) return true;
    if (Clock::now() > deadline)
      return fail(fmt::format("node {} not idle after {} ms (sinfo: {})", node_, timeout.count(),
                              last.empty() ? r.describe() : last));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

void SlurmCluster::stop() {
  // The daemons, newest first, politely; then everything that carries this cluster's directory
  // (job steps, tasks, anything a daemon forked) and whatever daemon ignored SIGTERM.
  for (auto it = daemons_.rbegin(); it != daemons_.rend(); ++it) ::kill(it->second, SIGTERM);
  const auto end = Clock::now() + std::chrono::seconds(3);
  for (auto& [name, pid] : daemons_) {
    while (pid > 0) {
      if (::waitpid(pid, nullptr, WNOHANG) == pid) {
        pid = 0;
      } else if (Clock::now() > end) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        pid = 0;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
  daemons_.clear();
  const std::string dir = dir_;
  kill_matching([&dir](const std::string& d) { return d == dir || d.starts_with(dir + "/"); });
  std::error_code ec;
  fs::remove_all(dir_, ec);
  dir_.clear();
}

std::string SlurmCluster::logs() const {
  std::string text;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_ + "/log", ec)) {
    std::string content = read_file(entry.path().string());
    if (content.empty()) continue;
    text +=
        fmt::format("--- {} (last lines)\n{}", entry.path().filename().string(), tail(content, 12));
    if (!text.ends_with('\n')) text += '\n';
  }
  return text;
}

}  // namespace dtrain::testing
