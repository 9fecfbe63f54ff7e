// FullMesh: how the ranks of a group find and connect to each other. Each rank listens on a port
// of its own and publishes it in the store, dials every lower rank while it accepts every higher
// one (each connection passes a handshake, which turns strangers away), and in the end waits
// until every rank has made its pairs, so that none starts before all can. While the rendezvous
// waits, rank 0 says what for, every DTRAIN_STRAGGLER_SECONDS.
//
// As Gloo keeps connectFullMesh apart from its device, the device (device.h) takes the sockets
// this gives and makes them pairs.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/handshake.h"
#include "common/socket.h"
#include "dtrain/store.h"

namespace dtrain::transport {

struct FullMeshOptions {
  int rank = 0;
  int size = 1;
  std::string group_name = "world";
  uint64_t group_tag = 0;      // both ends of a connection must agree on it
  std::string listen_host;     // "" = every interface (or the advertised one, if loopback)
  std::string advertise_addr;  // the address peers dial (required)
  net::HandshakeConfig handshake;
};

class FullMesh {
 public:
  // Listens, and publishes this rank's address and `location` (what peers read back with
  // location_of: the device's host and rack). Every wait ends by `deadline`.
  FullMesh(Store& store, FullMeshOptions options, const Deadline& deadline,
           const std::string& location);

  // host:port this rank listens on, as published.
  const std::string& address() const { return address_; }
  // One connected socket per peer, past its handshake (none at this rank's own index): the
  // higher ranks accepted while the lower ones are dialled. Throws TimeoutError naming the ranks
  // that did not connect.
  std::vector<net::Fd> connect();
  // What `peer` published.
  std::string address_of(int peer);
  std::string location_of(int peer);
  // Waits until every rank has made its pairs (after connect()). Throws TimeoutError saying how
  // many did.
  void wait_for_all();

 private:
  void dial_lower_ranks(std::vector<net::Fd>& dialled);
  // Waits for `peer` to publish its address; rank 0's absence is said every report interval.
  void wait_for_address(int peer);
  // Rank 0 says what the rendezvous waits for, once per report interval.
  void report_if_due();
  // "3 of 4 ranks have registered, 2 have finished connecting; not registered: rank 3 (...)"
  std::string progress();

  Store& store_;
  const FullMeshOptions options_;
  const Deadline deadline_;
  net::Fd listener_;
  std::string address_;
  const std::string connected_key_;  // counts the ranks that made their pairs
  const std::chrono::milliseconds report_every_;
  Deadline next_report_;
};

}  // namespace dtrain::transport
