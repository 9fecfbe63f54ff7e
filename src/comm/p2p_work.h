// The Work of one send or receive on a pair. It ends its flight record when it learns the
// request finished (or is dropped unfinished).
#pragma once

#include <cstdint>
#include <memory>

#include "dtrain/work.h"
#include "transport/pair.h"

namespace dtrain::comm {

class PairWork : public Work {
 public:
  // `flight`: the call's flight-recorder ticket (0: none).
  explicit PairWork(std::shared_ptr<transport::Request> request, uint64_t flight = 0);
  ~PairWork() override;

  bool is_completed() override;
  void wait_until_done(std::optional<std::chrono::milliseconds> timeout) override;
  std::exception_ptr exception() const override { return request_->completion.error(); }

 private:
  void note_end();

  std::shared_ptr<transport::Request> request_;
  uint64_t flight_ = 0;  // until it is ended
};

}  // namespace dtrain::comm
