// The parameter server: server processes hold the parameters, workers push gradients and pull
// parameters (the shape of ps-lite, BytePS and TensorFlow's ps/worker jobs).
//
//   auto client = dtrain::ps::Client::from_env();          // finds the servers (ps_cluster.h)
//   client->create_dense("model", dtrain::TensorView::of(weights), {.optimizer = {.lr = 0.1f}});
//   for (...) {
//     compute_gradients(weights, grads);
//     client->push_pull("model", TensorView::of(grads), TensorView::of(weights)).wait();
//   }
//
// Dense tables are f32 tensors cut into slices spread over the servers so that every server holds
// about the same bytes; sparse tables are rows of a fixed width keyed by 64-bit ids, created on
// first touch and spread by a hash of the id. Servers apply the optimizer (SGD, momentum, Adam,
// Adagrad) or only add the gradients up (kSum, the BytePS design: workers run the optimizer).
//
// Consistency, per table:
//   kSync   every worker's n-th push of a slice is summed; once all have arrived the average is
//           applied once; a pull waits until the worker's own pushes are all applied.
//   kAsync  each push is applied on arrival; pulls never wait.
//   kBounded (SSP, `staleness` s) pushes are applied on arrival; a worker that has pushed c times
//           waits in pull until every other worker has pushed at least c - s times.
// A worker's clock on a table is the number of pushes it made to it. A worker that leaves cleanly
// (Client destroyed) no longer holds the others back; one that dies makes the waits on it fail at
// once with an error naming it.
//
// Every call is asynchronous and returns a Handle; the buffers passed in must stay alive and
// unchanged until it completes. Handles of one Client complete in the order their requests reach
// each server. One Client is safe to use from several threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dtrain/tensor.h"

namespace dtrain {
class Store;
}

namespace dtrain::ps {

enum class Consistency : uint8_t { kSync, kAsync, kBounded };

struct OptimizerOptions {
  enum class Kind : uint8_t { kSgd, kMomentum, kAdam, kAdagrad, kSum };
  Kind kind = Kind::kSgd;
  float lr = 0.01f;
  float momentum = 0.9f;  // kMomentum: v = momentum * v + g; w -= lr * v (as torch.optim.SGD)
  float beta1 = 0.9f;     // kAdam
  float beta2 = 0.999f;   // kAdam
  float eps = 1e-8f;      // kAdam, kAdagrad
  float weight_decay = 0.0f;
  float initial_accumulator = 0.0f;  // kAdagrad
};

struct TableOptions {
  OptimizerOptions optimizer;
  Consistency consistency = Consistency::kSync;
  uint32_t staleness = 0;  // kBounded only
};

// How the rows of a sparse table start (derived from the row's id and seed alone, so the same id
// starts equal wherever and whenever it is created).
struct RowInit {
  enum class Kind : uint8_t { kZeros, kUniform, kNormal };
  Kind kind = Kind::kZeros;
  float a = 0.0f;  // kUniform: low; kNormal: mean
  float b = 0.0f;  // kUniform: high; kNormal: standard deviation
  uint64_t seed = 0;
};

struct SparseTableOptions {
  size_t width = 0;  // floats per row
  RowInit init;
  TableOptions table;
  // Rows nobody touched for this long are dropped (they start again from `init`); 0 = never.
  std::chrono::seconds evict_after{0};
};

// Completion of one call. wait() throws the call's error: TimeoutError naming the servers that
// have not answered, PeerFailureError naming a server that died, InvalidArgumentError for a
// request a server refused (unknown table, wrong width or dtype), with the server's reason.
class Handle {
 public:
  struct State;
  Handle() = default;
  explicit Handle(std::shared_ptr<State> state) : state_(std::move(state)) {}
  // Waits up to the client's request timeout.
  void wait();
  void wait(std::chrono::milliseconds timeout);
  // Waits up to `slice` without giving up on the call: false if it has not completed by then,
  // true once it has (throwing its error). For callers that look up between waits (Python).
  bool wait_for(std::chrono::milliseconds slice);
  bool done() const;
  // What wait() without an argument allows: the client's request timeout.
  std::chrono::milliseconds timeout() const;

 private:
  std::shared_ptr<State> state_;
};

struct ClientOptions {
  std::vector<std::string> servers;  // "host:port" of server 0, 1, ...
  int worker = 0;                    // this worker's index, 0 .. num_workers - 1
  int num_workers = 1;
  std::chrono::milliseconds timeout{300'000};         // each request; DTRAIN_TIMEOUT
  std::chrono::milliseconds connect_timeout{60'000};  // reaching every server
  std::string job_id = "dtrain";                      // checked in every handshake
  std::string token;                                  // DTRAIN_AUTH_TOKEN
};

class Client {
 public:
  // Connects to every server (each within connect_timeout).
  explicit Client(const ClientOptions& options);
  // The servers' addresses from the store (keys ps/server/<i>, published by the servers), the
  // worker index and counts from the environment (see ps_cluster.h: DTRAIN_ROLE, TF_CONFIG,
  // DMLC_*).
  static std::unique_ptr<Client> from_env();
  // Says goodbye to every server (a departed worker no longer holds back sync and SSP tables),
  // after the outstanding requests completed or failed. Destroyed while an exception unwinds,
  // it says none: the servers count the worker as failed, and the waits on it fail, naming it.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Creates a dense f32 table of init.numel elements on the servers, or attaches to it when it
  // exists (another worker created it first, or a server restored it from a checkpoint): the first
  // creation's values win, and every later one must agree on size and options. Blocks until done.
  // Tables must be created in the same order on every worker (their placement depends on it).
  void create_dense(const std::string& name, TensorView init, const TableOptions& options = {});
  void create_sparse(const std::string& name, const SparseTableOptions& options);

  Handle push(const std::string& name, TensorView grad);
  Handle pull(const std::string& name, TensorView out);
  // A push, then a pull of the values that include it (one round trip per slice).
  Handle push_pull(const std::string& name, TensorView grad, TensorView out);

  // Sparse rows: out / grads hold ids.size() rows of the table's width. Repeated ids are pulled
  // once and pushed once (their gradients summed).
  Handle pull_rows(const std::string& table, std::span<const uint64_t> ids, TensorView out);
  Handle push_rows(const std::string& table, std::span<const uint64_t> ids, TensorView grads);

  // Asks every server to write a checkpoint of its tables now; returns the directories written.
  std::vector<std::string> checkpoint();
  // Tells every server that worker `worker` is gone for good (it died, and the others agreed to
  // go on without it: live recovery): it counts as having left, so that sync and SSP tables no
  // longer wait for it, and the step in progress of sync tables is dropped (the pushes of the
  // version not yet applied; a version the dead worker's push completed before it died stays
  // applied), for the others to redo. Every remaining worker calls it after its own pushes, and
  // none pushes again before all have (a barrier between). A process that connects as `worker`
  // later (a replacement) is taken in where the others stand.
  void forget_worker(int worker);

  int worker() const;
  int num_servers() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

struct ServerOptions {
  int index = 0;  // this server's index, 0 .. num_servers - 1
  int num_servers = 1;
  std::string listen_host;     // "" = every interface
  uint16_t port = 0;           // 0 = any free port
  std::string advertise_host;  // the address workers dial ("" = the local address)
  std::string job_id = "dtrain";
  std::string token;
  // Checkpoints of this server's tables go to checkpoint_dir/server-<index>/ (none when empty),
  // every checkpoint_every (0 = only on request); `restore` loads the newest good one at start.
  std::string checkpoint_dir;
  std::chrono::seconds checkpoint_every{0};
  int keep_checkpoints = 3;
  bool restore = false;
  // Serve until every worker that connected has said goodbye (or forever when false: until
  // stop() or a signal).
  bool exit_when_workers_leave = true;
};

class Server {
 public:
  explicit Server(const ServerOptions& options);  // listens; serves on background threads
  ~Server();                                      // stops serving, closes every connection
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  std::string address() const;  // host:port to dial
  // Publishes address() under ps/server/<index> in the store, for Client::from_env().
  void publish(Store& store);
  // Blocks until the workers left (exit_when_workers_leave) or stop() was called; false when
  // `timeout` passed first.
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds::max());
  void stop();
  // Writes a checkpoint now (checkpoint_dir must be set); returns its directory.
  std::string checkpoint();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Runs this process as a server of the job described by the environment (ps_cluster.h): listens,
// publishes its address, serves until the workers leave. What `dtrain ps-server` does; call it
// from your own program when the launcher starts it with DTRAIN_ROLE=server.
int run_server_from_env(ServerOptions options = {});

}  // namespace dtrain::ps
