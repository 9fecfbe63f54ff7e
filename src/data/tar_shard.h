// WebDataset-style tar shards: a sample is the run of consecutive regular files whose names share
// a key, the name up to the first dot of its last component ("train/0001.jpg" and
// "train/0001.cls" make sample "train/0001" with parts "jpg" and "cls"), as the webdataset
// library groups them.
//
// Reading one sample must not mean reading the archive up to it, so the file's headers are read
// once when it is opened (one 512-byte block per member, the data skipped) into an index of every
// sample's members and their offsets; a sample is then a pread per member. Uncompressed tar only
// (ustar, with pax 'x' and GNU 'L' long names); every header's checksum is checked.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/shard_file.h"

namespace dtrain::data {

class TarShard : public ShardFile {
 public:
  explicit TarShard(std::string path);
  ~TarShard() override;
  TarShard(const TarShard&) = delete;
  TarShard& operator=(const TarShard&) = delete;

  size_t size() const override { return samples_.size(); }
  uint64_t data_bytes(size_t i) const override { return samples_.at(i).bytes; }
  void read(size_t i, Record& out) const override;

 private:
  struct Member {
    std::string part;  // the name after the key's dot: "jpg", "seg.png"
    uint64_t offset;   // of its data in the file
    uint64_t size;
  };
  struct Sample {
    std::string key;
    uint64_t header;  // byte offset of its first member's header, for errors
    uint64_t bytes = 0;
    std::vector<Member> members;
  };
  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  std::vector<Sample> samples_;
};

}  // namespace dtrain::data
