// One shard file, whatever its format, as ShardedDataset reads it: records by number.
// TFRecord files (dtrain/data/tfrecord.h) hold one record per entry; WebDataset-style tar files
// (src/data/tar_shard.h) hold samples, each the consecutive members that share a key.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dtrain/data/sharded_dataset.h"

namespace dtrain::data {

class ShardFile {
 public:
  virtual ~ShardFile() = default;
  virtual size_t size() const = 0;                  // records
  virtual uint64_t data_bytes(size_t i) const = 0;  // what read(i) puts in Record::bytes
  // Record i's bytes (and, for tar samples, its key and parts); throws InvalidArgumentError
  // naming the file, the record and its byte offset when the file is damaged.
  virtual void read(size_t i, Record& out) const = 0;
};

// Opens `path` by its name and first bytes: *.tar as a WebDataset tar shard, a gzip'd file as
// TFRecord decompressed into a temporary file (in TMPDIR), anything else as TFRecord.
std::unique_ptr<ShardFile> open_shard(const std::string& path);
// Its number of records, as cheaply as the format allows.
uint64_t count_shard_records(const std::string& path);
bool is_tar_shard(const std::string& path);

}  // namespace dtrain::data
