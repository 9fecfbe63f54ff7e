// The mpi backend's launcher channel for store discovery (comm/store_discovery.h): under
// OpenMPI's mpirun, MPI_COMM_WORLD reaches every rank before any store exists, so rank 0 tells the
// others where its store listens and `mpirun -np 4 ./train` needs no MASTER_ADDR. Linked into
// every program that links dtrain_backends, whatever backend it then uses.
//
// MPI has no timeouts: MPI_Init runs on a helper thread waited for until the deadline, and the
// message travels in an MPI_Ibcast polled with MPI_Test until the same deadline.
#include <array>
#include <cstring>
#include <future>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "backends/mpi/mpi_runtime.h"
#include "comm/store_discovery.h"
#include "common/deadline.h"
#include "dtrain/error.h"

namespace dtrain::backends::mpi {
namespace {

// Room for "ok <host>:<port>" or rank 0's error message (truncated to fit).
constexpr size_t kMessageBytes = 2048;

// MPI_Init returns only once every rank that mpirun started has called it, so a rank that never
// gets there would hold the others forever. It runs on a helper thread here, waited for until the
// deadline (OpenMPI grants MPI_THREAD_MULTIPLE, so the thread that initialises does not matter);
// past it this rank fails, and mpirun then ends the job. The helper stays blocked until exit.
void initialize_within(const Identity& id, const Deadline& deadline) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  auto result = std::make_shared<std::promise<std::exception_ptr>>();
  std::future<std::exception_ptr> done = result->get_future();
  std::thread([result] {
    try {
      ensure_initialized();
      result->set_value(nullptr);
    } catch (...) {
      result->set_value(std::current_exception());
    }
  }).detach();
  if (done.wait_until(deadline.at()) != std::future_status::ready)
    throw TimeoutError(fmt::format(
        "rank {} of {}: MPI_Init did not finish within {}; it waits for every process mpirun "
        "started, so some rank has not reached init_process_group (stuck, slow or not started: "
        "look at its output); DTRAIN_CONNECT_TIMEOUT sets the limit, and MASTER_ADDR with "
        "MASTER_PORT avoid MPI altogether",
        id.rank, id.world_size, deadline.describe()));
  if (std::exception_ptr error = done.get()) std::rethrow_exception(error);
}

std::string broadcast(const Identity& id, const std::string& message,
                      std::chrono::milliseconds timeout) {
  const Deadline deadline = Deadline::after(timeout);
  initialize_within(id, deadline);
  int rank = 0, size = 1;
  {
    CallLock call;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  if (rank != id.rank || size != id.world_size)
    throw InvalidArgumentError(fmt::format(
        "rank {} of {} (from {}): MPI says this process is rank {} of {}; the environment and "
        "MPI disagree, so MPI cannot carry the store's address: set MASTER_ADDR and MASTER_PORT",
        id.rank, id.world_size, id.source, rank, size));
  // On the heap: a broadcast that timed out cannot be cancelled and MPI may still write into the
  // buffer later, so then it is deliberately leaked (released below).
  auto buffer = std::make_unique<std::array<char, kMessageBytes>>();
  if (rank == 0)
    std::memcpy(buffer->data(), message.data(), std::min(message.size(), kMessageBytes - 1));
  MPI_Request request = MPI_REQUEST_NULL;
  int rc;
  {
    CallLock call;
    rc = MPI_Ibcast(buffer->data(), static_cast<int>(kMessageBytes), MPI_CHAR, 0, MPI_COMM_WORLD,
                    &request);
  }
  for (int polls = 0; rc == MPI_SUCCESS; ++polls) {
    int done = 0;
    {
      CallLock call;
      rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    }
    if (rc != MPI_SUCCESS || done) break;
    if (deadline.expired()) {
      (void)buffer.release();
      throw TimeoutError(fmt::format(
          "rank {} of {}: rank 0 did not publish the rendezvous store's address over "
          "MPI_COMM_WORLD within {}: is rank 0 alive and in init_process_group? "
          "(DTRAIN_CONNECT_TIMEOUT sets the limit; MASTER_ADDR and MASTER_PORT skip this step)",
          rank, size, deadline.describe()));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(polls < 100 ? 50 : 1000));
  }
  if (rc != MPI_SUCCESS)
    throw PeerFailureError(fmt::format(
        "rank {} of {}: MPI_Ibcast of the rendezvous store's address from rank 0 failed after {}: "
        "{}",
        rank, size, deadline.describe(), error_string(rc)));
  return std::string(buffer->data(), ::strnlen(buffer->data(), kMessageBytes));
}

[[maybe_unused]] const bool kRegistered = comm::register_launcher_channel(
    {.name = "MPI_COMM_WORLD",
     .serves = [](const Identity& id) { return id.source == "openmpi"; },
     .broadcast = broadcast});

}  // namespace
}  // namespace dtrain::backends::mpi
