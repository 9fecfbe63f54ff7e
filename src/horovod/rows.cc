// Rows: the row counts and rows of Horovod's allgather and alltoall (see rows.h).
#include "horovod/rows.h"

#include <cstring>

namespace dtrain {

std::vector<int64_t> rows_of_every_rank(ProcessGroup& group, int64_t mine) {
  std::vector<int64_t> one = {mine};
  std::vector<int64_t> rows(static_cast<size_t>(group.size()));
  AllgatherOptions o;
  o.async_op = false;
  group.allgather(TensorView::of(rows), TensorView::of(one), o)->wait();
  return rows;
}

void gather_rows(ProcessGroup& group, const TensorView& in, const std::vector<int64_t>& rows,
                 int64_t row, const TensorView& out) {
  std::vector<size_t> counts;
  counts.reserve(rows.size());
  for (int64_t r : rows) counts.push_back(static_cast<size_t>(r * row));
  AllgatherOptions o;
  o.async_op = false;
  group.allgatherv(out, in, counts, o)->wait();
}

std::vector<int64_t> rows_to_receive(ProcessGroup& group, std::vector<int64_t> send) {
  std::vector<int64_t> recv(static_cast<size_t>(group.size()));
  AlltoallOptions o;
  o.async_op = false;
  group.alltoall(TensorView::of(recv), TensorView::of(send), o)->wait();
  return recv;
}

void exchange_rows(ProcessGroup& group, const TensorView& in, const std::vector<int64_t>& send,
                   const std::vector<int64_t>& recv, int64_t row, const TensorView& out) {
  std::vector<size_t> send_counts, recv_counts;
  for (int64_t s : send) send_counts.push_back(static_cast<size_t>(s * row));
  for (int64_t r : recv) recv_counts.push_back(static_cast<size_t>(r * row));
  AlltoallOptions o;
  o.async_op = false;
  group.alltoallv(out, recv_counts, in, send_counts, o)->wait();
}

std::vector<int64_t> scattered_rows(int64_t rows, int size) {
  std::vector<int64_t> parts(static_cast<size_t>(size), rows / size);
  for (int64_t r = 0; r < rows % size; ++r) parts[static_cast<size_t>(r)] += 1;
  return parts;
}

void reduce_scatter_rows(ProcessGroup& group, const TensorView& in, int64_t rows, int64_t row,
                         ReduceOp op, const TensorView& out) {
  const int n = group.size();
  const std::vector<int64_t> parts = scattered_rows(rows, n);
  ReduceScatterOptions o;
  o.op = op;
  o.async_op = false;
  if (rows % n == 0) {
    group.reduce_scatter(out, in, o)->wait();
    return;
  }
  // Uneven: every part padded to the largest (the first), so that the blocks are equal; the
  // padding is reduced and dropped.
  const size_t element = element_size(in.dtype);
  const size_t block = static_cast<size_t>(parts[0] * row);
  std::vector<std::byte> padded(static_cast<size_t>(n) * block * element);
  std::vector<std::byte> mine(block * element);
  size_t from = 0;
  for (int q = 0; q < n; ++q) {
    const size_t count = static_cast<size_t>(parts[static_cast<size_t>(q)] * row);
    std::memcpy(padded.data() + static_cast<size_t>(q) * block * element,
                static_cast<const std::byte*>(in.data) + from * element, count * element);
    from += count;
  }
  group
      .reduce_scatter(TensorView{mine.data(), block, in.dtype},
                      TensorView{padded.data(), static_cast<size_t>(n) * block, in.dtype}, o)
      ->wait();
  std::memcpy(out.data, mine.data(), out.nbytes());
}

}  // namespace dtrain
