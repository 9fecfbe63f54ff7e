// Device: this process's endpoint for one group of ranks. It connects to every peer over TCP
// through the store (full_mesh.h, all within the connect timeout), moves the connections with
// peers on this host onto shared memory (shm/setup.h), makes them pairs, and runs the event
// loop the pairs share.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/handshake.h"
#include "dtrain/store.h"
#include "transport/loop.h"
#include "transport/pair.h"

namespace dtrain::transport {

class FullMesh;

struct DeviceOptions {
  int rank = 0;
  int size = 1;
  std::string group_name = "world";
  uint64_t group_tag = 0;      // both ends of a pair must agree on it
  std::string listen_host;     // "" = every interface
  std::string advertise_addr;  // the address peers dial (required)
  net::HandshakeConfig handshake;
  std::chrono::milliseconds connect_timeout{60'000};
  std::chrono::microseconds spin{50};
  bool oversubscribed = false;
  std::string transport = "auto";  // auto, tcp or shm (DTRAIN_TRANSPORT)
};

class Device {
 public:
  // Blocks until every pair is connected; throws TimeoutError naming the missing ranks.
  Device(Store& store, const DeviceOptions& options);
  ~Device();  // fails whatever is still pending (AbortedError), then stops the loop
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const std::shared_ptr<Pair>& pair(int peer) const { return pairs_[peer]; }
  int rank() const { return options_.rank; }
  int size() const { return options_.size; }
  const std::string& address() const { return address_; }
  // The host identity (host.h) of every rank.
  const std::string& host_of(int rank) const { return hosts_[rank]; }
  const std::string& rack_of(int rank) const { return racks_[rank]; }  // "" = not told
  // More ranks on this machine (all its network namespaces) than cores: waits yield.
  bool oversubscribed() const { return options_.oversubscribed; }
  std::chrono::microseconds spin() const { return options_.spin; }
  // Fails every pending and future operation on every pair with `error`.
  void abort(std::exception_ptr error);

  // Groups sharing this device (the world and its sub-groups, by group id) hear of failures
  // reported by peers: `mark` at once (with a pair's lock held: it must only set state), then
  // `handle` on the loop thread (free to talk to the store). seq is the failed collective's.
  struct GroupHandlers {
    std::function<void(uint32_t seq, std::exception_ptr)> mark;
    std::function<void(uint32_t seq, std::exception_ptr)> handle;
    // A peer's message for collective `seq` carries another call's fingerprint, or arrived
    // after this rank finished `seq` without a receive for it (`ours` 0). Called at once, like
    // `mark`; returns the error the group's requests then fail with (on the loop thread).
    std::function<std::exception_ptr(uint32_t seq, int peer, uint64_t theirs, uint64_t ours)>
        mismatch;
  };
  void register_group(uint32_t group_id, GroupHandlers handlers);
  void unregister_group(uint32_t group_id);
  // A collective of the group starts: messages of it that arrive before their receives are
  // posted are checked against `fingerprint`, and so are those that already arrived.
  void expect(uint32_t group_id, uint32_t seq, uint64_t fingerprint);
  // From a pair (its lock held): a message nobody is waiting for yet has arrived. One of the
  // group's current collective must carry its fingerprint; one of a finished collective is a
  // mismatch whatever it carries.
  void note_unexpected(uint64_t tag, uint64_t aux, int peer);

  // The group failed on this rank: fail its requests on every pair here (from the collective
  // `tag` names, if it names one: see Pair::fail_group) and tell `peers` (world ranks) why, so
  // that they fail at once instead of waiting for their timeouts.
  void fail_group(uint32_t group_id, uint64_t tag, const std::vector<int>& peers,
                  std::exception_ptr error, const std::string& text);

 private:
  struct Notice {
    uint64_t tag;
    int peer;
    std::string text;
    std::exception_ptr mismatch;  // set for a mismatch (text unused)
  };
  struct Seen {
    uint32_t seq = 0;
    uint64_t aux = 0;
    int peer = -1;
  };
  void mismatch_locked(uint64_t tag, int peer, uint64_t theirs, uint64_t ours);
  void on_notice(uint64_t tag, int peer, std::string text);
  void process_notices();

  // The steps of connecting, after the mesh's sockets (full_mesh.h): where each peer runs,
  // whether this machine's cores are oversubscribed, shared memory with the peers on this host,
  // and the pairs.
  void learn_locations(FullMesh& mesh);
  void note_oversubscription();
  std::vector<shm::Segment> share_memory(std::vector<net::Fd>& fds, const Deadline& deadline);
  void make_pairs(FullMesh& mesh, std::vector<net::Fd>& fds, std::vector<shm::Segment>& segments);

  DeviceOptions options_;
  std::string address_;  // host:port this device listens on, as published
  std::shared_ptr<Loop> loop_;
  std::vector<std::shared_ptr<Pair>> pairs_;  // indexed by peer rank; null for self
  std::vector<std::string> hosts_;            // host identity of every rank
  std::vector<std::string> racks_;            // rack of every rank (transport/host.h)
  std::mutex groups_mu_;                      // guards groups_ and notices_
  std::map<uint32_t, GroupHandlers> groups_;
  std::vector<Notice> notices_;
  std::mutex expect_mu_;                                        // guards expected_ and seen_
  std::map<uint32_t, std::pair<uint32_t, uint64_t>> expected_;  // group -> (seq, fingerprint)
  std::map<uint32_t, std::array<Seen, 8>> seen_;  // group -> unexpected arrivals, by seq % 8
};

}  // namespace dtrain::transport
