// TFRecord files, TensorFlow's format for records (tf.data, tf.io.TFRecordWriter), read and
// written by dtrain without TensorFlow:
//
//   dtrain::data::TfRecordWriter out("train-00000.tfrecord");
//   out.write(bytes);                          // as many records as wanted
//   out.close();                               // installs the file and its index
//   dtrain::data::TfRecordFile in("train-00000.tfrecord");
//   std::vector<std::byte> record;
//   in.read(17, record);                       // any record, by number
//
// A record is: its length (uint64, little-endian), the masked CRC-32C of those 8 bytes, the
// data, the masked CRC-32C of the data. Reading checks both checksums.
//
// The index, `<file>.index` beside the file, lets a reader go straight to record i, so that a
// rank reads only its own records: "DTRIDX01", the number of records n and the file's size
// (uint64 each), then the n records' byte offsets (uint64, little-endian). dtrain writes it with
// every file; `dtrain data index FILE...` writes it for files made elsewhere. Without one,
// opening a file scans it (its length fields) to build the index in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::data {

class OutputFile;

struct TfRecordWriterOptions {
  bool write_index = true;  // also write <path>.index
  bool sync = true;         // fsync the file and its index before installing them
};

// Writes one TFRecord file: into <path>.tmp, installed as <path> (with its index) by close().
// Destroyed without close(), it removes the partial file: no half-written shard is ever seen.
// Errors (full disk, permissions) throw InvalidArgumentError naming the file and the cause.
class TfRecordWriter {
 public:
  explicit TfRecordWriter(std::string path, TfRecordWriterOptions options = {});
  ~TfRecordWriter();
  TfRecordWriter(const TfRecordWriter&) = delete;
  TfRecordWriter& operator=(const TfRecordWriter&) = delete;

  void write(std::span<const std::byte> record);
  void write(std::string_view record);
  void close();

  size_t records() const { return offsets_.size(); }
  uint64_t bytes() const;  // of the file so far
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  TfRecordWriterOptions options_;
  std::unique_ptr<OutputFile> out_;
  std::vector<uint64_t> offsets_;
};

// One TFRecord file, opened for reading records at random (pread: safe from several threads).
class TfRecordFile {
 public:
  // Opens `path` and its index; a missing index is built by scanning the file. Throws
  // InvalidArgumentError naming the file when it cannot be read, or when it or its index is
  // damaged (a stale index: the file's size differs from the one the index was made for).
  explicit TfRecordFile(std::string path);
  // An open file, owned from here on (closed with this object), named `name` in errors; without
  // an index it is scanned. For files without a path of their own (a decompressed temporary).
  TfRecordFile(int fd, std::string name);
  ~TfRecordFile();
  TfRecordFile(const TfRecordFile&) = delete;
  TfRecordFile& operator=(const TfRecordFile&) = delete;

  size_t size() const { return offsets_.size(); }  // records
  uint64_t offset(size_t i) const { return offsets_.at(i); }
  uint64_t data_bytes(size_t i) const;  // the length of record i's data
  const std::string& path() const { return path_; }
  bool indexed() const { return indexed_; }  // whether an index file was used

  // Record i's data into `out` (resized to fit). Throws InvalidArgumentError naming the file,
  // the record number and its byte offset when a checksum or length does not match.
  void read(size_t i, std::vector<std::byte>& out) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  std::vector<uint64_t> offsets_;
  bool indexed_ = false;
};

// The number of records of a TFRecord file: read from its index (24 bytes) when it has a valid
// one, else by scanning the file. Throws like TfRecordFile.
uint64_t count_tfrecords(const std::string& path);

// Writes <path>.index for an existing TFRecord file (scanning it, checking every record's length
// checksum); returns the number of records.
uint64_t write_tfrecord_index(const std::string& path);

// Reads every record of the file and checks both checksums: "" when intact, else the first
// problem found (file, record, offset, what).
std::string verify_tfrecord_file(const std::string& path);

}  // namespace dtrain::data
