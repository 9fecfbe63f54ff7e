#include "comm/store_discovery.h"

#include <unistd.h>

#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "common/env.h"
#include "common/log.h"
#include "common/socket.h"
#include "dtrain/error.h"

namespace dtrain::comm {
namespace {

constexpr std::string_view kOk = "ok ", kError = "error ";

struct Channels {
  std::mutex mu;  // guards list (registered at static initialisation, read by init_process_group)
  std::vector<LauncherChannel> list;
};

Channels& channels() {
  static Channels c;
  return c;
}

const LauncherChannel* find_channel(const Identity& id) {
  Channels& c = channels();
  std::lock_guard lock(c.mu);
  for (const auto& ch : c.list)
    if (ch.serves(id)) return &ch;  // entries are never removed, so the pointer stays valid
  return nullptr;
}

bool master_named(const IdentityOptions& o) {
  return o.master_addr.has_value() || o.init_method.starts_with("tcp://") ||
         env::raw(env::kMasterAddr).has_value();
}

bool port_named(const IdentityOptions& o) {
  return o.master_port.has_value() || env::raw(env::kMasterPort).has_value();
}

// The address rank 0 tells the others: what they can dial to reach this host.
std::string published_host(const Identity& id) {
  if (auto v = env::raw(env::kSocketAddr)) return *v;
  if (id.local_world_size == id.world_size) return "127.0.0.1";  // every rank on this node
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0') return host;
  return "127.0.0.1";
}

std::shared_ptr<TcpStore> host_and_publish(const Identity& id, const LauncherChannel& channel,
                                           TcpStoreOptions so, bool fixed_port) {
  // The server listens on every interface; rank 0's own client dials the published address, so
  // that the local end of that connection (what rank 0 advertises to its peers) is one they can
  // reach, and an address that does not work fails here first.
  const std::string host = published_host(id);
  so.host = host;
  so.port = fixed_port ? id.master_port : 0;
  so.is_server = true;
  std::shared_ptr<TcpStore> store;
  try {
    store = std::make_shared<TcpStore>(so);
  } catch (const std::exception& e) {
    // The others are waiting for an address: give them the reason instead, then fail here too.
    try {
      channel.broadcast(id, std::string(kError) + e.what(), so.connect_timeout);
    } catch (const std::exception& ignored) {
      DTRAIN_LOG_WARN("could not tell the other ranks through {} why the store did not start: {}",
                      channel.name, ignored.what());
    }
    const auto* error = dynamic_cast<const Error*>(&e);
    if (error == nullptr) throw;
    throw_error(
        error->kind(),
        fmt::format(
            "rank 0 of {}: hosting the rendezvous store on {} failed: {}", id.world_size,
            fixed_port ? fmt::format("port {} (MASTER_PORT)", so.port) : std::string("a free port"),
            e.what()));
  }
  net::HostPort published{host, store->port()};
  channel.broadcast(id, std::string(kOk) + published.to_string(), so.connect_timeout);
  DTRAIN_LOG_DEBUG("rank 0 hosts the store on port {}, published to {} ranks as {} through {}",
                   store->port(), id.world_size, published.to_string(), channel.name);
  return store;
}

std::shared_ptr<TcpStore> join_published(const Identity& id, const LauncherChannel& channel,
                                         TcpStoreOptions so) {
  const std::string message = channel.broadcast(id, "", so.connect_timeout);
  if (message.starts_with(kError))
    throw PeerFailureError(
        fmt::format("rank {}: rank 0 could not start the rendezvous store, so no rank can join: {}",
                    id.rank, message.substr(kError.size())));
  if (!message.starts_with(kOk))
    throw InternalError(
        fmt::format("rank {}: rank 0 sent '{}' through {} instead of the store's "
                    "address",
                    id.rank, message, channel.name));
  net::HostPort at = net::parse_host_port(message.substr(kOk.size()), "the store address");
  so.host = at.host;
  so.port = at.port;
  so.is_server = false;
  DTRAIN_LOG_DEBUG("store at {} (published by rank 0 through {})", at.to_string(), channel.name);
  try {
    return std::make_shared<TcpStore>(so);
  } catch (const Error& e) {
    throw_error(
        e.kind(),
        fmt::format(
            "{}; rank 0 published {} through {}: if this host cannot reach that address, set "
            "DTRAIN_SOCKET_ADDR for rank 0 to one it can, or MASTER_ADDR and MASTER_PORT for every "
            "rank (mpirun -x MASTER_ADDR=... -x MASTER_PORT=...)",
            e.what(), at.to_string(), channel.name));
  }
}

}  // namespace

bool register_launcher_channel(LauncherChannel channel) {
  Channels& c = channels();
  std::lock_guard lock(c.mu);
  c.list.push_back(std::move(channel));
  return true;
}

std::shared_ptr<TcpStore> discover_store(const Identity& id, const IdentityOptions& options,
                                         const TcpStoreOptions& base) {
  // Only launchers that name no master; a world of one needs no rendezvous.
  if (id.source != "openmpi" && id.source != "pmi") return nullptr;
  if (master_named(options) || id.world_size == 1) return nullptr;
  if (const LauncherChannel* channel = find_channel(id)) {
    return id.rank == 0 ? host_and_publish(id, *channel, base, port_named(options))
                        : join_published(id, *channel, base);
  }
  if (id.local_world_size == id.world_size) return nullptr;  // one node: 127.0.0.1 is right
  const char* how = id.source == "openmpi" ? "mpirun -x MASTER_ADDR=<host of rank 0> -x "
                                             "MASTER_PORT=29500 ..."
                                           : "export MASTER_ADDR=<host of rank 0> to every rank";
  throw InvalidArgumentError(fmt::format(
      "rank {} of {}: the launcher ({}) started the job on several nodes ({} of its {} processes "
      "on this one) but MASTER_ADDR is not set, and this program has no launcher channel to ask "
      "rank 0 where its store listens; set it ({}), or link the program with the "
      "dtrain_backends CMake target so that OpenMPI's mpirun can carry the address",
      id.rank, id.world_size, id.source, id.local_world_size, id.world_size, how));
}

}  // namespace dtrain::comm
