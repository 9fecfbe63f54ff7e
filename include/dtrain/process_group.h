// ProcessGroup: the ranks of a job and the operations between them.
//
//   auto pg = dtrain::init_process_group();          // from RANK/WORLD_SIZE/MASTER_ADDR/...
//   std::vector<float> x(1024, pg->rank());
//   if (pg->rank() == 0) pg->send(dtrain::TensorView::of(x), 1);
//   else                 pg->recv(dtrain::TensorView::of(x), 0);
//
// Every operation takes an options struct whose timeout, when left at zero, means the group's
// default (ProcessGroupOptions::timeout, DTRAIN_TIMEOUT). Buffers must stay alive until the
// returned Work completes.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "dtrain/identity.h"
#include "dtrain/store.h"
#include "dtrain/tensor.h"
#include "dtrain/work.h"

namespace dtrain {

struct ProcessGroupOptions {
  std::chrono::milliseconds timeout{0};          // 0 = DTRAIN_TIMEOUT (300 s)
  std::chrono::milliseconds connect_timeout{0};  // 0 = DTRAIN_CONNECT_TIMEOUT (60 s)
  std::string listen_host;     // interface to listen on; "" = every interface
  std::string advertise_addr;  // address peers dial; "" = DTRAIN_SOCKET_ADDR or the local
                               // address of the store connection
  std::string name = "world";  // names the group in store keys, logs and errors
  std::string job_id;          // "" = DTRAIN_JOB_ID
  std::string token;           // "" = DTRAIN_AUTH_TOKEN
};

struct SendOptions {
  std::chrono::milliseconds timeout{0};  // 0 = the group default
};
struct RecvOptions {
  std::chrono::milliseconds timeout{0};  // 0 = the group default
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  // Connects `size` ranks through `store` (full mesh, one TCP connection per peer).
  static std::shared_ptr<ProcessGroup> create(std::shared_ptr<Store> store, int rank, int size,
                                              const ProcessGroupOptions& options = {});

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // Point to point. Messages between two ranks with the same tag arrive in the order sent; the
  // receive must have the same byte size as the send.
  virtual std::shared_ptr<Work> isend(const TensorView& tensor, int dst, int tag = 0,
                                      const SendOptions& options = {}) = 0;
  virtual std::shared_ptr<Work> irecv(const TensorView& tensor, int src, int tag = 0,
                                      const RecvOptions& options = {}) = 0;
  void send(const TensorView& tensor, int dst, int tag = 0, const SendOptions& options = {}) {
    isend(tensor, dst, tag, options)->wait();
  }
  void recv(const TensorView& tensor, int src, int tag = 0, const RecvOptions& options = {}) {
    irecv(tensor, src, tag, options)->wait();
  }

  // Fails every pending and future operation of the group at once with AbortedError(reason).
  virtual void abort(const std::string& reason) = 0;
};

struct InitOptions {
  IdentityOptions identity;  // rank, world size, master; unset fields come from the environment
  ProcessGroupOptions group;
};

// Who am I (resolve_identity), the rendezvous store (rank 0 hosts it unless the launcher does,
// DTRAIN_AGENT_STORE=1; file:// uses a FileStore), then the world group.
std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options = {});

}  // namespace dtrain
