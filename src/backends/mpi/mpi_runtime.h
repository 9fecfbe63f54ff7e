// The MPI library as the mpi backend uses it: initialised once per process (with
// MPI_THREAD_MULTIPLE when the library offers it, finalised at exit when we initialised it), a
// lock that serialises MPI calls when it does not, and the mapping of dtrain's dtypes and
// reduction operators to MPI's.
#pragma once

#include <mpi.h>

#include <mutex>
#include <optional>
#include <string>

#include "dtrain/reduce_op.h"
#include "dtrain/tensor.h"

namespace dtrain::backends::mpi {

// Initialises MPI if nobody has (idempotent, thread-safe).
void ensure_initialized();
// True once MPI_Finalize ran: communicators must not be freed any more.
bool finalized();

// Held around every MPI call: a real lock only when MPI gave less than MPI_THREAD_MULTIPLE.
class CallLock {
 public:
  CallLock();
  ~CallLock();
  CallLock(const CallLock&) = delete;
  CallLock& operator=(const CallLock&) = delete;

 private:
  std::mutex* mu_;
};

// MPI's type for a dtype, or nullopt (f16 and bf16: MPI has no 16-bit floats).
std::optional<MPI_Datatype> datatype_of(DType dtype);
// MPI's operator (AVG is SUM, divided afterwards).
MPI_Op op_of(ReduceOp op);
// MPI_Error_string of an error code.
std::string error_string(int code);

}  // namespace dtrain::backends::mpi
