// The parameter server (ps/server.cc) reading arbitrary frames from a worker that passed the
// handshake: it answers, refuses or drops the connection, and keeps serving; it never crashes.
// Each input is one connection of worker 0 of 1, to a server of its own (tables an input creates
// would otherwise pile up over the run).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "common/handshake.h"
#include "common/socket.h"
#include "dtrain/error.h"
#include "dtrain/ps.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return -1;
  dtrain::ps::ServerOptions options;
  options.listen_host = "127.0.0.1";
  options.exit_when_workers_leave = false;
  dtrain::ps::Server server(options);
  const std::string address = server.address();
  const auto port = static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
  try {
    using namespace std::chrono_literals;
    dtrain::net::Fd fd =
        dtrain::net::connect_tcp({"127.0.0.1", port}, dtrain::Deadline::after(5s), "fuzz");
    dtrain::net::handshake_connect(fd.get(), {"dtrain", ""},
                                   dtrain::net::Hello{dtrain::net::Role::kPsClient, 0, 0, 1}, 0,
                                   dtrain::Deadline::after(5s), "fuzz");
    dtrain::net::write_all(fd.get(), data, size, dtrain::Deadline::after(5s), "fuzz");
    ::shutdown(fd.get(), SHUT_WR);
    // Whatever the server answers, until it closes (or a request it parks times out here).
    char buf[4096];
    for (;;) {
      pollfd p{fd.get(), POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) break;
      if (::read(fd.get(), buf, sizeof(buf)) <= 0) break;
    }
  } catch (const dtrain::Error&) {
  }
  return 0;
}
