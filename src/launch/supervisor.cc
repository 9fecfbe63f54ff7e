#include "launch/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <regex>
#include <thread>

#include <fmt/format.h>

#include "comm/failure_record.h"
#include "common/env.h"
#include "common/log.h"
#include "dtrain/error.h"
#include "dtrain/preemption.h"
#include "launch/cpu_binding.h"
#include "launch/fork_server.h"
#include "launch/idle_priority.h"

extern char** environ;

namespace dtrain::launch {
namespace {

using std::chrono::milliseconds;

// Time left to read what the workers wrote once they have all exited; a background process they
// left behind that holds a pipe open must not keep the launcher alive.
constexpr milliseconds kDrainTime{1000};
// After the first failure, how long the other workers may fail on their own before they are
// stopped: peers of a failed rank learn of it within milliseconds, and their own errors (or the
// absence of one) are what tells the cause from its consequences.
constexpr milliseconds kSettleTime{250};
// After SIGKILL a process normally vanishes at once; this bounds the wait for one stuck in the
// kernel (uninterruptible I/O), after which the launcher gives up on reaping it.
constexpr milliseconds kReapAfterKillTime{5000};
// A worker that writes a line longer than this gets it split, keeping memory bounded.
constexpr size_t kMaxLine = 64 * 1024;
// A worker's stderr lines that come closer together than this are one burst (a traceback, a
// post-mortem) and are relayed together; a quiet worker's lines wait at most this long, a
// worker that never pauses (a log line every few milliseconds) at most kBurstLimit.
constexpr std::chrono::milliseconds kBurstPause{30};
constexpr std::chrono::milliseconds kBurstLimit{250};

// SIGUSR1 is Slurm's usual early warning of a preemption (`--signal=USR1@90`): passed on as a
// warning (no stop, no SIGKILL after it), so that workers with a dtrain::Preemption save and exit
// for a requeue. SIGTERM, Kubernetes' warning, is passed on and stops the job: SIGKILL follows
// after --grace-period, which must cover a step and a checkpoint.
// SIGUSR2 asks every worker for its flight record (comm/flight_recorder.h) and stops nothing.
int forwarded_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2};

sigset_t supervised_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : forwarded_signals) sigaddset(&set, s);
  sigaddset(&set, SIGCHLD);
  return set;
}

// Writes everything, retrying short writes; a reader that went away (EPIPE) or any other error
// drops the output rather than stopping the supervision of the job.
void write_out(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 1000) <= 0) return;
    } else {
      return;
    }
  }
}

// One of a worker's two output pipes.
struct Stream {
  net::Fd fd;
  int out_fd = -1;  // where its lines are relayed
  bool is_stderr = false;
  std::string partial;  // the line being written, not yet ended by '\n'
  // stderr: complete lines held until the worker pauses (kBurstPause), then relayed in one
  // write, so that two ranks' tracebacks, written line by line at once, do not interleave.
  std::string held;
  std::chrono::steady_clock::time_point first_held, last_read;
  // When the held burst is relayed: after a pause, or once it has been held kBurstLimit.
  std::chrono::steady_clock::time_point due() const {
    return std::min(last_read + kBurstPause, first_held + kBurstLimit);
  }
};

struct Worker {
  int rank = 0;
  std::string label;   // "rank 3", "server 0"
  std::string prefix;  // "[rank 3] ", or empty with prefixing off
  pid_t pid = -1;
  bool running = false;
  bool service = false;  // WorkerSpec::service
  int spare = 0;         // a spare's number while it waits for a place (rank is then no one's)
  int exit_code = 0;     // when it exited
  int signal = 0;        // when a signal ended it
  Stream out, err;
  std::deque<std::string> stderr_tail;
  std::optional<comm::FailureRecord> record;  // its failure record, once read
  bool record_read = false;
};

// Both ends close on exec; the child dup2s the ends it keeps onto 0, 1 and 2.
std::pair<net::Fd, net::Fd> make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw InternalError(fmt::format("dtrain run: pipe2 failed: {}", std::strerror(errno)));
  return {net::Fd(fds[0]), net::Fd(fds[1])};
}

class Run {
 public:
  Run(const SupervisorOptions& options, int signal_fd, const sigset_t& child_mask)
      : options_(options), signal_fd_(signal_fd), child_mask_(child_mask) {}

  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;
  // Workers are still running here only when starting the job failed half-way (an exception):
  // they must not outlive it. A SIGKILLed child is reaped at once, so this wait is short.
  // A worker the loop gave up on (stuck in the kernel past SIGKILL) is not waited for: it is
  // left to init rather than hanging the launcher, and the job, with it.
  ~Run() {
    for (auto& w : workers_) {
      if (!w.running) continue;
      ::kill(-w.pid, SIGKILL);
      for (int i = 0; i < 100 && ::waitpid(w.pid, nullptr, WNOHANG) == 0; ++i)
        std::this_thread::sleep_for(milliseconds(10));
    }
  }

  SupervisorResult execute() {
    path_ = find_executable(options_.command.at(0));
    devnull_ = net::Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    workers_.resize(options_.workers.size());
    for (size_t i = 0; i < workers_.size(); ++i) start(workers_[i], options_.workers[i]);
    // Spares get ready on the cycles the ranks leave, where this launcher can raise them again.
    idle_spares_ = options_.spares > 0 && can_leave_idle_priority();
    spares_pending_ = options_.spares;
    if (!options_.preload.empty() && (options_.spares > 0 || options_.replacements > 0))
      start_fork_server();
    else
      start_pending_spares();
    loop();
    // Processes the stopped workers started may linger in their groups after the workers
    // themselves exited; the job is over, so they go too.
    if (stopping_ && !killed_) signal_all(SIGKILL);
    return finish();
  }

 private:
  // Spares are forked from it once it is ready (launch/fork_server.h).
  void start_fork_server() {
    const WorkerSpec* first = nullptr;
    for (const auto& candidate : options_.workers)
      if (first == nullptr && !candidate.service) first = &candidate;
    ForkServerOptions o{.python = path_,
                        .modules = options_.preload,
                        .env = first != nullptr ? first->env : WorkerSpec{}.env,
                        .stderr_fd = options_.stderr_fd,
                        .signal_mask = &child_mask_};
    fork_server_.emplace(o);
    if (fork_server_->state() == ForkServer::State::kFailed) fork_server_failed();
  }

  void fork_server_failed() {
    write_out(options_.stderr_fd,
              fmt::format("{}: --preload: {}; spares and replacements start as the workers "
                          "did\n",
                          options_.name, fork_server_->failure()));
    fork_server_.reset();
    start_pending_spares();
  }

  void fork_server_word() {
    fork_server_->take_word();
    if (fork_server_->state() == ForkServer::State::kFailed) return fork_server_failed();
    DTRAIN_LOG_INFO(
        "{}: the fork server (pid {}) imported {}; spares and replacements are "
        "forked from it (--preload)",
        options_.name, fork_server_->pid(), fmt::join(options_.preload, ", "));
    start_pending_spares();
  }

  void start_pending_spares() {
    for (; spares_pending_ > 0; --spares_pending_) start_spare();
  }

  // `forkable`: a spare or a replacement, which a ready fork server starts.
  void start(Worker& w, const WorkerSpec& spec, bool idle_priority = false, bool forkable = false) {
    const std::string& path = path_;
    const int devnull = devnull_.get();
    w.rank = spec.rank;
    w.label = spec.label.empty() ? fmt::format("rank {}", w.rank) : spec.label;
    w.service = spec.service;
    if (options_.prefix_output) w.prefix = fmt::format("[{}] ", w.label);
    const std::string own_path = spec.command.empty() ? path : find_executable(spec.command.at(0));
    auto [out_r, out_w] = make_pipe();
    auto [err_r, err_w] = make_pipe();
    w.out.fd = std::move(out_r);
    w.out.out_fd = options_.stdout_fd;
    w.err.fd = std::move(err_r);
    w.err.out_fd = options_.stderr_fd;
    w.err.is_stderr = true;

    const cpu_set_t cpus = to_cpu_set(spec.cpus);
    net::Fd netns;
    if (!spec.netns.empty()) {
      netns = net::Fd(::open(("/run/netns/" + spec.netns).c_str(), O_RDONLY | O_CLOEXEC));
      if (!netns.valid())
        throw InvalidArgumentError(
            fmt::format("{}: the network namespace {} of {} cannot be "
                        "opened: {} (made by scripts/netns-hosts.sh?)",
                        options_.name, spec.netns, w.label, std::strerror(errno)));
    }
    SpawnOptions o{.path = own_path,
                   .argv = spec.command.empty() ? options_.command : spec.command,
                   .env = spec.env,
                   .stdin_fd = devnull,
                   .stdout_fd = out_w.get(),
                   .stderr_fd = err_w.get(),
                   .die_with_parent = true,
                   .signal_mask = &child_mask_,
                   .cpus = spec.cpus.empty() ? nullptr : &cpus,
                   .idle_priority = idle_priority,
                   .netns_fd = netns.valid() ? netns.get() : -1};
    Spawned spawned;
    if (forkable && spec.netns.empty() && fork_server_ &&
        fork_server_->state() == ForkServer::State::kReady) {
      spawned = fork_server_->spawn(o);
      if (!spawned.failure.empty()) {
        write_out(options_.stderr_fd,
                  fmt::format("{}: --preload: {}; {} and later spares and replacements start as "
                              "the workers did\n",
                              options_.name, spawned.failure, w.label));
        fork_server_.reset();
        spawned = spawn(o);
      }
    } else {
      spawned = spawn(o);
    }
    w.pid = spawned.pid;
    w.running = true;
    if (!spawned.failure.empty())
      relay_line(w, w.err,
                 fmt::format("{}: {}{}", options_.name, spawned.failure,
                             spec.netns.empty() ? "" : " (network namespace " + spec.netns + ")"));
    DTRAIN_LOG_DEBUG("{}: started {} as pid {}{}", options_.name, w.label, w.pid,
                     spec.cpus.empty() ? "" : ", bound to CPUs " + describe_cpus(spec.cpus));
  }

  void loop() {
    for (;;) {
      auto now = Clock::now();
      flush_paused(now);
      if (stopping_ && !killed_ && now >= kill_at_) kill_all();
      if (!stopping_ && settle_until_ && now >= *settle_until_) stop_after_failure();
      if (!stopping_ && services_stop_at_ && now >= *services_stop_at_) {
        DTRAIN_LOG_INFO(
            "{}: every worker has exited; stopping the {} service(s) still "
            "running (SIGTERM, SIGKILL in {:g} s)",
            options_.name, running_count(), options_.grace_period.count() / 1000.0);
        stop(SIGTERM);
      }
      bool all_exited = running_count() == 0;
      if (all_exited && !all_exited_at_) all_exited_at_ = now;
      bool streams_open = false;
      for (auto& w : workers_) streams_open = streams_open || w.out.fd.valid() || w.err.fd.valid();
      if (all_exited && (!streams_open || now >= *all_exited_at_ + kDrainTime)) {
        flush_paused(now, true);
        return;
      }
      if (killed_ && !all_exited && now >= killed_at_ + kReapAfterKillTime) {
        flush_paused(now, true);
        DTRAIN_LOG_ERROR("{}: {} worker(s) did not exit {} ms after SIGKILL; giving up on them",
                         options_.name, running_count(), kReapAfterKillTime.count());
        return;
      }

      std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}};
      std::vector<Stream*> streams{nullptr};
      // The fork server's word that it is ready, while it imports.
      const bool server_starting =
          !stopping_ && fork_server_ && fork_server_->state() == ForkServer::State::kStarting;
      if (server_starting) {
        fds.push_back({fork_server_->fd(), POLLIN, 0});
        streams.push_back(nullptr);
      }
      // Asked to stop from outside: watched until the stop begins.
      const size_t stop_fds = stopping_ ? 0 : options_.stop_fds.size();
      for (size_t i = 0; i < stop_fds; ++i) {
        fds.push_back({options_.stop_fds[i], POLLIN, 0});
        streams.push_back(nullptr);
      }
      for (auto& w : workers_) {
        for (Stream* s : {&w.out, &w.err}) {
          if (!s->fd.valid()) continue;
          fds.push_back({s->fd.get(), POLLIN, 0});
          streams.push_back(s);
        }
      }
      int rc = ::poll(fds.data(), fds.size(), poll_timeout(now));
      if (rc < 0 && errno != EINTR)
        throw InternalError(
            fmt::format("{}: poll failed: {}", options_.name, std::strerror(errno)));
      if (rc <= 0) continue;
      // Output first, so that a worker's last lines are relayed before its exit is reported.
      const size_t first_stop = server_starting ? 2 : 1;
      const size_t first_stream = first_stop + stop_fds;
      for (size_t i = first_stream; i < fds.size(); ++i)
        if (fds[i].revents != 0) read_stream(*streams[i]);
      if (fds[0].revents != 0) read_signals();
      if (server_starting && fds[1].revents != 0) fork_server_word();
      bool asked_to_stop = false;
      for (size_t i = first_stop; i < first_stream; ++i) asked_to_stop |= fds[i].revents != 0;
      if (asked_to_stop && !stopping_) {
        DTRAIN_LOG_DEBUG("{}: asked to stop {} worker(s)", options_.name, running_count());
        stopped_by_request_ = true;
        stop(SIGTERM);
      }
    }
  }

  // Milliseconds until the next deadline; -1 while the job simply runs. A training job has no
  // time limit of its own: the workers' exits and the signals are what wake the loop.
  int poll_timeout(Clock::time_point now) const {
    std::optional<Clock::time_point> next;
    auto earliest = [&](Clock::time_point t) { next = next ? std::min(*next, t) : t; };
    if (stopping_ && !killed_) earliest(kill_at_);
    if (!stopping_ && settle_until_) earliest(*settle_until_);
    if (!stopping_ && services_stop_at_) earliest(*services_stop_at_);
    if (killed_) earliest(killed_at_ + kReapAfterKillTime);
    if (all_exited_at_) earliest(*all_exited_at_ + kDrainTime);
    for (const auto& w : workers_)
      if (!w.err.held.empty()) earliest(w.err.due());
    if (!next) return -1;
    auto left = std::chrono::duration_cast<milliseconds>(*next - now).count() + 1;
    return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
  }

  size_t running_count() const {
    size_t n = 0;
    for (const auto& w : workers_) n += w.running ? 1 : 0;
    return n;
  }

  void read_signals() {
    signalfd_siginfo info;
    while (::read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
      int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) {
        reap();
      } else if (sig == SIGUSR1 && !stopping_) {
        // A warning (Slurm's --signal before a preemption or the time limit): passed on, and the
        // workers decide. Those with a dtrain::Preemption save and exit 75; no SIGKILL follows
        // from here, since the engine kills the job itself when its time is up.
        DTRAIN_LOG_INFO("{}: got SIGUSR1; passing it to {} worker(s)", options_.name,
                        running_count());
        warned_ = true;
        signal_all(SIGUSR1);
      } else if (sig == SIGUSR2) {
        DTRAIN_LOG_INFO("{}: got SIGUSR2; asking {} worker(s) for their flight records",
                        options_.name, running_count());
        if (options_.on_sigusr2)
          options_.on_sigusr2();
        else
          signal_all(SIGUSR2);
      } else if (!stopping_) {
        interrupted_by_ = sig;
        DTRAIN_LOG_INFO("{}: got {}; passing it to {} worker(s), SIGKILL in {:g} s", options_.name,
                        signal_name(sig), running_count(), options_.grace_period.count() / 1000.0);
        stop(sig);
      } else {
        // Stopping already (a failure, or a stop request, or an earlier signal): remember the
        // signal, so that the caller knows the launcher itself was told to stop; a second one
        // means "now".
        if (interrupted_by_ == 0) interrupted_by_ = sig;
        if (!killed_) kill_at_ = Clock::now();
      }
    }
    // SIGCHLD coalesces, and a child may have exited while we were busy: reap on every wake-up.
    reap();
  }

  void reap() {
    Worker* culprit = nullptr;              // the failure to report, of those this pass found
    std::vector<const Worker*> to_replace;  // started after the pass: it adds to workers_
    for (auto& w : workers_) {
      if (!w.running) continue;
      int status = 0;
      pid_t got = ::waitpid(w.pid, &status, WNOHANG);
      if (got != w.pid) continue;
      w.running = false;
      if (WIFEXITED(status)) w.exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) w.signal = WTERMSIG(status);
      if (w.spare != 0) {
        // It held no place, so no peer waits for word of it and nothing was lost: it found
        // training over, was stopped with the job, or failed while it waited.
        if ((w.exit_code != 0 || w.signal != 0) && !stopping_ && !services_stop_at_) {
          drain(w.err);
          write_out(options_.stderr_fd,
                    fmt::format("{}: {} (pid {}) {} while it waited for a place; nothing was "
                                "lost (--spares)\n",
                                options_.name, w.label, w.pid, exit_of(w).how()));
        }
        continue;
      }
      if (options_.on_exit) options_.on_exit(exit_of(w));
      // A worker that saved its state for a requeue (dtrain::Preemption) did not fail, whether
      // it was warned through us or not.
      if (w.signal == 0 && w.exit_code == Preemption::kRequeueExitCode) {
        ++requeued_;
        continue;
      }
      bool failed = w.exit_code != 0 || w.signal != 0;
      DTRAIN_LOG_DEBUG("{}: {} (pid {}) exited: code {} signal {}", options_.name, w.label, w.pid,
                       w.exit_code, w.signal);
      // (A parameter server that fails fails the job: the state it held is gone.)
      if (failed && !stopping_ && options_.keep_survivors && !w.service) {
        lost_.push_back(&w);
        drain(w.err);
        write_out(options_.stderr_fd,
                  fmt::format("{}: {} (pid {}) {}; the other workers go on without it (--live)\n",
                              options_.name, w.label, w.pid, exit_of(w).how()));
        to_replace.push_back(&w);
        continue;
      }
      // Exits after we began stopping the job are our doing, not failures of their own.
      if (failed && !stopping_) {
        failed_.push_back(&w);
        if (culprit == nullptr || more_likely_first(w, *culprit)) culprit = &w;
      }
    }
    // A replacement needs live workers to take it in: here, or on other nodes (one that finds
    // training over ends at once).
    bool others_running = false;
    for (const auto& w : workers_) others_running = others_running || in_training(w);
    if (!to_replace.empty() && !others_running && options_.members_elsewhere)
      others_running = options_.members_elsewhere();
    if (others_running)
      for (const Worker* dead : to_replace) fill_place(*dead);
    if (fork_server_) {
      std::vector<pid_t> known;
      for (const auto& w : workers_)
        if (w.running) known.push_back(w.pid);
      fork_server_->reap_strays(known);
      if (fork_server_->state() == ForkServer::State::kFailed && !stopping_) fork_server_failed();
    }
    if (culprit == nullptr) {
      // The workers are done and only services remain: they get the grace period to leave on
      // their own (a parameter server ends once every worker said goodbye), then are stopped.
      bool services_left = false, workers_left = false;
      for (const auto& w : workers_) {
        services_left = services_left || (w.running && !in_training(w));
        workers_left = workers_left || in_training(w);
      }
      if (services_left && !workers_left && !stopping_ && !services_stop_at_)
        services_stop_at_ = Clock::now() + options_.grace_period;
      return;
    }
    if (first_failure_ == nullptr) {
      first_failure_ = culprit;
      // Under the elastic agent, the agents of every machine agree on the cause through the
      // store as soon as one reports it: it reports at once, what its own machine saw first.
      if (options_.on_failure) {
        stop_after_failure();
        return;
      }
      settle_until_ = Clock::now() + kSettleTime;
    }
    if (running_count() == 0 && settle_until_) stop_after_failure();
  }

  // The settle time is over (or nobody is left running): stop the others, name the cause.
  void stop_after_failure() {
    settle_until_.reset();
    // Their last words are in their pipes already: read them before choosing and reporting.
    for (Worker* w : failed_) drain(w->err);
    flush_paused(Clock::now(), true);
    root_cause_ = choose_root_cause();
    stop(SIGTERM);
    if (options_.on_failure) {
      // A silent root cause is still running: its exit code would say nothing (0).
      WorkerExit cause = exit_of(*root_cause_);
      if (silent_root_) cause.silent_per = named_by_->label;
      options_.on_failure(cause);
    }
  }

  // What a failed worker's failure record says (comm/failure_record.h), read once; nothing for a
  // worker that wrote none (not a dtrain program, or it failed outside a collective).
  const std::optional<comm::FailureRecord>& record_of(Worker& w) const {
    if (!w.record_read && !options_.failure_records.empty())
      w.record = comm::read_failure_record(options_.failure_records, w.rank);
    w.record_read = true;
    return w.record;
  }

  // Whether a failed worker failed because of a peer: its record says so, or else its last
  // words blame another rank.
  bool blames_a_peer(Worker& w) const {
    if (const auto& r = record_of(w)) return r->peer_caused;
    for (const auto& line : w.stderr_tail)
      for (std::string_view mark : {" reports: ", "its connection broke", "connection closed by",
                                    "disconnected", "Connection reset by peer"})
        if (line.find(mark) != std::string::npos) return true;
    return false;
  }

  // The one rank a failed worker names as silent (stopped or stuck), when exactly one is named:
  // by its record, or else by its post-mortem's words ("rank 2: did not answer within the
  // limit", "rank 2: no word within ...", "not arrived: rank 2").
  std::optional<int> named_silent(Worker& w) const {
    if (const auto& r = record_of(w))
      return r->silent.size() == 1 ? std::optional<int>(r->silent[0]) : std::nullopt;
    static const std::regex kSilent(
        R"(rank (\d+): (did not answer within|no word within)|not arrived: rank (\d+)(;|$|\s))");
    std::optional<int> named;
    for (const auto& line : w.stderr_tail) {
      for (std::sregex_iterator m(line.begin(), line.end(), kSilent), end; m != end; ++m) {
        const int rank = std::stoi((*m)[1].matched ? (*m)[1].str() : (*m)[3].str());
        if (named && *named != rank) return std::nullopt;  // several: no single culprit
        named = rank;
      }
    }
    return named;
  }

  // Of the workers that failed on their own, the likeliest cause: a rank their post-mortems
  // name as silent that did not fail itself (stopped, stuck: still running), else one whose
  // error does not blame a peer, else the first seen.
  Worker* choose_root_cause() {
    for (Worker* f : failed_) {
      auto silent = named_silent(*f);
      if (!silent) continue;
      for (auto& w : workers_)
        if (w.rank == *silent && !w.service && w.running) {
          silent_root_ = true;
          named_by_ = f;
          return &w;
        }
    }
    if (blames_a_peer(*first_failure_))
      for (Worker* f : failed_)
        if (!blames_a_peer(*f) && !more_likely_first(*first_failure_, *f)) return f;
    return first_failure_;
  }

  // Of two workers found failed in one pass (in rank order, not the order they ended), which
  // to name. A worker that another's death brought down ends on its own: an exit code, or
  // SIGABRT from an uncaught error. Any other signal comes from outside the job (the OOM
  // killer, an operator, a crash of its own) and is the likelier cause.
  static bool more_likely_first(const Worker& w, const Worker& than) {
    auto from_outside = [](const Worker& x) { return x.signal != 0 && x.signal != SIGABRT; };
    return from_outside(w) && !from_outside(than);
  }

  // Signals every worker's process group; groups of workers that already exited too, since
  // processes they started may still run there.
  void signal_all(int sig) {
    for (auto& w : workers_)
      if (w.pid > 0) ::kill(-w.pid, sig);
  }

  void stop(int sig) {
    stopping_ = true;
    kill_at_ = Clock::now() + options_.grace_period;
    signal_all(sig);
  }

  void kill_all() {
    if (running_count() > 0)
      DTRAIN_LOG_WARN(
          "{}: {} worker(s) still running {:g} s after the stop signal; "
          "sending SIGKILL",
          options_.name, running_count(), options_.grace_period.count() / 1000.0);
    signal_all(SIGKILL);
    killed_ = true;
    killed_at_ = Clock::now();
  }

  // Reads whatever is already waiting in a stream, without blocking.
  void drain(Stream& s) {
    for (int i = 0; i < 64 && s.fd.valid(); ++i) {
      pollfd p{s.fd.get(), POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) return;
      read_stream(s);
    }
  }

  static WorkerExit exit_of(const Worker& w) {
    return WorkerExit{w.rank, w.pid, w.exit_code, w.signal,
                      std::vector<std::string>(w.stderr_tail.begin(), w.stderr_tail.end())};
  }

  void read_stream(Stream& s) {
    char buf[65536];
    ssize_t n = ::read(s.fd.get(), buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    Worker& w = worker_of(s);
    if (n <= 0) {  // EOF (or an error, which ends the stream all the same)
      if (!s.partial.empty()) append_line(w, s, std::exchange(s.partial, {}), s.held);
      flush_held(s);
      s.fd.reset();
      return;
    }
    // Relay every complete line of this read in one write, so that lines stay whole.
    std::string text;
    s.partial.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1)
      append_line(w, s, std::string_view(s.partial).substr(start, nl - start), text);
    s.partial.erase(0, start);
    if (s.partial.size() >= kMaxLine) append_line(w, s, std::exchange(s.partial, {}), text);
    if (!s.is_stderr) {
      write_out(s.out_fd, text);
      return;
    }
    s.last_read = Clock::now();
    if (s.held.empty()) s.first_held = s.last_read;
    s.held += text;
    if (s.held.size() >= kMaxLine) flush_held(s);
  }

  void relay_line(Worker& w, Stream& s, std::string_view line) {
    std::string text;
    append_line(w, s, line, text);
    write_out(s.out_fd, text);
  }

  void flush_held(Stream& s) {
    if (!s.held.empty()) write_out(s.out_fd, std::exchange(s.held, {}));
  }

  // Relays the bursts of workers that paused (every burst with `all`).
  void flush_paused(Clock::time_point now, bool all = false) {
    for (auto& w : workers_)
      if (!w.err.held.empty() && (all || now >= w.err.due())) flush_held(w.err);
  }

  void append_line(Worker& w, const Stream& s, std::string_view line, std::string& text) {
    if (options_.on_line) options_.on_line(w.rank, line);
    if (!s.is_stderr && options_.take_stdout_line && options_.take_stdout_line(w.rank, line))
      return;
    text += w.prefix;
    text += line;
    text += '\n';
    if (s.is_stderr && options_.stderr_tail_lines > 0) {
      w.stderr_tail.emplace_back(line);
      if (w.stderr_tail.size() > options_.stderr_tail_lines) w.stderr_tail.pop_front();
    }
  }

  // A worker running that trains or will: not a service, nor a spare waiting for a place.
  static bool in_training(const Worker& w) { return w.running && !w.service && w.spare == 0; }

  const WorkerSpec& spec_of(const Worker& w) const {
    for (const auto& candidate : options_.workers)
      if (candidate.rank == w.rank && !candidate.service) return candidate;
    throw InternalError(fmt::format("{}: no worker spec for {}", options_.name, w.label));
  }

  // Live recovery: a dead worker's place goes to a waiting spare, else to a process started in it
  // while --replace allows. Like replace() and start_spare(), it adds to the deque of workers,
  // which keeps references to the others valid (lost_, failed_), not iterators: never call them
  // while iterating over workers_.
  void fill_place(const Worker& dead) {
    Worker* spare = nullptr;
    for (auto& w : workers_)
      if (w.running && w.spare != 0 && spare == nullptr) spare = &w;
    if (spare == nullptr) {
      if (replacements_started_ < options_.replacements) replace(dead);
      return;
    }
    const WorkerSpec& place = spec_of(dead);
    try {
      if (options_.place_spare) options_.place_spare(spare->spare, place);
    } catch (const std::exception& e) {
      write_out(options_.stderr_fd,
                fmt::format("{}: cannot give {} the place of {}: {}; a new process takes it "
                            "instead, while --replace allows\n",
                            options_.name, spare->label, dead.label, e.what()));
      if (replacements_started_ < options_.replacements) replace(dead);
      return;
    }
    if (idle_spares_)
      if (const std::string why = leave_idle_priority(spare->pid); !why.empty())
        write_out(options_.stderr_fd,
                  fmt::format("{}: {} keeps the idle CPU priority it waited at: {}; it will "
                              "train slower than the others\n",
                              options_.name, spare->label, why));
    // It waited bound to no CPUs; the place's worker was bound to its share.
    if (!place.cpus.empty())
      if (const std::string why = bind_every_thread(spare->pid, place.cpus); !why.empty())
        write_out(
            options_.stderr_fd,
            fmt::format("{}: {} could not be bound to the CPUs of {} ({}): {}; the "
                        "scheduler places it\n",
                        options_.name, spare->label, dead.label, describe_cpus(place.cpus), why));
    const std::string was = spare->label;
    spare->spare = 0;
    spare->rank = dead.rank;
    spare->label = dead.label;
    if (options_.prefix_output) spare->prefix = fmt::format("[{}] ", spare->label);
    write_out(options_.stderr_fd,
              fmt::format("{}: {} (pid {}) takes the place of {}; the others take it in at a "
                          "step boundary (--live --spares)\n",
                          options_.name, was, spare->pid, dead.label));
    if (replacements_started_ >= options_.replacements) return;
    ++replacements_started_;
    const Worker& next = start_spare();
    write_out(options_.stderr_fd,
              fmt::format("{}: started {} (pid {}; replacement {} of {}) to wait for the next "
                          "failure\n",
                          options_.name, next.label, next.pid, replacements_started_,
                          options_.replacements));
  }

  // A worker with no place yet: the first worker's spec, told that it is spare number N.
  Worker& start_spare() {
    WorkerSpec spec;
    for (const auto& candidate : options_.workers)
      if (!candidate.service) {
        spec = candidate;
        break;
      }
    const int number = ++spares_started_;
    spec.label = fmt::format("spare {}", number);
    spec.cpus.clear();  // it will run in whichever worker's place: bound to none of them
    spec.env.insert(spec.env.end(), options_.replacement_env.begin(),
                    options_.replacement_env.end());
    spec.env.emplace_back(env::kLiveSpare.name, std::to_string(number));
    Worker& w = workers_.emplace_back();
    start(w, spec, idle_spares_, true);
    w.spare = number;
    return w;
  }

  // Starts a worker in the place of `dead` (see fill_place()).
  void replace(const Worker& dead) {
    WorkerSpec spec = spec_of(dead);
    spec.env.insert(spec.env.end(), options_.replacement_env.begin(),
                    options_.replacement_env.end());
    ++replacements_started_;
    Worker& w = workers_.emplace_back();
    start(w, spec, false, true);
    write_out(
        options_.stderr_fd,
        fmt::format("{}: started a replacement for {} (pid {}; replacement {} of {}); the "
                    "others take it in at a step boundary (--live --replace)\n",
                    options_.name, w.label, w.pid, replacements_started_, options_.replacements));
  }

  Worker& worker_of(const Stream& s) {
    for (auto& w : workers_)
      if (&w.out == &s || &w.err == &s) return w;
    throw InternalError(options_.name + ": output stream without a worker");
  }

  SupervisorResult finish() {
    using Outcome = SupervisorResult::Outcome;
    size_t n = workers_.size();
    SupervisorResult result;
    result.interrupted_by = interrupted_by_;
    // Live recovery: workers lost along the way fail the job only when none ended well.
    if (!lost_.empty() && first_failure_ == nullptr) {
      size_t ended_well = 0;
      for (const auto& w : workers_)
        ended_well +=
            !w.service && w.spare == 0 && !w.running && w.exit_code == 0 && w.signal == 0 ? 1 : 0;
      if (ended_well == 0) {
        first_failure_ = lost_.front();
        failed_ = lost_;
      } else {
        write_out(options_.stderr_fd,
                  fmt::format("{}: {} worker(s) ended well; {} lost along the way (--live)\n",
                              options_.name, ended_well, lost_.size()));
      }
    }
    if (first_failure_ != nullptr) {
      if (root_cause_ == nullptr) root_cause_ = choose_root_cause();
      // The job's exit status is the first failure's; the report names the likeliest cause.
      const Worker& first = *first_failure_;
      result.outcome = Outcome::kFailed;
      result.exit_code = first.signal != 0 ? 128 + first.signal : first.exit_code;
      const Worker& w = silent_root_ ? *named_by_ : *root_cause_;
      result.first_failure = exit_of(w);
      if (!options_.report_failure) return result;
      std::string text;
      if (silent_root_) {
        text = fmt::format(
            "{}: {} (pid {}) did not answer its peers (stopped or stuck: it was still "
            "running, and was stopped); {} names it in its post-mortem and {}",
            options_.name, root_cause_->label, root_cause_->pid, w.label,
            result.first_failure->how());
      } else {
        text = fmt::format("{}: {} (pid {}) {}", options_.name, w.label, w.pid,
                           result.first_failure->how());
        if (&w != &first)
          text += fmt::format(
              " (the likeliest cause: {} failed first, but its error blames a "
              "peer)",
              first.label);
      }
      if (n > 1) text += fmt::format("; stopped the other {} worker(s)", n - 1);
      if (w.stderr_tail.empty()) {
        text += fmt::format(". {} wrote nothing to stderr.\n", w.label);
      } else {
        text += fmt::format(". Last stderr lines of {}:\n", w.label);
        for (const auto& line : w.stderr_tail) text += fmt::format("    {}\n", line);
      }
      write_out(options_.stderr_fd, text);
      return result;
    }
    size_t workers = 0;
    for (const auto& w : workers_) workers += w.service || w.spare != 0 ? 0 : 1;
    if (requeued_ > 0 && requeued_ == workers) {
      // Every worker saved its state for a requeue (dtrain::Preemption): warned through us
      // (SIGTERM, SIGUSR1) or directly, the job is to run again, not a failure.
      result.outcome = Outcome::kRequeued;
      result.exit_code = Preemption::kRequeueExitCode;
      result.interrupted_by = interrupted_by_;
      write_out(
          options_.stderr_fd,
          fmt::format("{}: preempted{}: every worker saved its state and exited {}; "
                      "run the job again (requeue) to resume\n",
                      options_.name,
                      interrupted_by_ != 0 ? fmt::format(" ({})", signal_name(interrupted_by_))
                      : warned_            ? std::string(" (SIGUSR1)")
                                           : std::string(),
                      Preemption::kRequeueExitCode));
      return result;
    }
    if (requeued_ > 0) {
      result.outcome = Outcome::kFailed;
      result.exit_code = 1;
      write_out(options_.stderr_fd,
                fmt::format("{}: {} of {} worker(s) saved their state for a requeue (exit "
                            "{}) and the others did not: the job's saved state may be incomplete\n",
                            options_.name, requeued_, workers, Preemption::kRequeueExitCode));
      return result;
    }
    if (interrupted_by_ != 0) {
      result.outcome = Outcome::kInterrupted;
      result.interrupted_by = interrupted_by_;
      result.exit_code = 128 + interrupted_by_;
      write_out(options_.stderr_fd, fmt::format("{}: stopped {} worker(s) after {}\n",
                                                options_.name, n, signal_name(interrupted_by_)));
      return result;
    }
    if (stopped_by_request_) result.outcome = Outcome::kStopped;
    return result;
  }

  const SupervisorOptions& options_;
  int signal_fd_;
  const sigset_t& child_mask_;
  std::deque<Worker> workers_;  // a deque: replacements come after the workers, which stay put
  std::string path_;            // of the command
  net::Fd devnull_;             // every worker's stdin
  int replacements_started_ = 0;
  int spares_started_ = 0;
  int spares_pending_ = 0;                 // to start once the fork server is ready (or has failed)
  std::optional<ForkServer> fork_server_;  // SupervisorOptions::preload
  bool idle_spares_ = false;               // spares start at SCHED_IDLE (launch/idle_priority.h)
  Worker* first_failure_ = nullptr;
  std::vector<Worker*> lost_;    // keep_survivors: workers that failed while the others went on
  std::vector<Worker*> failed_;  // every worker that failed on its own, in the order seen
  std::optional<Clock::time_point> settle_until_;  // stop the others then
  Worker* root_cause_ = nullptr;                   // the likeliest cause, once chosen
  bool silent_root_ = false;    // root_cause_ did not fail: a post-mortem names it as silent
  Worker* named_by_ = nullptr;  // the failed worker whose post-mortem named it
  int interrupted_by_ = 0;      // the signal that told the launcher to stop, if any
  size_t requeued_ = 0;         // workers that exited 75: saved their state for a requeue
  bool warned_ = false;         // SIGUSR1 was passed on (a warning, not a stop)
  bool stopping_ = false;       // SIGTERM (or the forwarded signal) was sent to every worker
  // When the services still running after every worker exited are stopped.
  std::optional<Clock::time_point> services_stop_at_;
  bool stopped_by_request_ = false;  // through options_.stop_fds
  bool killed_ = false;              // SIGKILL was sent
  Clock::time_point kill_at_{};
  Clock::time_point killed_at_{};
  std::optional<Clock::time_point> all_exited_at_;
};

}  // namespace

std::string signal_name(int signal) {
  const char* abbrev = ::sigabbrev_np(signal);
  return abbrev != nullptr ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", signal);
}

Supervisor::Supervisor() {
  sigset_t set = supervised_signals();
  if (int rc = ::pthread_sigmask(SIG_BLOCK, &set, &old_mask_); rc != 0)
    throw InternalError(fmt::format("dtrain run: pthread_sigmask failed: {}", std::strerror(rc)));
  signal_fd_ = net::Fd(::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!signal_fd_.valid()) {
    int err = errno;
    ::pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
    throw InternalError(fmt::format("dtrain run: signalfd failed: {}", std::strerror(err)));
  }
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &old_sigpipe_);
  // An ignored SIGCHLD (inherited from whoever started us) would make the kernel reap the
  // workers itself, and their exit codes would be lost.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGCHLD, &dfl, &old_sigchld_);
}

Supervisor::~Supervisor() {
  ::sigaction(SIGCHLD, &old_sigchld_, nullptr);
  ::sigaction(SIGPIPE, &old_sigpipe_, nullptr);
  ::pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
}

int Supervisor::run(const SupervisorOptions& options) { return supervise(options).exit_code; }

SupervisorResult Supervisor::supervise(const SupervisorOptions& options) {
  if (options.command.empty()) throw InvalidArgumentError("dtrain run: no worker command given");
  if (options.workers.empty()) throw InvalidArgumentError("dtrain run: no workers to start");
  Run run(options, signal_fd_.get(), old_mask_);
  return run.execute();
}

int Supervisor::take_signal() {
  int got = 0;
  signalfd_siginfo info;
  while (::read(signal_fd_.get(), &info, sizeof(info)) == sizeof(info)) {
    int sig = static_cast<int>(info.ssi_signo);
    if (sig != SIGCHLD && got == 0) got = sig;
  }
  return got;
}

std::string WorkerExit::how() const {
  if (!silent_per.empty())
    return fmt::format(
        "did not answer its peers (stopped or stuck: still running when {} failed naming it)",
        silent_per);
  if (signal != 0)
    return fmt::format("was killed by {} ({})", signal_name(signal), ::strsignal(signal));
  return exit_code == 0 ? "exited with code 0" : fmt::format("failed with exit code {}", exit_code);
}

}  // namespace dtrain::launch
