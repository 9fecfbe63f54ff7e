#include "launch/fork_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::launch {
namespace {

// Runs the server by its file's path, found beside the dtrain package without importing it (the
// package starts a thread at import, and a process with threads cannot be forked safely). The
// workers forked keep this command line: its comment says what they are to `ps`.
constexpr const char* kBootstrap =
    "# dtrain run --preload: the fork server, or a worker forked from it\n"
    "import importlib.util, os, runpy; "
    "runpy.run_path(os.path.join(os.path.dirname(importlib.util.find_spec('dtrain').origin), "
    "'_fork_server.py'), run_name='__main__')";

constexpr size_t kMaxWord = 4096;

// The server's next message, waiting up to `timeout`; "" when it closed or said nothing in time.
std::string read_word(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return "";
  std::array<char, kMaxWord> buffer;
  const ssize_t n = ::recv(fd, buffer.data(), buffer.size(), MSG_DONTWAIT);
  return n > 0 ? std::string(buffer.data(), static_cast<size_t>(n)) : "";
}

std::string join_cpus(const cpu_set_t* cpus) {
  std::string list;
  if (cpus == nullptr) return list;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, cpus)) list += (list.empty() ? "" : ",") + std::to_string(c);
  return list;
}

}  // namespace

ForkServer::ForkServer(const ForkServerOptions& options) : options_(options) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0)
    throw InternalError(
        fmt::format("dtrain run --preload: socketpair failed: {}", std::strerror(errno)));
  socket_ = net::Fd(pair[0]);
  net::Fd theirs(pair[1]);
  // The server's end must survive its exec: a descriptor it names in its environment.
  ::fcntl(theirs.get(), F_SETFD, 0);
  ::prctl(PR_GET_CHILD_SUBREAPER, &was_subreaper_);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  SpawnOptions o{.path = options.python,
                 .argv = {options.python, "-c", kBootstrap},
                 .env = options.env,
                 .stdout_fd = options.stderr_fd,
                 .stderr_fd = options.stderr_fd,
                 .die_with_parent = true,
                 .signal_mask = options.signal_mask};
  o.env.emplace_back("DTRAIN_FORK_SERVER_FD", std::to_string(theirs.get()));
  o.env.emplace_back("DTRAIN_FORK_SERVER_PRELOAD",
                     fmt::format("{}", fmt::join(options.modules, ",")));
  const Spawned spawned = launch::spawn(o);    // the free function, not the member
  ::fcntl(theirs.get(), F_SETFD, FD_CLOEXEC);  // no later child of this process inherits it
  pid_ = spawned.pid;
  if (!spawned.failure.empty()) fail(spawned.failure);
}

ForkServer::~ForkServer() {
  socket_.reset();  // its next read finds the end: it exits
  if (pid_ > 0) {
    int i = 0;
    for (; i < 100 && ::waitpid(pid_, nullptr, WNOHANG) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (i == 100) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  ::prctl(PR_SET_CHILD_SUBREAPER, was_subreaper_);
}

void ForkServer::fail(std::string why) {
  state_ = State::kFailed;
  failure_ = std::move(why);
}

void ForkServer::take_word() {
  if (state_ != State::kStarting) return;
  const std::string word = read_word(socket_.get(), std::chrono::milliseconds(0));
  if (word == "ready") {
    state_ = State::kReady;
  } else if (word.starts_with("failed ")) {
    fail(word.substr(7));
  } else {
    fail(
        fmt::format("the fork server ({} -c ...) exited before it was ready (its output above "
                    "says why: is dtrain importable by that interpreter?)",
                    options_.python));
  }
}

Spawned ForkServer::spawn(const SpawnOptions& o) {
  if (state_ != State::kReady)
    throw InternalError("dtrain run --preload: a fork asked of a server that is not ready");
  char cwd[4096];
  const std::string dir = !o.cwd.empty() ? o.cwd : ::getcwd(cwd, sizeof(cwd)) ? cwd : "/";
  std::string message = dir;
  message += '\0';
  message += o.idle_priority ? "1" : "0";
  message += '\0';
  message += join_cpus(o.cpus);
  message += '\0';
  message += std::to_string(o.argv.size());
  for (const auto& arg : o.argv) (message += '\0') += arg;
  for (const auto& entry : child_environment(o)) (message += '\0') += entry;

  net::Fd devnull;
  int fds[3] = {o.stdin_fd, o.stdout_fd >= 0 ? o.stdout_fd : 1, o.stderr_fd >= 0 ? o.stderr_fd : 2};
  if (fds[0] < 0) {
    devnull = net::Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    fds[0] = devnull.get();
  }
  iovec iov{message.data(), message.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(fds))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(fds));
  std::memcpy(CMSG_DATA(cmsg), fds, sizeof(fds));
  Spawned spawned;
  if (::sendmsg(socket_.get(), &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(message.size())) {
    spawned.failure =
        fmt::format("sending the fork server the request failed: {}", std::strerror(errno));
    fail(spawned.failure);
    return spawned;
  }
  const std::string word = read_word(socket_.get(), options_.answer_timeout);
  if (word.starts_with("pid ")) {
    spawned.pid = std::stoi(word.substr(4));
    return spawned;
  }
  spawned.failure = word.starts_with("failed ")
                        ? "the fork server could not fork: " + word.substr(7)
                        : fmt::format("the fork server (pid {}) did not answer within {} ms", pid_,
                                      options_.answer_timeout.count());
  fail(spawned.failure);
  return spawned;
}

void ForkServer::reap_strays(const std::vector<pid_t>& known) {
  for (;;) {
    siginfo_t info{};
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
    const pid_t pid = info.si_pid;
    if (std::find(known.begin(), known.end(), pid) != known.end()) return;  // the caller's
    int status = 0;
    ::waitpid(pid, &status, WNOHANG);
    if (pid == pid_) {
      pid_ = -1;
      if (state_ != State::kFailed)
        fail(fmt::format("the fork server {}",
                         WIFSIGNALED(status)
                             ? fmt::format("was killed by signal {}", WTERMSIG(status))
                             : fmt::format("exited with code {}", WEXITSTATUS(status))));
    }
  }
}

std::string ForkServer::why_not_forkable(const std::vector<std::string>& command) {
  size_t i = 1;
  if (i < command.size() && command[i] == "-u") ++i;
  if (i < command.size() && command[i] == "-m")
    return i + 1 < command.size() ? "" : "-m names no module";
  if (i < command.size() && !command[i].starts_with("-")) return "";
  return fmt::format(
      "the workers' command must be PYTHON [-u] SCRIPT ... or PYTHON [-u] -m MODULE ... to be "
      "forked from a server that imported its modules (it is '{}')",
      fmt::join(command, " "));
}

}  // namespace dtrain::launch
