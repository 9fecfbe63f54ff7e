// WebDataset tar shards (src/data/tar_shard.cc) on arbitrary bytes: the header walk that builds
// the index and the reads of each sample end or fail with InvalidArgumentError naming the file.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "data/shard_file.h"
#include "dtrain/data/sharded_dataset.h"
#include "dtrain/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/dtrain_fuzz_" + std::to_string(::getpid()) + ".tar";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    auto file = dtrain::data::open_shard(path);
    dtrain::data::Record r;
    for (size_t i = 0; i < file->size() && i < 1000; ++i) file->read(i, r);
  } catch (const dtrain::Error&) {
  }
  return 0;
}
