#include "data/shard_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "data/tar_shard.h"
#include "dtrain/data/tfrecord.h"
#include "dtrain/error.h"

namespace dtrain::data {
namespace {

class TfRecordShard : public ShardFile {
 public:
  explicit TfRecordShard(const std::string& path) : file_(path) {}
  size_t size() const override { return file_.size(); }
  uint64_t data_bytes(size_t i) const override { return file_.data_bytes(i); }
  void read(size_t i, Record& out) const override { file_.read(i, out.bytes); }

 private:
  TfRecordFile file_;
};

// A gzip'd TFRecord file (TensorFlow's compression_type="GZIP"): its records cannot be reached
// at random, so it is decompressed, once, into a temporary file that has no name (it vanishes
// with its last descriptor, also when the process dies), and read from there.
class GzipTfRecordShard : public ShardFile {
 public:
  explicit GzipTfRecordShard(const std::string& path)
      : file_(decompress(path), path + " (decompressed)") {}
  size_t size() const override { return file_.size(); }
  uint64_t data_bytes(size_t i) const override { return file_.data_bytes(i); }
  void read(size_t i, Record& out) const override { file_.read(i, out.bytes); }

 private:
  static int decompress(const std::string& path) {
    const std::string dir = std::filesystem::temp_directory_path().string();
    int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {  // a file system without O_TMPFILE: a named file, unlinked at once
      std::string name = dir + "/dtrain-gunzip-XXXXXX";
      fd = ::mkostemp(name.data(), O_CLOEXEC);
      if (fd >= 0) ::unlink(name.c_str());
    }
    if (fd < 0)
      throw InvalidArgumentError(fmt::format(
          "decompressing {}: cannot create a temporary file in {}: {} (set TMPDIR to a folder "
          "with room for the decompressed shard)",
          path, dir, std::strerror(errno)));
    gzFile in = ::gzopen(path.c_str(), "rb");
    if (in == nullptr) {
      const int e = errno;
      ::close(fd);
      throw InvalidArgumentError(fmt::format("opening {} failed: {}", path, std::strerror(e)));
    }
    std::vector<char> chunk(size_t{1} << 20);
    uint64_t total = 0;
    for (;;) {
      const int n = ::gzread(in, chunk.data(), static_cast<unsigned>(chunk.size()));
      if (n < 0) {
        int code = 0;
        const std::string why = ::gzerror(in, &code);
        ::gzclose(in);
        ::close(fd);
        throw InvalidArgumentError(fmt::format(
            "{}: the gzip stream is damaged after {} decompressed bytes: {}", path, total, why));
      }
      if (n == 0) break;
      for (size_t done = 0; done < static_cast<size_t>(n);) {
        const ssize_t w = ::write(fd, chunk.data() + done, static_cast<size_t>(n) - done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
          const int e = errno;
          ::gzclose(in);
          ::close(fd);
          throw InvalidArgumentError(fmt::format(
              "decompressing {} into {} failed after {} bytes: {} (set TMPDIR to a folder with "
              "room for it)",
              path, dir, total + done, std::strerror(e)));
        }
        done += static_cast<size_t>(w);
      }
      total += static_cast<uint64_t>(n);
    }
    int code = Z_OK;
    const std::string why = ::gzerror(in, &code);
    ::gzclose(in);
    if (code == Z_BUF_ERROR) {  // the stream stopped before its end: a cut file
      ::close(fd);
      throw InvalidArgumentError(fmt::format(
          "{}: the gzip stream ends early, after {} decompressed bytes ({}): the file is "
          "truncated",
          path, total, why));
    }
    return fd;
  }

  TfRecordFile file_;
};

bool is_gzip(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // the reader's own open names the problem
  unsigned char magic[2] = {0, 0};
  const bool gz = ::pread(fd, magic, 2, 0) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  ::close(fd);
  return gz;
}

}  // namespace

bool is_tar_shard(const std::string& path) {
  return path.size() >= 4 && path.compare(path.size() - 4, 4, ".tar") == 0;
}

std::unique_ptr<ShardFile> open_shard(const std::string& path) {
  if (is_tar_shard(path)) return std::make_unique<TarShard>(path);
  if (is_gzip(path)) return std::make_unique<GzipTfRecordShard>(path);
  return std::make_unique<TfRecordShard>(path);
}

uint64_t count_shard_records(const std::string& path) {
  if (is_tar_shard(path)) return TarShard(path).size();
  if (is_gzip(path)) return GzipTfRecordShard(path).size();
  return count_tfrecords(path);
}

}  // namespace dtrain::data
