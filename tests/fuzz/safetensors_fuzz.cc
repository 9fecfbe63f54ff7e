// The safetensors reader (common/safetensors_file.h) on arbitrary files, as a damaged or
// hostile checkpoint would be: entries that fit the file, or InvalidArgumentError naming it.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "common/safetensors_file.h"
#include "dtrain/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/dtrain_fuzz_" + std::to_string(::getpid()) + ".safetensors";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    auto entries = dtrain::read_safetensors_file(path);
    (void)entries;
  } catch (const dtrain::Error&) {
  }
  return 0;
}
