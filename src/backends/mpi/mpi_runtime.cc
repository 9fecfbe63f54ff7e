#include "backends/mpi/mpi_runtime.h"

#include <cstdlib>

#include <fmt/format.h>

#include "common/log.h"
#include "dtrain/error.h"

namespace dtrain::backends::mpi {
namespace {

std::mutex g_init_mu;     // guards the initialisation
std::mutex g_call_mu;     // serialises MPI calls when the library is not thread-multiple
bool g_serialize = true;  // written once under g_init_mu, before any group exists

void finalize_at_exit() {
  int done = 0;
  MPI_Finalized(&done);
  if (!done) MPI_Finalize();
}

}  // namespace

void ensure_initialized() {
  std::lock_guard lock(g_init_mu);
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS)
      throw InvalidArgumentError(
          fmt::format("backend mpi: MPI_Init_thread failed: {}", error_string(rc)));
    std::atexit(finalize_at_exit);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  } else {
    MPI_Query_thread(&provided);
  }
  g_serialize = provided < MPI_THREAD_MULTIPLE;
  if (g_serialize)
    DTRAIN_LOG_DEBUG(
        "backend mpi: the MPI library gives thread level {} (< MPI_THREAD_MULTIPLE): "
        "MPI calls are serialised",
        provided);
}

bool finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

CallLock::CallLock() : mu_(g_serialize ? &g_call_mu : nullptr) {
  if (mu_) mu_->lock();
}

CallLock::~CallLock() {
  if (mu_) mu_->unlock();
}

std::optional<MPI_Datatype> datatype_of(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
    case DType::kI8:
      return MPI_INT8_T;
    case DType::kU8:
      return MPI_UINT8_T;
    case DType::kI16:
      return MPI_INT16_T;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kF16:
    case DType::kBF16:
      return std::nullopt;
  }
  return std::nullopt;
}

MPI_Op op_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;
    case ReduceOp::kProd:
      return MPI_PROD;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kBand:
      return MPI_BAND;
    case ReduceOp::kBor:
      return MPI_BOR;
    case ReduceOp::kBxor:
      return MPI_BXOR;
  }
  return MPI_SUM;
}

std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<size_t>(len));
}

}  // namespace dtrain::backends::mpi
