// Helpers of the launcher tests: a real `dtrain` process with its output captured, and checks
// on processes and text.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "common/deadline.h"
#include "common/socket.h"

namespace dtrain::testing {

using std::chrono::milliseconds;
using std::chrono::seconds;

inline const std::string kDtrain = std::string(DTRAIN_BIN_DIR) + "/dtrain";

// A running `dtrain` with its stdout and stderr captured.
class Launched {
 public:
  // Runs `dtrain ARGS...`, or `WRAPPER... dtrain ARGS...` (a network namespace: the wrapper
  // must exec, so that pid() is dtrain's).
  explicit Launched(std::vector<std::string> args, std::vector<std::string> wrapper = {}) {
    args.insert(args.begin(), kDtrain);
    args.insert(args.begin(), wrapper.begin(), wrapper.end());
    int out[2], err[2];
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(err, O_CLOEXEC), 0);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execv(argv[0], argv.data());
      ::_exit(126);
    }
    ::close(out[1]);
    ::close(err[1]);
    out_ = net::Fd(out[0]);
    err_ = net::Fd(err[0]);
  }
  Launched(const Launched&) = delete;
  Launched& operator=(const Launched&) = delete;
  ~Launched() {
    if (!status_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }
  const std::string& out() const { return out_text_; }
  const std::string& err() const { return err_text_; }

  // Reads output until `done` holds or the deadline passes; returns whether it held.
  bool read_until(const std::function<bool()>& done, const Deadline& deadline) {
    while (!done()) {
      if (deadline.expired() || !read_some(deadline)) return done();
    }
    return true;
  }

  // Reads whatever output arrives within `limit` (keeps the pipes from filling up).
  void pump(milliseconds limit) {
    auto deadline = Deadline::after(limit);
    while (!deadline.expired() && read_some(deadline)) {
    }
  }

  // Waits for the launcher to exit, reading its output to the end. Returns its wait status, or
  // nullopt (after killing it) when the deadline passes first.
  std::optional<int> wait(milliseconds limit) {
    auto deadline = Deadline::after(limit);
    while (read_some(deadline)) {
    }
    while (!status_) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        status_ = status;
        break;
      }
      if (deadline.expired()) {
        ADD_FAILURE() << "dtrain did not exit within " << deadline.describe() << "\nstdout:\n"
                      << out_text_ << "\nstderr:\n"
                      << err_text_;
        return std::nullopt;
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
    return status_;
  }

 private:
  // One poll over both pipes; false once both are closed or the deadline passed.
  bool read_some(const Deadline& deadline) {
    std::vector<pollfd> fds;
    std::vector<std::pair<net::Fd*, std::string*>> streams;
    for (auto [fd, text] : {std::pair{&out_, &out_text_}, std::pair{&err_, &err_text_}}) {
      if (!fd->valid()) continue;
      fds.push_back({fd->get(), POLLIN, 0});
      streams.emplace_back(fd, text);
    }
    if (fds.empty()) return false;
    int rc = ::poll(fds.data(), fds.size(), deadline.poll_ms());
    if (rc <= 0) return rc < 0 && errno == EINTR;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      char buf[4096];
      ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
      if (n <= 0) {
        streams[i].first->reset();
      } else {
        streams[i].second->append(buf, static_cast<size_t>(n));
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  net::Fd out_, err_;
  std::string out_text_, err_text_;
  std::optional<int> status_;
};

// Waits until `done` holds, reading every launcher's output meanwhile; false at the deadline.
inline bool wait_for(const std::function<bool()>& done, std::vector<Launched*> launched,
                     milliseconds limit) {
  auto deadline = Deadline::after(limit);
  while (!done()) {
    if (deadline.expired()) return false;
    for (auto* a : launched) a->pump(milliseconds(20));
  }
  return true;
}

// Network namespaces as `count` machines (scripts/netns-hosts.sh), removed at the end: each has
// an address of its own, and the links are plain veths. `up` is false where they cannot be made
// (not root, no iproute2): the test skips.
struct NamespaceHosts {
  const std::string script = std::string(DTRAIN_SOURCE_DIR) + "/scripts/netns-hosts.sh";
  std::string name;
  std::string subnet;
  int count;
  bool up = false;
  // `prefix`: a few letters naming the test's hosts (with this process's pid after them).
  NamespaceHosts(const std::string& prefix, int count_)
      : name(prefix + std::to_string(::getpid() % 100000)),
        subnet("10.79." + std::to_string(::getpid() % 200)),
        count(count_) {
    up = ::geteuid() == 0 && std::system((script + " up " + name + " " + std::to_string(count) +
                                          " " + subnet + " >/dev/null 2>&1")
                                             .c_str()) == 0;
    if (!up) std::system((script + " down " + name + " >/dev/null 2>&1").c_str());
  }
  ~NamespaceHosts() {
    if (up) std::system((script + " down " + name + " >/dev/null 2>&1").c_str());
  }
  NamespaceHosts(const NamespaceHosts&) = delete;
  NamespaceHosts& operator=(const NamespaceHosts&) = delete;
  // The wrapper that runs a command on `host`.
  std::vector<std::string> on(int host) const {
    return {script, "run", name, std::to_string(host)};
  }
  std::string addr(int host) const { return subnet + "." + std::to_string(host + 1); }
  // Unplugs `host`: its link goes down, and nothing it sends or is sent arrives.
  bool cut(int host) const {
    return std::system((script + " cut " + name + " " + std::to_string(host)).c_str()) == 0;
  }
};

inline int exit_code(std::optional<int> status) {
  if (!status) return -1;
  return WIFEXITED(*status) ? WEXITSTATUS(*status) : 1000 + WTERMSIG(*status);
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

inline size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t pos = text.find(part); pos != std::string::npos; pos = text.find(part, pos + 1)) ++n;
  return n;
}

// Alive means it exists and is not a zombie: orphans whose new parent never reaps them are dead.
inline bool process_alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  char state = line[close + 2];
  return state != 'Z' && state != 'X';
}

// Waits (a few seconds at most) for a process to be gone.
inline bool gone_soon(pid_t pid) {
  auto deadline = Deadline::after(seconds(5));
  while (process_alive(pid)) {
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return true;
}

inline pid_t read_pid(const std::filesystem::path& file) {
  std::ifstream in(file);
  pid_t pid = -1;
  in >> pid;
  return pid;
}

}  // namespace dtrain::testing
