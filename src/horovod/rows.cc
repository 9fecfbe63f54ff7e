// Rows: the row counts and rows of Horovod's allgather and alltoall (see rows.h).
#include "horovod/rows.h"

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

}  // namespace dtrain
