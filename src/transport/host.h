// Which ranks share a host: an identity that is equal exactly for processes that can share
// memory and loopback. Hostname + boot id + network namespace, so that the network namespaces
// the tests use as "hosts" count as different hosts.
#pragma once

#include <string>

namespace dtrain::transport {

std::string host_identity();

}  // namespace dtrain::transport
