// A file that nobody sees half-written: its bytes go to <path>.tmp, and install() moves the
// finished file to <path>; destroyed before that, the temporary is removed. Shard writers
// (TfRecordWriter, TarWriter) write through it. Errors (a full disk, permissions) throw
// InvalidArgumentError naming the file and the cause.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::data {

class OutputFile {
 public:
  explicit OutputFile(std::string path);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Buffered: large pieces go to the file as they are.
  void write(const void* data, size_t n);
  // Every byte in the temporary file, synced to the disk when `sync`; nothing is written after.
  void finish(bool sync);
  // The finished file under its own name (what goes beside it, an index, is written first).
  void install();

  uint64_t bytes() const { return size_; }  // written so far
  const std::string& path() const { return path_; }
  bool open() const { return fd_ >= 0; }

 private:
  void flush();
  void write_through(const std::byte* p, size_t n);
  void discard();

  std::string path_, tmp_;
  int fd_ = -1;
  bool finished_ = false;
  uint64_t size_ = 0;
  std::vector<std::byte> buffer_;
};

}  // namespace dtrain::data
