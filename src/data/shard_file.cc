#include "data/shard_file.h"

#include "data/tar_shard.h"
#include "dtrain/data/tfrecord.h"

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

}  // namespace

bool is_tar_shard(const std::string& path) {
  return path.size() >= 4 && path.compare(path.size() - 4, 4, ".tar") == 0;
}

std::unique_ptr<ShardFile> open_shard(const std::string& path) {
  if (is_tar_shard(path)) return std::make_unique<TarShard>(path);
  return std::make_unique<TfRecordShard>(path);
}

uint64_t count_shard_records(const std::string& path) {
  if (is_tar_shard(path)) return TarShard(path).size();
  return count_tfrecords(path);
}

}  // namespace dtrain::data
