#include "comm/spare_place.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>

#include <fmt/format.h>

#include "common/durable.h"

namespace dtrain::comm {

std::string spare_place_path(const std::string& dir, int spare) {
  return fmt::format("{}/spare{}.place", dir, spare);
}

void write_spare_place(const std::string& dir, int spare, SparePlace place) {
  // A message between two processes of one machine, not a record to keep: no fsync. The rename
  // makes the spare read all of it or nothing.
  const std::string path = spare_place_path(dir, spare);
  const std::string tmp = path + ".tmp";
  const std::string text = fmt::format("{} {}\n", place.rank, place.local_rank);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) durable::throw_io(errno, "creating", tmp);
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int write_errno = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size()))
    durable::throw_io(n < 0 ? write_errno : ENOSPC, "writing", tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0) durable::throw_io(errno, "renaming", tmp);
}

std::optional<SparePlace> read_spare_place(const std::string& dir, int spare) {
  std::ifstream in(spare_place_path(dir, spare));
  SparePlace place;
  if (in >> place.rank >> place.local_rank) return place;
  return std::nullopt;
}

}  // namespace dtrain::comm
