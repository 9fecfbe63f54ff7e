// The native backend's ProcessGroup: dtrain's own TCP transport.
#pragma once

#include <memory>
#include <string>

#include "dtrain/process_group.h"
#include "transport/tcp/device.h"

namespace dtrain::comm {

class NativeProcessGroup : public ProcessGroup {
 public:
  NativeProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                     const ProcessGroupOptions& options);
  ~NativeProcessGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  std::shared_ptr<Work> isend(const TensorView& tensor, int dst, int tag,
                              const SendOptions& options) override;
  std::shared_ptr<Work> irecv(const TensorView& tensor, int src, int tag,
                              const RecvOptions& options) override;
  void abort(const std::string& reason) override;

 private:
  void check_peer(int peer, const TensorView& tensor, const char* op) const;
  Deadline deadline_for(std::chrono::milliseconds timeout) const {
    return Deadline::after(timeout.count() > 0 ? timeout : timeout_);
  }

  std::shared_ptr<Store> store_;
  int rank_;
  int size_;
  std::string name_;
  uint32_t group_id_ = 0;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<transport::tcp::Device> device_;
};

}  // namespace dtrain::comm
