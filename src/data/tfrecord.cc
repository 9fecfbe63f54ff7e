#include "dtrain/data/tfrecord.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/byte_order.h"
#include "common/socket.h"  // net::Fd
#include "data/bad_record_hint.h"
#include "data/crc32c.h"
#include "data/output_file.h"
#include "dtrain/error.h"

namespace dtrain::data {
namespace {

constexpr char kIndexMagic[8] = {'D', 'T', 'R', 'I', 'D', 'X', '0', '1'};
constexpr size_t kIndexHeader = 24;  // magic, record count, file size
constexpr uint64_t kFraming = 16;    // length, its CRC, the data's CRC

std::string index_path(const std::string& path) { return path + ".index"; }

[[noreturn]] void io_error(const std::string& what, const std::string& path) {
  throw InvalidArgumentError(fmt::format("{} {} failed: {}", what, path, std::strerror(errno)));
}

// Reads exactly n bytes at `offset`; false when the file ends first.
bool pread_all(int fd, std::byte* data, size_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, data, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      io_error("reading", path);
    }
    if (r == 0) return false;
    data += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

int open_for_reading(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_error("opening", path);
  return fd;
}

uint64_t size_of(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) io_error("fstat of", path);
  return static_cast<uint64_t>(st.st_size);
}

[[noreturn]] void damaged(const std::string& path, size_t record, uint64_t offset,
                          const std::string& what) {
  throw InvalidArgumentError(
      fmt::format("TFRecord file {}: record {} at byte {}: {}: the file is damaged ({})", path,
                  record, offset, what, kBadRecordHint));
}

// The offsets of every record, from the length fields (each checked against its CRC).
std::vector<uint64_t> scan(int fd, uint64_t file_size, const std::string& path) {
  std::vector<uint64_t> offsets;
  uint64_t at = 0;
  std::byte header[12];
  // TensorFlow can write TFRecord files through gzip; records in those cannot be reached
  // without decompressing everything before them.
  if (file_size >= 2 && pread_all(fd, header, 2, 0, path) && header[0] == std::byte{0x1f} &&
      header[1] == std::byte{0x8b})
    throw InvalidArgumentError(fmt::format(
        "TFRecord file {} is gzip-compressed, and its records cannot be reached at random: read "
        "it through ShardedDataset or `dtrain data`, which decompress it into a temporary file "
        "first, or decompress it once (gunzip -c {} > FILE.tfrecord)",
        path, path));
  while (at < file_size) {
    const size_t i = offsets.size();
    if (file_size - at < kFraming)
      damaged(path, i, at,
              fmt::format("the file ends {} bytes into the record's framing of 16 "
                          "(truncated)",
                          file_size - at));
    pread_all(fd, header, sizeof header, at, path);
    const uint64_t length = load_le<uint64_t>(header);
    if (load_le<uint32_t>(header + 8) != masked_crc32c(header, 8))
      damaged(path, i, at,
              "the checksum of the length field does not match (not a TFRecord file, "
              "or damaged here)");
    if (length > file_size - at - kFraming)
      damaged(path, i, at,
              fmt::format("the record claims {} bytes but the file ends {} bytes "
                          "later (truncated)",
                          length, file_size - at - kFraming));
    offsets.push_back(at);
    at += kFraming + length;
  }
  return offsets;
}

// The offsets from <path>.index when it exists and matches the file; empty optional otherwise
// (no index). A present but damaged or stale index is an error: silently rescanning would hide
// that the file changed under it.
bool load_index(const std::string& path, uint64_t file_size, std::vector<uint64_t>& offsets,
                uint64_t* count_only) {
  const std::string ipath = index_path(path);
  const net::Fd owned(::open(ipath.c_str(), O_RDONLY | O_CLOEXEC));
  if (!owned.valid()) {
    if (errno == ENOENT) return false;
    io_error("opening", ipath);
  }
  const int fd = owned.get();
  const uint64_t index_size = size_of(fd, ipath);
  std::byte header[kIndexHeader];
  if (index_size < kIndexHeader || !pread_all(fd, header, kIndexHeader, 0, ipath) ||
      std::memcmp(header, kIndexMagic, sizeof kIndexMagic) != 0)
    throw InvalidArgumentError(fmt::format(
        "{} is not a dtrain TFRecord index (no DTRIDX01 header): delete it, or rebuild it with "
        "`dtrain data index {}`",
        ipath, path));
  const uint64_t n = load_le<uint64_t>(header + 8);
  const uint64_t indexed_size = load_le<uint64_t>(header + 16);
  if (indexed_size != file_size)
    throw InvalidArgumentError(fmt::format(
        "{} is stale: it describes a file of {} bytes, but {} has {}; rebuild it with `dtrain "
        "data index {}`",
        ipath, indexed_size, path, file_size, path));
  if (n > (index_size - kIndexHeader) / 8 || index_size != kIndexHeader + 8 * n)
    throw InvalidArgumentError(fmt::format(
        "{} is damaged: it claims {} records but holds {} bytes; rebuild it with `dtrain data "
        "index {}`",
        ipath, n, index_size, path));
  if (count_only) {
    *count_only = n;
    return true;
  }
  std::vector<std::byte> raw(8 * n);
  if (!pread_all(fd, raw.data(), raw.size(), kIndexHeader, ipath))
    throw InvalidArgumentError(fmt::format("{} ended while being read", ipath));
  offsets.resize(n);
  uint64_t previous = 0;
  for (uint64_t i = 0; i < n; ++i) {
    offsets[i] = load_le<uint64_t>(raw.data() + 8 * i);
    const uint64_t end = i + 1 < n ? load_le<uint64_t>(raw.data() + 8 * (i + 1)) : file_size;
    // Differences, not sums: an offset near 2^64 must not wrap round to look small.
    const bool after_previous =
        i == 0 ? offsets[0] == 0 : offsets[i] >= previous && offsets[i] - previous >= kFraming;
    const bool fits = end <= file_size && offsets[i] <= end && end - offsets[i] >= kFraming;
    if (!after_previous || !fits)
      throw InvalidArgumentError(fmt::format(
          "{} is damaged: record {}'s offset {} is inconsistent; rebuild it with `dtrain data "
          "index {}`",
          ipath, i, offsets[i], path));
    previous = offsets[i];
  }
  if (n == 0 && file_size != 0)
    throw InvalidArgumentError(fmt::format(
        "{} is damaged: no records for a file of {} bytes; rebuild it with `dtrain data index {}`",
        ipath, file_size, path));
  return true;
}

void write_index_file(const std::string& path, const std::vector<uint64_t>& offsets,
                      uint64_t file_size, bool sync) {
  std::vector<std::byte> raw(kIndexHeader + 8 * offsets.size());
  std::memcpy(raw.data(), kIndexMagic, sizeof kIndexMagic);
  store_le<uint64_t>(raw.data() + 8, offsets.size());
  store_le<uint64_t>(raw.data() + 16, file_size);
  for (size_t i = 0; i < offsets.size(); ++i)
    store_le<uint64_t>(raw.data() + kIndexHeader + 8 * i, offsets[i]);
  OutputFile out(index_path(path));
  out.write(raw.data(), raw.size());
  out.finish(sync);
  out.install();
}

}  // namespace

// ---- writer ----

TfRecordWriter::TfRecordWriter(std::string path, TfRecordWriterOptions options)
    : path_(std::move(path)), options_(options), out_(std::make_unique<OutputFile>(path_)) {}

TfRecordWriter::~TfRecordWriter() = default;

uint64_t TfRecordWriter::bytes() const { return out_->bytes(); }

void TfRecordWriter::write(std::string_view record) {
  write(std::span(reinterpret_cast<const std::byte*>(record.data()), record.size()));
}

void TfRecordWriter::write(std::span<const std::byte> record) {
  if (!out_->open())
    throw InvalidArgumentError(fmt::format("TfRecordWriter {}: write after close()", path_));
  std::byte header[12], footer[4];
  store_le<uint64_t>(header, record.size());
  store_le<uint32_t>(header + 8, masked_crc32c(header, 8));
  store_le<uint32_t>(footer, masked_crc32c(record.data(), record.size()));
  offsets_.push_back(out_->bytes());
  out_->write(header, sizeof header);
  out_->write(record.data(), record.size());
  out_->write(footer, sizeof footer);
}

void TfRecordWriter::close() {
  if (!out_->open()) return;
  out_->finish(options_.sync);
  // The index first: a file without its index is merely slower to open, an index that does
  // not match its file is refused.
  if (options_.write_index) write_index_file(path_, offsets_, out_->bytes(), options_.sync);
  out_->install();
}

// ---- reader ----

TfRecordFile::TfRecordFile(std::string path) : path_(std::move(path)) {
  fd_ = open_for_reading(path_);
  try {
    file_size_ = size_of(fd_, path_);
    indexed_ = load_index(path_, file_size_, offsets_, nullptr);
    if (!indexed_) offsets_ = scan(fd_, file_size_, path_);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

TfRecordFile::TfRecordFile(int fd, std::string name) : path_(std::move(name)), fd_(fd) {
  try {
    file_size_ = size_of(fd_, path_);
    offsets_ = scan(fd_, file_size_, path_);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

TfRecordFile::~TfRecordFile() {
  if (fd_ >= 0) ::close(fd_);
}

uint64_t TfRecordFile::data_bytes(size_t i) const {
  const uint64_t end = i + 1 < offsets_.size() ? offsets_[i + 1] : file_size_;
  return end - offsets_.at(i) - kFraming;
}

void TfRecordFile::read(size_t i, std::vector<std::byte>& out) const {
  if (i >= offsets_.size())
    throw InvalidArgumentError(
        fmt::format("TFRecord file {}: no record {} (it has {})", path_, i, offsets_.size()));
  const uint64_t at = offsets_[i];
  const uint64_t expected = data_bytes(i);
  out.resize(expected);
  // One preadv: the framing into its own buffers, the data straight into `out`.
  std::byte header[12], footer[4];
  iovec parts[3] = {{header, sizeof header}, {out.data(), expected}, {footer, sizeof footer}};
  size_t want = sizeof header + expected + sizeof footer, got = 0;
  while (got < want) {
    const ssize_t r = ::preadv(fd_, parts, 3, static_cast<off_t>(at));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) io_error("reading", path_);
    if (static_cast<size_t>(r) == want) break;
    // Short (rare: a signal, a file system's limit): the rest one piece at a time.
    got = static_cast<size_t>(r);
    std::vector<std::byte> rest(want - got);
    if (r == 0 || !pread_all(fd_, rest.data(), rest.size(), at + got, path_))
      damaged(path_, i, at, "the file ends inside the record (truncated since it was indexed)");
    for (size_t k = got; k < want; ++k) {
      const std::byte b = rest[k - got];
      if (k < 12)
        header[k] = b;
      else if (k < 12 + expected)
        out[k - 12] = b;
      else
        footer[k - 12 - expected] = b;
    }
    break;
  }
  const uint64_t length = load_le<uint64_t>(header);
  if (load_le<uint32_t>(header + 8) != masked_crc32c(header, 8))
    damaged(path_, i, at, "the checksum of the length field does not match");
  if (length != expected)
    damaged(path_, i, at, fmt::format("the record says {} bytes, the index {}", length, expected));
  if (load_le<uint32_t>(footer) != masked_crc32c(out.data(), length))
    damaged(path_, i, at,
            fmt::format("the checksum of the record's {} bytes of data does not "
                        "match",
                        length));
}

uint64_t count_tfrecords(const std::string& path) {
  const net::Fd owned(open_for_reading(path));
  const int fd = owned.get();
  const uint64_t file_size = size_of(fd, path);
  std::vector<uint64_t> unused;
  uint64_t n = 0;
  if (load_index(path, file_size, unused, &n)) return n;
  return scan(fd, file_size, path).size();
}

uint64_t write_tfrecord_index(const std::string& path) {
  const net::Fd owned(open_for_reading(path));
  const int fd = owned.get();
  const uint64_t file_size = size_of(fd, path);
  const std::vector<uint64_t> offsets = scan(fd, file_size, path);
  write_index_file(path, offsets, file_size, /*sync=*/true);
  return offsets.size();
}

std::string verify_tfrecord_file(const std::string& path) {
  try {
    TfRecordFile file(path);
    std::vector<std::byte> record;
    for (size_t i = 0; i < file.size(); ++i) file.read(i, record);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

}  // namespace dtrain::data
