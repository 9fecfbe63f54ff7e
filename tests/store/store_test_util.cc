#include "store/store_test_util.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <thread>

namespace dtrain::testing {
namespace {

// The tests choose job ids and tokens themselves; a DTRAIN_JOB_ID or DTRAIN_AUTH_TOKEN in the
// environment of whoever runs them must not change what they test.
const bool kEnvironmentCleared = [] {
  ::unsetenv("DTRAIN_JOB_ID");
  ::unsetenv("DTRAIN_AUTH_TOKEN");
  return true;
}();

}  // namespace

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = fmt::format("{}/dtrain-store-test-XXXXXX", base && *base ? base : "/tmp");
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::unique_ptr<TcpStoreServer> start_server(const std::string& token, const std::string& job_id,
                                             std::chrono::milliseconds handshake_timeout,
                                             bool torch_clients) {
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.job_id = job_id;
  options.token = token;
  options.handshake_timeout = handshake_timeout;
  options.torch_clients = torch_clients;
  return std::make_unique<TcpStoreServer>(options);
}

ServerProcess::ServerProcess(const std::string& token, const std::string& job_id,
                             rlim_t max_files, bool torch_clients) {
  int port_pipe[2], control_pipe[2];
  if (::pipe2(port_pipe, O_CLOEXEC) != 0 || ::pipe2(control_pipe, O_CLOEXEC) != 0)
    throw std::runtime_error("pipe2 failed");
  std::fflush(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    ::close(port_pipe[0]);
    ::close(control_pipe[1]);
    int code = 0;
    try {
      if (max_files > 0) {
        rlimit files{max_files, max_files};
        if (::setrlimit(RLIMIT_NOFILE, &files) != 0) throw std::runtime_error("setrlimit failed");
      }
      auto server = start_server(token, job_id, std::chrono::seconds(5), torch_clients);
      uint16_t port = server->port();
      if (::write(port_pipe[1], &port, sizeof(port)) != sizeof(port)) ::_exit(2);
      char c;
      // Until the parent closes its end (or dies): the server's whole life.
      while (::read(control_pipe[0], &c, 1) != 0 && errno == EINTR) {
      }
      server->stop();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "store server process: %s\n", e.what());
      code = 1;
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  ::close(port_pipe[1]);
  ::close(control_pipe[0]);
  control_ = control_pipe[1];
  pollfd p{port_pipe[0], POLLIN, 0};
  bool ready =
      ::poll(&p, 1, 10'000) == 1 && ::read(port_pipe[0], &port_, sizeof(port_)) == sizeof(port_);
  ::close(port_pipe[0]);
  if (!ready) throw std::runtime_error("the store server process did not report its port in 10 s");
}

ServerProcess::~ServerProcess() {
  ::close(control_);
  Deadline d = Deadline::after(std::chrono::seconds(10));
  while (!d.expired()) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ADD_FAILURE() << "the store server process did not exit within 10 s; killing it";
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
}

TcpStoreOptions client_options(uint16_t port, int rank, const std::string& token,
                               const std::string& job_id) {
  TcpStoreOptions options;
  options.host = "127.0.0.1";
  options.port = port;
  options.timeout = std::chrono::seconds(20);
  options.connect_timeout = std::chrono::seconds(10);
  options.job_id = job_id;
  options.token = token;
  options.rank = rank;
  return options;
}

std::string describe(const std::vector<ChildResult>& results) {
  std::string out;
  for (size_t r = 0; r < results.size(); ++r) {
    const auto& c = results[r];
    if (c.ok()) continue;
    out += fmt::format("rank {}: {}; ", r,
                       c.timed_out ? std::string("timed out")
                       : c.signal  ? fmt::format("killed by signal {}", c.signal)
                                   : fmt::format("exit code {}", c.exit_code));
  }
  return out.empty() ? "all ranks ok" : out;
}

bool all_ok(const std::vector<ChildResult>& results) {
  for (const auto& c : results)
    if (!c.ok()) return false;
  return !results.empty();
}

}  // namespace dtrain::testing
