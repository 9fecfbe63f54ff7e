// Builds a real process group inside a forked rank: rank 0 hosts the store on `port`.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "dtrain/process_group.h"
#include "dtrain/store.h"

namespace dtrain::testing {

inline std::shared_ptr<ProcessGroup> make_group(int rank, int size, int port,
                                                ProcessGroupOptions options = {},
                                                std::chrono::milliseconds timeout =
                                                    std::chrono::seconds(30)) {
  TcpStoreOptions so;
  so.host = "127.0.0.1";
  so.port = static_cast<uint16_t>(port);
  so.is_server = rank == 0;
  so.timeout = timeout;
  so.connect_timeout = std::chrono::seconds(20);
  so.rank = rank;
  auto store = std::make_shared<TcpStore>(so);
  if (options.timeout.count() == 0) options.timeout = timeout;
  if (options.connect_timeout.count() == 0) options.connect_timeout = std::chrono::seconds(20);
  return ProcessGroup::create(store, rank, size, options);
}

// Throws with a message when `cond` is false: assertions inside forked ranks.
#define RANK_CHECK(cond, ...)                                                            \
  do {                                                                                   \
    if (!(cond))                                                                         \
      throw std::runtime_error(fmt::format("check failed: {} ({}:{}) {}", #cond, __FILE__, \
                                           __LINE__, fmt::format(__VA_ARGS__)));         \
  } while (0)

}  // namespace dtrain::testing
