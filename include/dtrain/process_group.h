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
#include <string_view>
#include <vector>

#include "dtrain/identity.h"
#include "dtrain/reduce_op.h"
#include "dtrain/store.h"
#include "dtrain/tensor.h"
#include "dtrain/work.h"

namespace dtrain {

struct ProcessGroupOptions {
  std::chrono::milliseconds timeout{0};          // 0 = DTRAIN_TIMEOUT (300 s)
  std::chrono::milliseconds connect_timeout{0};  // 0 = DTRAIN_CONNECT_TIMEOUT (60 s)
  std::string listen_host;                       // interface to listen on; "" = every interface
  std::string advertise_addr;  // address peers dial; "" = DTRAIN_SOCKET_ADDR or the local
                               // address of the store connection
  std::string name = "world";  // names the group in store keys, logs and errors
  std::string transport;  // "auto" (shared memory on one host), "tcp", "shm"; "" = DTRAIN_TRANSPORT
  std::string job_id;     // "" = DTRAIN_JOB_ID
  std::string token;      // "" = DTRAIN_AUTH_TOKEN
  std::string backend;    // native, gloo, mpi or nccl; "" = DTRAIN_BACKEND, else native
  // How long the group's worker leaves an asynchronous collective before starting it, so that
  // a caller that waits for it at once runs it on its own thread (native backend): for blocking
  // APIs built on asynchronous calls, such as torch.distributed's (whose backend sets 200 us).
  // 0 = the worker starts it at once.
  std::chrono::microseconds async_grace{0};
};

struct SendOptions {
  std::chrono::milliseconds timeout{0};  // 0 = the group default
};
struct RecvOptions {
  std::chrono::milliseconds timeout{0};  // 0 = the group default
};

// Options of the collectives. `algorithm` picks one by name ("ring", "halving_doubling",
// "recursive_doubling", "tree", "scatter_allgather", "central", "pairwise", "dissemination"...);
// empty = the cost model's choice (or DTRAIN_ALGO). docs/algorithms.md lists them.
// `async_op` (as in torch.distributed): true runs the collective on the group's worker thread,
// so the caller may compute meanwhile; false runs it on the calling thread, after the group's
// earlier collectives, and returns a Work that has finished (wait() still rethrows its error).
// A synchronous call saves the hand-off to the worker, which matters for small messages.
struct BroadcastOptions {
  int root = 0;
  std::chrono::milliseconds timeout{0};
  std::string algorithm;
  bool async_op = true;  // false: runs on the calling thread
};
struct ReduceOptions {
  int root = 0;
  ReduceOp op = ReduceOp::kSum;
  std::chrono::milliseconds timeout{0};
  std::string algorithm;
  bool async_op = true;  // false: runs on the calling thread
};
// How an all-reduce's values travel between ranks.
enum class Wire : uint8_t {
  kExact,  // as they are
  // f32 SUM or AVG on the native backend: each value as an int8, with one f32 scale per block
  // of 256 (3.9x fewer bytes than f32; the error within a block is at most half its largest
  // magnitude / 127, at each of two roundings). Every rank ends with the same values.
  kInt8,
  // Likewise, each value rounded to bf16 (2x fewer bytes; 8 significant bits, at each of two
  // roundings), added up in f32 as it arrives.
  kBf16,
  // Likewise in fp16 (2x fewer bytes; 11 significant bits, but magnitudes above 65504 become
  // infinite and those below 6e-8 zero: an AVG is safe where the inputs fit, a SUM where the sum
  // does; error feedback carries what underflows into later calls).
  kFp16,
  // As kInt8 with 4 bits a value, two to a byte, from -7 to 7 times the block's scale (7.8x fewer
  // bytes than f32; the error within a block is at most half its largest magnitude / 7, at each
  // of two roundings): ZeRO++'s gradient format. Meant for error feedback, which carries what
  // each rounding lost into the next call.
  kInt4,
};
// "exact", "int8", "bf16", "fp16", "int4".
std::string_view to_string(Wire wire);
// The inverse; throws InvalidArgumentError naming the choices.
Wire parse_wire(std::string_view name);
struct AllreduceOptions {
  ReduceOp op = ReduceOp::kSum;
  std::chrono::milliseconds timeout{0};
  std::string algorithm;
  bool async_op = true;  // false: runs on the calling thread
  Wire wire = Wire::kExact;
  // Any wire but kExact, optional: error feedback, an f32 buffer of the tensor's numel that the
  // caller keeps from one call to the next, zeros at first (the same tensor, ranks and numel each
  // time). What this call's rounding lost is carried into the next, so that rounding errors do
  // not accumulate over steps. Empty: none.
  TensorView error;
};
struct AllgatherOptions {
  std::chrono::milliseconds timeout{0};
  std::string algorithm;
  bool async_op = true;  // false: runs on the calling thread
};
struct GatherOptions {
  int root = 0;
  std::chrono::milliseconds timeout{0};
  bool async_op = true;  // false: runs on the calling thread
};
struct ScatterOptions {
  int root = 0;
  std::chrono::milliseconds timeout{0};
  bool async_op = true;  // false: runs on the calling thread
};
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::kSum;
  std::chrono::milliseconds timeout{0};
  std::string algorithm;
  bool async_op = true;  // false: runs on the calling thread
};
struct AlltoallOptions {
  std::chrono::milliseconds timeout{0};
  bool async_op = true;  // false: runs on the calling thread
};
struct BarrierOptions {
  std::chrono::milliseconds timeout{0};
  std::string algorithm;
  bool async_op = true;  // false: runs on the calling thread
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
  // Receives the next message with `tag` from whichever rank sends one first (MPI_ANY_SOURCE);
  // the Work's source_rank() says which, once it completed. The native backend only: the others
  // refuse it. Receives posted for a specific source are matched first when both could take a
  // message.
  virtual std::shared_ptr<Work> irecv_any(const TensorView& tensor, int tag = 0,
                                          const RecvOptions& options = {});
  void send(const TensorView& tensor, int dst, int tag = 0, const SendOptions& options = {}) {
    isend(tensor, dst, tag, options)->wait();
  }
  void recv(const TensorView& tensor, int src, int tag = 0, const RecvOptions& options = {}) {
    irecv(tensor, src, tag, options)->wait();
  }

  // Collectives. Every rank of the group calls the same collectives in the same order with
  // matching arguments; a rank that disagrees makes all of them fail with an error naming who
  // called what. They run in call order on the group's worker thread; the returned Work is
  // waited on like any other. Tensors are contiguous buffers of `numel` elements.

  // root's tensor is copied to every rank's tensor.
  virtual std::shared_ptr<Work> broadcast(const TensorView& tensor,
                                          const BroadcastOptions& options = {}) = 0;
  // In place: every rank ends with the reduction of all ranks' tensors.
  virtual std::shared_ptr<Work> allreduce(const TensorView& tensor,
                                          const AllreduceOptions& options = {}) = 0;
  // Out of place: output (same size and dtype as input) gets the reduction; input is untouched.
  std::shared_ptr<Work> allreduce(const TensorView& input, const TensorView& output,
                                  const AllreduceOptions& options = {});
  // In place: root ends with the reduction; other ranks' tensors are left undefined.
  virtual std::shared_ptr<Work> reduce(const TensorView& tensor,
                                       const ReduceOptions& options = {}) = 0;
  // output (size() * input.numel) = every rank's input, in rank order.
  virtual std::shared_ptr<Work> allgather(const TensorView& output, const TensorView& input,
                                          const AllgatherOptions& options = {}) = 0;
  // output = the concatenation of rank r's input of counts[r] elements, in rank order.
  virtual std::shared_ptr<Work> allgatherv(const TensorView& output, const TensorView& input,
                                           const std::vector<size_t>& counts,
                                           const AllgatherOptions& options = {}) = 0;
  // At root, output (size() * input.numel) = every rank's input; output unused elsewhere.
  virtual std::shared_ptr<Work> gather(const TensorView& output, const TensorView& input,
                                       const GatherOptions& options = {}) = 0;
  // Rank r's output = block r of root's input (size() * output.numel); input unused elsewhere.
  virtual std::shared_ptr<Work> scatter(const TensorView& output, const TensorView& input,
                                        const ScatterOptions& options = {}) = 0;
  // output (n elements) = block `rank()` of the reduction of every rank's input (size() * n).
  virtual std::shared_ptr<Work> reduce_scatter(const TensorView& output, const TensorView& input,
                                               const ReduceScatterOptions& options = {}) = 0;
  // Block j of input (size() equal blocks) goes to rank j; block i of output came from rank i.
  virtual std::shared_ptr<Work> alltoall(const TensorView& output, const TensorView& input,
                                         const AlltoallOptions& options = {}) = 0;
  // input is cut into blocks of input_counts[j] elements for rank j; output receives
  // output_counts[i] elements from rank i, in rank order.
  virtual std::shared_ptr<Work> alltoallv(const TensorView& output,
                                          const std::vector<size_t>& output_counts,
                                          const TensorView& input,
                                          const std::vector<size_t>& input_counts,
                                          const AlltoallOptions& options = {}) = 0;
  virtual std::shared_ptr<Work> barrier(const BarrierOptions& options = {}) = 0;

  // A group of the given ranks of this one (in that order: ranks[i] becomes rank i). Every rank
  // of this group calls it with the same list; ranks not in it get null. Sub-groups share this
  // group's connections and have their own sequence numbers.
  virtual std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) = 0;

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
