// Fashion-MNIST's IDX files as bytes, without LibTorch: what `dtrain data write --fashion-mnist`
// turns into shards, and what dtrain::load_fashion_mnist (dtrain/torch/fashion_mnist.h) makes
// tensors of.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::data {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct FashionMnistBytes {
  int64_t n = 0, rows = 0, cols = 0;
  std::vector<uint8_t> images;  // n * rows * cols pixels, row-major
  std::vector<uint8_t> labels;  // n labels, 0-9
};

// Reads <dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (gzip through zlib) and checks
// their headers and sizes; throws InvalidArgumentError naming the file and what is wrong.
FashionMnistBytes read_fashion_mnist(const std::string& dir, bool train);

}  // namespace dtrain::data
