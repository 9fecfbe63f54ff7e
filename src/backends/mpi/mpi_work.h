// The Work of one MPI request (an MPI_Isend, MPI_Irecv or non-blocking collective). MPI has no
// timeouts, so wait() polls MPI_Test until the deadline, backing off from yielding to short
// sleeps. When the deadline passes, a receive is cancelled (MPI_Cancel: nothing is written into
// the buffer afterwards); a send or a collective cannot be cancelled in MPI, so the request is
// abandoned and the group is marked unusable (on_stuck), since MPI may still touch its buffers.
#pragma once

#include <mpi.h>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/completion.h"
#include "common/deadline.h"
#include "dtrain/work.h"

namespace dtrain::backends::mpi {

class MpiWork : public Work {
 public:
  enum class Kind { kSend, kRecv, kCollective };
  // `what` names the operation: "rank 0: all_reduce of f32 x 1024 (4096 bytes) as collective
  // #3 of group world (mpi)". on_stuck is called when an uncancellable request is abandoned.
  MpiWork(Kind kind, std::string what, Deadline deadline,
          std::function<void(std::exception_ptr)> on_stuck);
  ~MpiWork() override;

  // Where the caller starts its MPI_I* call.
  MPI_Request* request() { return &request_; }
  // Integers MPI reads until completion (counts and displacements of the v-collectives).
  std::vector<int>& keep(size_t n) { return kept_.emplace_back(n); }
  // Runs once the request completed successfully (AVG's division, size checks).
  void on_success(std::function<void(const MPI_Status&)> f) { on_success_ = std::move(f); }
  // When starting the request failed: the Work is complete with this error.
  void fail_start(std::exception_ptr error) { completion_.fail(std::move(error)); }

  bool is_completed() override;
  void wait_until_done(std::optional<std::chrono::milliseconds> timeout) override;
  std::exception_ptr exception() const override { return completion_.error(); }

  // Ends the operation now with `error` (abort): cancels a receive, abandons the rest.
  void cancel(std::exception_ptr error);

 private:
  // One MPI_Test; completes the Work when MPI did. Caller holds mu_.
  bool test_locked();
  // Gives up on the request with `error` (see the header comment). Caller holds mu_.
  void give_up_locked(std::exception_ptr error);

  Kind kind_;
  std::string what_;
  Deadline deadline_;
  std::function<void(std::exception_ptr)> on_stuck_;
  std::function<void(const MPI_Status&)> on_success_;
  std::deque<std::vector<int>> kept_;  // a deque: keep() hands out references that must stay valid
  std::mutex mu_;                      // guards request_ (tested by one thread at a time)
  MPI_Request request_ = MPI_REQUEST_NULL;
  Completion completion_;
};

}  // namespace dtrain::backends::mpi
