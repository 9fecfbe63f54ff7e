// Fashion-MNIST, read straight from Debian's dataset-fashion-mnist package (the gzip'd IDX
// files in /usr/share/datasets/fashion-mnist), decompressed in memory with zlib.
//
//   auto train = dtrain::load_fashion_mnist(dtrain::kFashionMnistDir, /*train=*/true);
//   train.images  // [60000, 1, 28, 28] float in [0, 1] (what torchvision's ToTensor gives)
//   train.labels  // [60000] int64 in [0, 10)
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

#include "dtrain/data/fashion_mnist.h"

namespace dtrain {

using data::kFashionMnistDir;

struct FashionMnist {
  at::Tensor images;
  at::Tensor labels;
  int64_t size() const { return labels.size(0); }
};

// Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz from `dir` (the .gz or an unpacked
// file of the same name without .gz). Throws InvalidArgumentError naming the missing file and
// the package to install, or the file and byte offset of a malformed header.
FashionMnist load_fashion_mnist(const std::string& dir, bool train);

}  // namespace dtrain
