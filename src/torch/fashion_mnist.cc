// Fashion-MNIST as tensors, from the IDX bytes src/data/fashion_mnist.cc reads.
#include "dtrain/torch/fashion_mnist.h"

#include <ATen/ATen.h>

#include "dtrain/data/fashion_mnist.h"

namespace dtrain {

FashionMnist load_fashion_mnist(const std::string& dir, bool train) {
  data::FashionMnistBytes raw = data::read_fashion_mnist(dir, train);
  FashionMnist data;
  data.images = at::from_blob(raw.images.data(), {raw.n, 1, raw.rows, raw.cols}, at::kByte)
                    .to(at::kFloat)
                    .div_(255.0f);
  data.labels = at::from_blob(raw.labels.data(), {raw.n}, at::kByte).to(at::kLong);
  return data;
}

}  // namespace dtrain
