// `dtrain store`: the real binary in a child process, its port read from its first line, used by
// a client, then stopped with SIGTERM.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "store/store_test_util.h"

namespace dtrain::testing {
namespace {

using namespace std::chrono_literals;

// A child process running `dtrain store ...` with its stdout on a pipe; killed if still running
// when the test ends.
class StoreProcess {
 public:
  explicit StoreProcess(std::vector<std::string> args) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    std::string bin = std::string(DTRAIN_BIN_DIR) + "/dtrain";
    args.insert(args.begin(), {bin, "store"});
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(bin.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out_ = fds[0];
  }
  ~StoreProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) ::close(out_);
  }

  // The first line of stdout, or "" when none came within `limit`.
  std::string first_line(std::chrono::milliseconds limit) {
    Deadline d = Deadline::after(limit);
    std::string line;
    while (!d.expired()) {
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, d.poll_ms()) <= 0) continue;
      char c;
      ssize_t n = ::read(out_, &c, 1);
      if (n <= 0) break;
      if (c == '\n') return line;
      line += c;
    }
    return "";
  }

  // Waits (polling) up to `limit` for the process to exit; its wait status, or -1.
  int wait_exit(std::chrono::milliseconds limit) {
    Deadline d = Deadline::after(limit);
    while (!d.expired()) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return status;
      }
      std::this_thread::sleep_for(5ms);
    }
    return -1;
  }

  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  bool reaped_ = false;
};

uint16_t port_of(const std::string& line) {
  auto colon = line.rfind(':');
  if (colon == std::string::npos) return 0;
  return static_cast<uint16_t>(std::stoi(line.substr(colon + 1)));
}

TEST(DtrainStoreCommand, ServesUntilSigterm) {
  StoreProcess proc({"--port", "0", "--host", "127.0.0.1", "--job-id", kTestJob});
  std::string line = proc.first_line(20s);
  ASSERT_EQ(line.rfind("dtrain store: serving on 127.0.0.1:", 0), 0u) << "first line: " << line;
  uint16_t port = port_of(line);
  ASSERT_NE(port, 0) << line;
  {
    TcpStore a(client_options(port, 0));
    TcpStore b(client_options(port, 1));
    a.set("k", std::string_view("v"));
    EXPECT_EQ(b.get_string("k"), "v");
    EXPECT_EQ(b.add("n", 3), 3);
    // A client still connected when the signal comes must not keep the server from exiting.
    ASSERT_EQ(::kill(proc.pid(), SIGTERM), 0);
    int status = proc.wait_exit(10s);
    ASSERT_NE(status, -1) << "dtrain store did not exit within 10 s of SIGTERM";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status;
    EXPECT_THROW(a.get("k"), StoreError);
  }
}

TEST(DtrainStoreCommand, DefaultHostAndSigint) {
  StoreProcess proc({"--port", "0", "--job-id", "another-job"});
  std::string line = proc.first_line(20s);
  ASSERT_EQ(line.rfind("dtrain store: serving on 0.0.0.0:", 0), 0u) << "first line: " << line;
  uint16_t port = port_of(line);
  // The job id flag is enforced.
  EXPECT_THROW(TcpStore(client_options(port, 0)), StoreError);
  TcpStore ok(client_options(port, 0, "", "another-job"));
  ok.set("k", std::string_view("v"));
  ASSERT_EQ(::kill(proc.pid(), SIGINT), 0);
  int status = proc.wait_exit(10s);
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace dtrain::testing
