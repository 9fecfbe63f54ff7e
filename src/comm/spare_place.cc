#include "comm/spare_place.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
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
  const auto given = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::system_clock::now().time_since_epoch());
  const std::string text = fmt::format("{} {} {}\n", place.rank, place.local_rank, given.count());
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
  int64_t given_us = 0;
  if (!(in >> place.rank >> place.local_rank >> given_us)) return std::nullopt;
  place.given = std::chrono::system_clock::time_point(std::chrono::microseconds(given_us));
  return place;
}

}  // namespace dtrain::comm
