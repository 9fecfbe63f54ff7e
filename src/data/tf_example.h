// tf.train.Example, TensorFlow's record of named features
// (tensorflow/core/example/example.proto and feature.proto), encoded in protobuf's wire format
// without protobuf: what `tf.io.parse_single_example` and `tf.train.Example.FromString` read.
// `dtrain data write --format tfrecord` writes one per sample.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>

namespace dtrain::data {

struct ExampleFeature {
  std::string_view name;
  std::variant<std::string_view, int64_t> value;  // a BytesList or an Int64List of one value
};

std::string encode_example(std::span<const ExampleFeature> features);

}  // namespace dtrain::data
