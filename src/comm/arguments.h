// The argument checks every backend's ProcessGroup runs at the call, before anything is sent:
// one rule and one message per collective shape, whichever backend carries it. Each throws
// InvalidArgumentError naming this rank, the operation, the sizes and what to change.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "dtrain/error.h"
#include "dtrain/process_group.h"
#include "dtrain/tensor.h"

namespace dtrain::comm {

// What the checks need to know about the group that is checking.
struct GroupInfo {
  int rank;
  int size;
  std::string_view name;     // the group's name, e.g. "world" or "world.1"
  std::string_view backend;  // "native", "gloo", "mpi": in "backend X does not support ..."
  std::string_view no_cuda;  // why the backend takes no CUDA tensors, e.g. "not yet"
};

// "rank R: OP: backend B does not support WHAT on ON: WHY" (see docs/backends.md).
InvalidArgumentError unsupported(const GroupInfo& info, std::string_view op, std::string_view what,
                                 std::string_view on, std::string_view why);

// The world group's rank and size as given to ProcessGroup::create.
void check_rank_and_size(int rank, int size);

// A CPU tensor whose data pointer is set; `which` is "the input", "the output" or "the tensor".
void check_tensor(const GroupInfo& info, const TensorView& t, std::string_view op,
                  std::string_view which);
void check_root(const GroupInfo& info, int root, std::string_view op);
void check_same_dtype(const GroupInfo& info, const TensorView& out, const TensorView& in,
                      std::string_view op);
// A send's destination or a receive's source: another rank of the group; then the tensor.
void check_peer(const GroupInfo& info, int peer, const TensorView& tensor, std::string_view op);
// The ranks of new_group: each of the group, once, at least one.
void check_new_group(const GroupInfo& info, const std::vector<int>& ranks);

// One per collective shape: the tensors, their dtypes and their sizes.
void check_allgather(const GroupInfo& info, const TensorView& out, const TensorView& in);
// Returns the sum of `counts`.
size_t check_allgatherv(const GroupInfo& info, const TensorView& out, const TensorView& in,
                        const std::vector<size_t>& counts);
// The output is checked on the root only: the others may pass an empty one.
void check_gather(const GroupInfo& info, const TensorView& out, const TensorView& in, int root);
// The input is checked on the root only.
void check_scatter(const GroupInfo& info, const TensorView& out, const TensorView& in, int root);
void check_reduce_scatter(const GroupInfo& info, const TensorView& out, const TensorView& in);
void check_alltoall(const GroupInfo& info, const TensorView& out, const TensorView& in);
// An all-reduce's wire format: any but Wire::kExact takes f32 SUM or AVG, on the native backend
// only, and an error buffer of f32 with the tensor's numel, or none.
void check_wire(const GroupInfo& info, const TensorView& t, const AllreduceOptions& o);

struct AlltoallvTotals {
  size_t out = 0;  // elements this rank receives
  size_t in = 0;   // elements this rank sends
  // What every backend's errors and logs say of the call: "f32, sends 6 elements, receives 4".
  std::string describe(DType dtype) const;
};
AlltoallvTotals check_alltoallv(const GroupInfo& info, const TensorView& out,
                                const std::vector<size_t>& out_counts, const TensorView& in,
                                const std::vector<size_t>& in_counts);

}  // namespace dtrain::comm
