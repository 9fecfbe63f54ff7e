// TFRecord files and their indexes (src/data/tfrecord.cc) on arbitrary bytes, as a damaged or
// hostile shard would be: the input's first byte says how much of the rest is the index, the
// other part the file. Every record reads or fails with InvalidArgumentError naming the file.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "data/shard_file.h"
#include "dtrain/data/sharded_dataset.h"
#include "dtrain/error.h"

namespace {

void write(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/dtrain_fuzz_" + std::to_string(::getpid()) + ".tfrecord";
  if (size == 0) return 0;
  // Byte 0: 0 = no index; otherwise the index is the last (byte 0 * 8) bytes of the rest.
  const size_t index_bytes = std::min<size_t>(size_t{data[0]} * 8, size - 1);
  write(path, data + 1, size - 1 - index_bytes);
  if (data[0] == 0)
    ::unlink((path + ".index").c_str());
  else
    write(path + ".index", data + size - index_bytes, index_bytes);
  try {
    auto file = dtrain::data::open_shard(path);
    dtrain::data::Record r;
    for (size_t i = 0; i < file->size() && i < 1000; ++i) {
      try {
        file->read(i, r);
      } catch (const dtrain::Error&) {
      }
    }
  } catch (const dtrain::Error&) {
  }
  return 0;
}
