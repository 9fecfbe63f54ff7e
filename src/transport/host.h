// Which ranks share a host: an identity that is equal exactly for processes that can share
// memory and loopback. Hostname + boot id + network namespace, so that the network namespaces
// the tests use as "hosts" count as different hosts. And which hosts share a rack (a switch):
// that cannot be seen from inside, so it is told.
#pragma once

#include <string>

namespace dtrain::transport {

std::string host_identity();

// The machine of a host identity: its hostname and boot id, without the network namespace.
// Hosts of one machine (emulated hosts, containers or pods of one node) share its cores.
inline std::string machine_of(const std::string& host) { return host.substr(0, host.rfind('|')); }

// The rack of this process's host, for the topology-aware collectives: DTRAIN_RACK, else the rack
// that the DTRAIN_TOPOLOGY file ({"racks": {"RACK": ["HOST or ADDRESS", ...], ...}}) gives this
// host's name or `address`, else "" (all in one rack). A file that cannot be read, is not that
// shape, or puts a host in two racks is an InvalidArgumentError naming it.
std::string rack_identity(const std::string& address);

}  // namespace dtrain::transport
