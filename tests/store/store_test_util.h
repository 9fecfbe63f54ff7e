// Helpers shared by the store tests: byte conversions, a temporary directory, a server on a
// free port and client options with short limits, so a broken store fails a test in seconds.
#pragma once

#include <sys/resource.h>

#include <gtest/gtest.h>
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "dtrain/error.h"
#include "dtrain/store.h"
#include "support/multiproc.h"

namespace dtrain::testing {

inline Bytes to_bytes(std::string_view s) { return Bytes(s.begin(), s.end()); }
inline std::string to_text(const Bytes& b) { return std::string(b.begin(), b.end()); }

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A server on a free port with a job id of its own, so the environment cannot interfere.
inline constexpr const char* kTestJob = "store-test";
std::unique_ptr<TcpStoreServer> start_server(
    const std::string& token = "", const std::string& job_id = kTestJob,
    std::chrono::milliseconds handshake_timeout = std::chrono::seconds(5),
    bool torch_clients = false);

// A TcpStoreServer in a child process of its own, for tests that fork ranks: forking while this
// process runs server threads could copy a lock held mid-call (OpenSSL's random generator, in a
// handshake) into a child, which would then hang on it forever.
class ServerProcess {
 public:
  // max_files: the child's RLIMIT_NOFILE (0 = inherited); torch_clients: TcpStoreServerOptions's,
  // as `dtrain run` sets it (silent connections are then held without a time limit).
  explicit ServerProcess(const std::string& token = "", const std::string& job_id = kTestJob,
                         rlim_t max_files = 0, bool torch_clients = false);
  // Closes the control pipe; the child stops its server and exits (killed if it has not in 10 s).
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  uint16_t port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int control_ = -1;  // our end of the pipe whose closing tells the child to stop
  uint16_t port_ = 0;
};

// Client options for 127.0.0.1:port with limits of a few seconds.
TcpStoreOptions client_options(uint16_t port, int rank = 0, const std::string& token = "",
                               const std::string& job_id = kTestJob);

// Each child's outcome, for assertion messages.
std::string describe(const std::vector<ChildResult>& results);
bool all_ok(const std::vector<ChildResult>& results);

}  // namespace dtrain::testing
