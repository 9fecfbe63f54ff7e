#include "data/output_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::data {
namespace {

constexpr size_t kBuffer = size_t{1} << 20;

[[noreturn]] void io_error(const std::string& what, const std::string& path, int err) {
  throw InvalidArgumentError(fmt::format("{} {} failed: {}", what, path, std::strerror(err)));
}

}  // namespace

OutputFile::OutputFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) io_error("creating", tmp_, errno);
  buffer_.reserve(kBuffer);
}

OutputFile::~OutputFile() {
  if (fd_ >= 0 || finished_) discard();
}

void OutputFile::discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  finished_ = false;
  ::unlink(tmp_.c_str());
}

void OutputFile::write(const void* data, size_t n) {
  if (fd_ < 0) throw InvalidArgumentError(fmt::format("{}: written after it was finished", path_));
  const auto* p = static_cast<const std::byte*>(data);
  size_ += n;
  if (buffer_.size() + n > kBuffer) flush();
  if (n < kBuffer) {
    buffer_.insert(buffer_.end(), p, p + n);
    return;
  }
  write_through(p, n);  // a large piece straight to the file
}

void OutputFile::flush() {
  write_through(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void OutputFile::write_through(const std::byte* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      discard();
      io_error("writing", tmp_, err);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void OutputFile::finish(bool sync) {
  if (fd_ < 0) return;
  flush();
  if (sync && ::fsync(fd_) != 0) {
    const int err = errno;
    discard();
    io_error("fsync of", tmp_, err);
  }
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    io_error("closing", tmp_, err);
  }
  finished_ = true;
}

void OutputFile::install() {
  finish(/*sync=*/false);
  if (!finished_) return;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    discard();
    io_error("installing", path_, err);
  }
  finished_ = false;
}

}  // namespace dtrain::data
