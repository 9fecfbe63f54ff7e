// The Work of one send or receive on a TCP pair.
#pragma once

#include <memory>

#include "dtrain/work.h"
#include "transport/pair.h"

namespace dtrain::comm {

class PairWork : public Work {
 public:
  explicit PairWork(std::shared_ptr<transport::Request> request) : request_(std::move(request)) {}

  bool is_completed() override;
  void wait_until_done(std::optional<std::chrono::milliseconds> timeout) override;
  std::exception_ptr exception() const override { return request_->completion.error(); }

 private:
  std::shared_ptr<transport::Request> request_;
};

}  // namespace dtrain::comm
