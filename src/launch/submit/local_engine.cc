#include "launch/submit/local_engine.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/env.h"
#include "dtrain/error.h"
#include "dtrain/preemption.h"
#include "launch/spawn.h"

namespace dtrain::submit {
namespace fs = std::filesystem;

std::string local_script(const Job& job, int port, const std::string& dtrain) {
  const bool notifying = !job.notify.command.empty() || !job.notify.webhook.empty();
  auto event = [&](const std::string& e, const std::string& status) {
    return notifying ? fmt::format("notify {} {}\n", e, status) : "";
  };
  std::string s =
      "#!/bin/bash\n# Written by `dtrain submit --engine local` (`dtrain docs submit`).\nset -u\n"
      "restart=${DTRAIN_QUEUE_RESTART:-0}\n"
      // SIGTERM (dtrain cancel) is passed on to what runs; before anything runs, it stops here.
      "pids=()\nstop=\n"
      "trap 'stop=1; [ ${#pids[@]} -gt 0 ] && kill -TERM \"${pids[@]}\" 2>/dev/null' TERM\n";
  s += notify_function(job, "$DTRAIN_QUEUE_JOB");
  for (const auto& [k, v] : job.env) s += fmt::format("export {}={}\n", k, shell_quote(v));
  s += "echo \"dtrain: job $DTRAIN_QUEUE_JOB (restart $restart) starts on $(hostname)\"\n";
  s += event("start", "$restart");
  s += stage_in_commands(job, notifying);
  s += "[ -n \"$stop\" ] && exit 143\n";
  std::vector<std::string> gpus;
  if (job.gpus_per_proc > 0) gpus = {"--gpus-per-proc", std::to_string(job.gpus_per_proc)};
  if (job.container.empty()) {
    // One machine: the job's nodes are one `dtrain run` with all their ranks.
    std::vector<std::string> run = {dtrain, "run", "-n",
                                    std::to_string(job.nodes * job.procs_per_node)};
    run.insert(run.end(), gpus.begin(), gpus.end());
    s += fmt::format("{} -- {} &\npids+=($!)\n", shell_join(run), shell_join(job.command));
  } else {
    // A container per node, on the host's network (as `docker run --network host`), IPC and pid
    // namespaces (shared memory and cross-memory attach between the ranks of different
    // containers), the working directory mounted where it is.
    std::string env_flags;
    for (const auto& [k, v] : job.env) env_flags += fmt::format(" -e {}", shell_quote(k + "=" + v));
    for (int node = 0; node < job.nodes; ++node) {
      std::vector<std::string> run = {"dtrain",
                                      "run",
                                      "-n",
                                      std::to_string(job.procs_per_node),
                                      "--nnodes",
                                      std::to_string(job.nodes),
                                      "--node-rank",
                                      std::to_string(node),
                                      "--master-addr",
                                      "127.0.0.1",
                                      "--master-port",
                                      std::to_string(port)};
      run.insert(run.end(), gpus.begin(), gpus.end());
      s += fmt::format(
          "podman run --rm --name \"{}-$DTRAIN_QUEUE_JOB-{}\" "
          "--network host --ipc host --pid host{} -v \"$PWD:$PWD\" -w \"$PWD\" {} {} -- {} &\n"
          "pids+=($!)\n",
          job.name, node, env_flags, shell_quote(job.container), shell_join(run),
          shell_join(job.command));
    }
  }
  // A SIGTERM that came while they started; then the first failure is the job's status (a
  // rank's peers fail soon after it, naming it).
  s += "[ -n \"$stop\" ] && kill -TERM \"${pids[@]}\" 2>/dev/null\n"
       "status=0\n"
       "for p in \"${pids[@]}\"; do\n"
       "  wait \"$p\"; s=$?\n"
       "  while kill -0 \"$p\" 2>/dev/null; do wait \"$p\"; s=$?; done\n"
       "  [ \"$status\" -eq 0 ] && status=$s\n"
       "done\n";
  s += stage_out_commands(job);
  if (job.preemptible)
    s += fmt::format(
        "if [ \"$status\" -eq {0} ] && [ \"$restart\" -lt {1} ] && "
        "[ ! -e \"$DTRAIN_QUEUE_CANCEL\" ]; then\n"
        "  echo \"dtrain: job $DTRAIN_QUEUE_JOB saved its state for a requeue (restart $restart "
        "of {1}); requeueing\"\n{2}"
        "  exit \"$status\"\n"
        "fi\n",
        Preemption::kRequeueExitCode, job.max_restarts, event("requeue", "\"$status\""));
  if (notifying)
    s += "if [ \"$status\" -eq 0 ]; then notify end 0; else notify failure \"$status\"; fi\n";
  return s + "exit \"$status\"\n";
}

namespace {

// This program, for the job scripts and the runner.
std::string self_executable() {
  std::error_code ec;
  auto self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "dtrain" : self.string();
}

std::string queue_dir() {
  std::string dir = env::get_string(env::kQueueDir);
  if (dir.empty()) {
    const char* state = std::getenv("XDG_STATE_HOME");
    const char* home = std::getenv("HOME");
    dir = state != nullptr && *state != '\0'
              ? std::string(state) + "/dtrain/queue"
              : std::string(home != nullptr ? home : "/tmp") + "/.local/state/dtrain/queue";
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw InvalidArgumentError(fmt::format(
        "dtrain: cannot make the local queue {}: {}; set DTRAIN_QUEUE_DIR", dir, ec.message()));
  return dir;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::string s(std::istreambuf_iterator<char>(in), {});
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Replaces the file whole (a reader sees the old text or the new).
void write_text(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text << "\n";
    f.flush();
    if (!f)
      throw InvalidArgumentError(
          fmt::format("dtrain: cannot write {}: {}", tmp.string(), std::strerror(errno)));
  }
  fs::rename(tmp, path);
}

void check_id(const std::string& id) {
  if (!std::regex_match(id, std::regex("[0-9]{1,9}")))
    throw InvalidArgumentError(fmt::format("dtrain: '{}' is not a local job id", id));
}

fs::path job_dir(const std::string& id) {
  check_id(id);
  fs::path dir = fs::path(queue_dir()) / id;
  if (!fs::exists(dir / "state"))
    throw InvalidArgumentError(
        fmt::format("dtrain: no local job {} in {} (dtrain jobs --engine local lists them)", id,
                    dir.parent_path().string()));
  return dir;
}

// Job ids in submission order.
std::vector<int> job_ids(const std::string& queue) {
  std::vector<int> ids;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(queue, ec)) {
    const std::string n = e.path().filename().string();
    if (std::regex_match(n, std::regex("[0-9]{1,9}")) && fs::exists(e.path() / "state"))
      ids.push_back(std::stoi(n));
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

// Starts `dtrain queue-runner` detached from this process (its own session, output to
// QUEUE/runner.log), so that it outlives the submit.
void start_runner(const std::string& queue) {
  const std::string exe = self_executable();
  const launch::Spawned runner = launch::spawn({.path = exe,
                                                .argv = {exe, "queue-runner"},
                                                .output_file = queue + "/runner.log",
                                                .detach = true});
  if (!runner.failure.empty())
    throw InvalidArgumentError(fmt::format(
        "dtrain submit: the job is queued but no runner could be started ({}); the next submit "
        "starts one",
        runner.failure));
}

// When the process started (field 22 of /proc/PID/stat, in clock ticks since boot): a pid and
// this name one process, not whichever reuses the pid later. "" when it is gone.
std::string process_start(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  const auto paren = stat.rfind(')');  // the name may hold spaces and parentheses
  if (paren == std::string::npos) return "";
  std::istringstream fields(stat.substr(paren + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
  }
  return field;
}

// The submitter's environment, NUL-separated, for the job to run in (as sbatch exports it).
std::string environment_text() {
  std::string text;
  for (char** e = environ; *e != nullptr; ++e) text += std::string(*e) + '\0';
  return text;
}

}  // namespace

std::string submit_local(const Job& job, bool dry_run) {
  job.validate();
  if (!job.partition.empty() || !job.constraint.empty() || !job.notify.mail.empty())
    throw InvalidArgumentError(
        "dtrain submit --engine local: --partition, --constraint and --mail are a cluster's; "
        "this machine's queue has none of them");
  if (dry_run) {
    std::fputs(local_script(job, 20000, self_executable()).c_str(), stdout);
    return "";
  }
  const std::string queue = queue_dir();
  // The next id: the first number after the highest that mkdir can make (two submits at once
  // get different ones).
  const auto ids = job_ids(queue);
  int id = ids.empty() ? 1 : ids.back() + 1;
  for (; ::mkdir((fs::path(queue) / std::to_string(id)).c_str(), 0755) != 0; ++id)
    if (errno != EEXIST)
      throw InvalidArgumentError(
          fmt::format("dtrain submit: cannot add a job to {}: {}", queue, std::strerror(errno)));
  const fs::path dir = fs::path(queue) / std::to_string(id);
  std::error_code ec;
  fs::create_directories(job.log_dir, ec);
  const fs::path log = fs::absolute(fs::path(job.log_dir) / fmt::format("{}-{}.out", job.name, id));
  write_text(dir / "job.sh", local_script(job, 20000 + id % 10000, self_executable()));
  write_text(dir / "name", job.name);
  write_text(dir / "cwd", fs::current_path().string());
  write_text(dir / "log", log.string());
  write_text(dir / "ranks", std::to_string(job.nodes * job.procs_per_node));
  write_text(dir / "restarts", "0");
  write_text(dir / "max-restarts", std::to_string(job.preemptible ? job.max_restarts : 0));
  write_text(dir / "submitted", std::to_string(std::time(nullptr)));
  {
    std::ofstream env(dir / "environ", std::ios::binary | std::ios::trunc);
    env << environment_text();
  }
  write_text(dir / "state", "queued");  // last: the runner takes the job from here on
  std::printf(
      "submitted job %d to this machine's queue (%s): %s, %d node(s) x %d rank(s)%s; "
      "output %s\n",
      id, queue.c_str(), job.name.c_str(), job.nodes, job.procs_per_node,
      job.container.empty() ? "" : (", container " + job.container).c_str(), log.c_str());
  std::fflush(stdout);
  start_runner(queue);
  return std::to_string(id);
}

void local_jobs() {
  const std::string queue = queue_dir();
  std::printf("%-6s %-24s %-10s %-8s %-6s %s\n", "JOB", "NAME", "STATE", "RESTARTS", "RANKS",
              "OUTPUT");
  for (int id : job_ids(queue)) {
    const fs::path dir = fs::path(queue) / std::to_string(id);
    std::string state = read_text(dir / "state");
    if (state == "succeeded" || state == "failed") state += " (" + read_text(dir / "exit") + ")";
    std::printf("%-6d %-24s %-10s %-8s %-6s %s\n", id, read_text(dir / "name").c_str(),
                state.c_str(), read_text(dir / "restarts").c_str(),
                read_text(dir / "ranks").c_str(), read_text(dir / "log").c_str());
  }
}

void local_logs(const std::string& id) {
  const fs::path dir = job_dir(id);
  const std::string log = read_text(dir / "log");
  std::ifstream in(log, std::ios::binary);
  if (!in) {
    std::printf("job %s is %s: no output yet (%s)\n", id.c_str(), read_text(dir / "state").c_str(),
                log.c_str());
    return;
  }
  std::fputs(std::string(std::istreambuf_iterator<char>(in), {}).c_str(), stdout);
}

void local_cancel(const std::string& id) {
  const fs::path dir = job_dir(id);
  // The runner reads the marker: a queued job is never started, a running one is stopped.
  write_text(dir / "cancel", "1");
  const std::string state = read_text(dir / "state");
  if (state == "running") {
    const pid_t pid = std::atoi(read_text(dir / "pid").c_str());
    // The job's shell only: it passes SIGTERM on to `dtrain run` (or podman) once, and they to
    // the ranks; a second SIGTERM straight to the launcher would cut its grace short. Only
    // while that pid is still the job's shell (not a process that took the number later).
    if (pid > 1 && process_start(pid) == read_text(dir / "started")) ::kill(pid, SIGTERM);
    std::printf("stopping job %s (SIGTERM to its processes; they may save and exit)\n", id.c_str());
  } else if (state == "queued") {
    std::printf("cancelled job %s before it started\n", id.c_str());
  } else {
    std::printf("job %s had already ended (%s)\n", id.c_str(), state.c_str());
  }
}

int run_local_queue() {
  const std::string queue = queue_dir();
  const int lock = ::open((queue + "/runner.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock < 0) return 1;
  const int cpus = std::max(1u, std::thread::hardware_concurrency());
  struct Running {
    int id;
    int ranks;
  };
  std::map<pid_t, Running> running;
  for (;;) {
    if (::flock(lock, LOCK_EX | LOCK_NB) != 0) return 0;  // another runner has the queue
    // Jobs a runner before this one started and never saw end (it was killed, the machine
    // rebooted): nobody will record their end.
    for (int id : job_ids(queue)) {
      const fs::path dir = fs::path(queue) / std::to_string(id);
      if (read_text(dir / "state") != "running") continue;
      bool ours = false;
      for (const auto& [pid, r] : running) ours = ours || r.id == id;
      if (ours) continue;
      std::fprintf(stderr,
                   "dtrain queue: job %d was running under a runner that is gone; "
                   "marked lost\n",
                   id);
      write_text(dir / "exit", "?");
      write_text(dir / "state", "lost");
    }
    for (;;) try {
        // Reap the jobs that ended.
        int status = 0;
        for (pid_t pid; (pid = ::waitpid(-1, &status, WNOHANG)) > 0;) {
          const auto it = running.find(pid);
          if (it == running.end()) continue;
          const fs::path dir = fs::path(queue) / std::to_string(it->second.id);
          const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          const int restarts = std::atoi(read_text(dir / "restarts").c_str());
          write_text(dir / "exit", std::to_string(code));
          if (fs::exists(dir / "cancel")) {
            write_text(dir / "state", "cancelled");
          } else if (code == Preemption::kRequeueExitCode &&
                     restarts < std::atoi(read_text(dir / "max-restarts").c_str())) {
            write_text(dir / "restarts", std::to_string(restarts + 1));
            write_text(dir / "state", "queued");
          } else {
            write_text(dir / "state", code == 0 ? "succeeded" : "failed");
          }
          running.erase(it);
        }
        // Start what fits, in order; the first that does not fit waits (no overtaking).
        int used = 0;
        for (const auto& [pid, r] : running) used += r.ranks;
        bool queued = false;
        for (int id : job_ids(queue)) {
          const fs::path dir = fs::path(queue) / std::to_string(id);
          if (read_text(dir / "state") != "queued") continue;
          if (fs::exists(dir / "cancel")) {
            write_text(dir / "state", "cancelled");
            continue;
          }
          queued = true;
          const int ranks = std::atoi(read_text(dir / "ranks").c_str());
          if (!running.empty() && used + ranks > cpus) break;
          const std::string restarts = read_text(dir / "restarts");
          const std::string log = read_text(dir / "log");
          const std::string cwd = read_text(dir / "cwd");
          const std::string script = (dir / "job.sh").string();
          launch::SpawnOptions job{.path = "/bin/bash",
                                   .argv = {"bash", script},
                                   .inherit_environment = false,
                                   .cwd = cwd,
                                   .output_file = log};  // its own group: cancel signals it
          {
            std::ifstream in(dir / "environ", std::ios::binary);
            for (std::string e; std::getline(in, e, '\0');) {
              const size_t eq = e.find('=');
              if (eq != std::string::npos && !e.starts_with("DTRAIN_QUEUE_"))
                job.env.emplace_back(e.substr(0, eq), e.substr(eq + 1));
            }
          }
          job.env.emplace_back("DTRAIN_QUEUE_JOB", std::to_string(id));
          job.env.emplace_back("DTRAIN_QUEUE_RESTART", restarts);
          job.env.emplace_back("DTRAIN_QUEUE_CANCEL", (dir / "cancel").string());
          const launch::Spawned started = launch::spawn(job);
          const pid_t pid = started.pid;
          if (!started.failure.empty())
            std::fprintf(stderr, "dtrain queue-runner: job %d: %s\n", id, started.failure.c_str());
          if (pid < 0) break;
          write_text(dir / "pid", std::to_string(pid));
          write_text(dir / "started", process_start(pid));
          write_text(dir / "state", "running");
          running[pid] = {id, ranks};
          used += ranks;
          // A cancel that read "queued" just before this job started.
          if (fs::exists(dir / "cancel")) ::kill(pid, SIGTERM);
        }
        if (running.empty() && !queued) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      } catch (const std::exception& e) {
        // A full disk under the queue, a job folder removed by hand: say so, keep running the
        // jobs that are running.
        std::fprintf(stderr, "dtrain queue: %s\n", e.what());
        std::fflush(stderr);
        std::this_thread::sleep_for(std::chrono::seconds(1));
      }
    // Let go of the queue, then look once more: a job submitted while this runner was deciding
    // to stop found the lock held and started no runner of its own.
    ::flock(lock, LOCK_UN);
    bool more = false;
    for (int id : job_ids(queue))
      more = more || read_text(fs::path(queue) / std::to_string(id) / "state") == "queued";
    if (!more) return 0;
  }
}

}  // namespace dtrain::submit
