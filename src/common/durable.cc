#include "common/durable.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/format.h>

#include "common/log.h"
#include "common/socket.h"
#include "dtrain/error.h"

namespace dtrain::durable {

namespace fs = std::filesystem;
using net::Fd;

std::string errno_text(int err) { return fmt::format("{} ({})", std::strerror(err), err); }

void throw_io(int err, const std::string& what, const std::string& path) {
  std::string advice;
  switch (kind_of_errno(err)) {
    case ErrorKind::kResourceExhausted:
      advice = "; free space (or descriptors) there, or point the job at another directory";
      break;
    case ErrorKind::kDataLoss:
      advice =
          "; the device failed to store the bytes: check the disk (dmesg), and do not trust "
          "what is there";
      break;
    default:
      break;
  }
  throw_error(kind_of_errno(err),
              fmt::format("{} {} failed: {}{}", what, path, errno_text(err), advice));
}

uint32_t crc32_of(const void* data, size_t size, uint32_t start) {
  uLong crc = start;
  const auto* p = static_cast<const Bytef*>(data);
  while (size > 0) {  // zlib's length is a uInt
    const auto n = static_cast<uInt>(std::min<size_t>(size, std::numeric_limits<uInt>::max()));
    crc = crc32(crc, p, n);
    p += n;
    size -= n;
  }
  return static_cast<uint32_t>(crc);
}

FileSum sum_file(const std::string& path, bool sync) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) throw_io(errno, "opening", path);
  // fsync first: an error the kernel saw writing back the pages is reported here, once.
  if (sync && ::fsync(fd.get()) != 0) {
    const int err = errno;
    throw_error(ErrorKind::kDataLoss,
                fmt::format("fsync of {} failed: {}: what was written may not be on the disk", path,
                            errno_text(err)));
  }
  std::vector<unsigned char> buf(size_t{1} << 20);
  FileSum sum;
  uLong crc = crc32(0, nullptr, 0);
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_io(errno, "reading", path);
    if (n == 0) break;
    crc = crc32(crc, buf.data(), static_cast<uInt>(n));
    sum.bytes += static_cast<uint64_t>(n);
  }
  sum.crc = static_cast<uint32_t>(crc);
  return sum;
}

void write_file(const std::string& path, const void* bytes, size_t size) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) throw_io(errno, "creating", path);
  const auto* p = static_cast<const char*>(bytes);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd.get(), p + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      throw_io(err, fmt::format("writing {} of {} bytes to", size - done, size), path);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) {
    const int err = errno;
    if (kind_of_errno(err) == ErrorKind::kResourceExhausted) throw_io(err, "fsync of", path);
    throw_error(ErrorKind::kDataLoss,
                fmt::format("fsync of {} failed: {}: what was written may not be on the disk", path,
                            errno_text(err)));
  }
}

std::string read_file(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) throw_io(errno, "opening", path);
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_io(errno, "reading", path);
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

void fsync_dir(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) throw_io(errno, "opening the directory", dir);
  if (::fsync(fd.get()) != 0) {
    const int err = errno;
    throw_error(ErrorKind::kDataLoss,
                fmt::format("fsync of the directory {} failed: {}: a rename in it may not be on "
                            "the disk",
                            dir, errno_text(err)));
  }
}

void install(const std::string& tmp, const std::string& final_path, const std::string& dir) {
  fsync_dir(tmp);  // the names inside it
  if (::rename(tmp.c_str(), final_path.c_str()) == 0) return fsync_dir(dir);
  const int err = errno;
  if (err != ENOTEMPTY && err != EEXIST) throw_io(err, "renaming " + tmp + " to", final_path);
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) != 0) {
    // A filesystem without RENAME_EXCHANGE: set the old one aside first (names starting with a
    // dot are never taken for checkpoints, and remove_temporaries clears them).
    const std::string aside =
        fmt::format("{}/.{}.old-{}", dir, fs::path(final_path).filename().string(), ::getpid());
    if (::rename(final_path.c_str(), aside.c_str()) != 0 ||
        ::rename(tmp.c_str(), final_path.c_str()) != 0)
      throw_io(errno, "replacing", final_path);
    fsync_dir(dir);
    std::error_code ec;
    fs::remove_all(aside, ec);
    return;
  }
  fsync_dir(dir);
  std::error_code ec;
  fs::remove_all(tmp, ec);  // now the old one
}

std::vector<int64_t> list_numbered(const std::string& dir, const std::string& prefix) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    std::error_code dir_ec;
    if (e.is_directory(dir_ec)) out.push_back(std::stoll(digits));
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

std::string numbered_path(const std::string& dir, const std::string& prefix, int64_t n, int width) {
  return fmt::format("{}/{}{:0{}d}", dir, prefix, n, width);
}

std::string temporary_path(const std::string& dir, const std::string& prefix, int64_t n) {
  return fmt::format("{}/.{}{:06d}.tmp-{}", dir, prefix, n, ::getpid());
}

void remove_temporaries(const std::string& dir, const std::string& prefix) {
  const std::string mine = fmt::format("-{}", ::getpid());
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("." + prefix, 0) != 0) continue;
    const bool temp =
        name.find(".tmp-") != std::string::npos || name.find(".old-") != std::string::npos;
    const bool ours = name.size() >= mine.size() &&
                      name.compare(name.size() - mine.size(), mine.size(), mine) == 0;
    if (!temp || ours) continue;  // ours may be in progress
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (rm) {
      DTRAIN_LOG_WARN("cannot remove the unfinished save {}: {}", e.path().string(), rm.message());
    } else {
      DTRAIN_LOG_INFO("removed {}, left by a save that did not finish", e.path().string());
    }
  }
}

void prune(const std::string& dir, const std::string& prefix, int keep, int64_t newest_kept) {
  int kept = 0;
  for (int64_t n : list_numbered(dir, prefix)) {
    if (n <= newest_kept && kept < std::max(keep, 1)) {
      ++kept;
      continue;
    }
    const std::string path = numbered_path(dir, prefix, n);
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec) DTRAIN_LOG_WARN("cannot remove the old checkpoint {}: {}", path, ec.message());
  }
}

}  // namespace dtrain::durable
