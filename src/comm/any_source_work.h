// AnySourceWork: a receive from whichever peer sends a message with the tag first.
//
// The transport matches receives per pair; a receive that any of several pairs may complete
// would need every pair to agree on who takes a message. Instead this polls: it moves each pair's
// bytes and looks for an unclaimed message with the tag, then posts an ordinary receive on the
// first pair that has one, which that message completes (a pair's messages with one tag are
// matched in order). Polling backs off from 20 us to 1 ms while nothing has come; receiving from
// any source is rare (torch's recv without src, some master-worker codes), so simplicity wins.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "dtrain/tensor.h"
#include "dtrain/work.h"
#include "transport/pair.h"

namespace dtrain::comm {

class AnySourceWork : public Work {
 public:
  struct Peer {
    int group_rank;
    std::shared_ptr<transport::Pair> pair;
  };
  AnySourceWork(std::vector<Peer> peers, uint64_t tag, TensorView tensor, Deadline deadline,
                std::string what);

  bool is_completed() override;
  void wait_until_done(std::optional<std::chrono::milliseconds> timeout) override;
  std::exception_ptr exception() const override;
  int source_rank() const override;

 private:
  // One look at every pair; true once a receive is posted (or the work failed).
  bool probe_locked();

  std::vector<Peer> peers_;
  uint64_t tag_;
  TensorView tensor_;
  Deadline deadline_;
  std::string what_;       // "rank 0: recv from any source, tag 3, 64 bytes"
  mutable std::mutex mu_;  // guards everything below
  std::shared_ptr<transport::Request> request_;
  int source_ = -1;
  std::exception_ptr error_;
};

}  // namespace dtrain::comm
