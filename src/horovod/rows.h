// Rows: Horovod's allgather and alltoall move whole rows of dimension 0, whose number may differ
// between ranks (the other dimensions agree). Free of any framework: the caller learns the row
// counts first, allocates its output from them, then moves the rows.
#pragma once

#include <cstdint>
#include <vector>

#include "dtrain/process_group.h"

namespace dtrain {

// Every rank's `mine` (its row count), in rank order: one allgather of 8 bytes.
std::vector<int64_t> rows_of_every_rank(ProcessGroup& group, int64_t mine);
// Every rank's rows of `in` (rows[r] from rank r, `row` elements each), concatenated along
// dimension 0 into `out`, which holds the sum of `rows`.
void gather_rows(ProcessGroup& group, const TensorView& in, const std::vector<int64_t>& rows,
                 int64_t row, const TensorView& out);
// How many rows each rank sends this one, given how many this one sends each (send[j] to rank
// j): one all-to-all of 8 bytes per rank.
std::vector<int64_t> rows_to_receive(ProcessGroup& group, std::vector<int64_t> send);
// Sends send[j] rows of `in` (`row` elements each) to rank j; recv[j] rows arrive from rank j,
// in rank order, into `out`, which holds the sum of `recv`.
void exchange_rows(ProcessGroup& group, const TensorView& in, const std::vector<int64_t>& send,
                   const std::vector<int64_t>& recv, int64_t row, const TensorView& out);

// The rows of dimension 0 each rank keeps of a reduce-scatter of `rows` rows over `size` ranks:
// equal parts, one more for each of the first rows % size ranks (Horovod's split).
std::vector<int64_t> scattered_rows(int64_t rows, int size);
// Every rank's `in` (`rows` rows of `row` elements, the same shape on every rank) reduced with
// `op`; this rank's part of the result (scattered_rows) into `out`.
void reduce_scatter_rows(ProcessGroup& group, const TensorView& in, int64_t rows, int64_t row,
                         ReduceOp op, const TensorView& out);

}  // namespace dtrain
