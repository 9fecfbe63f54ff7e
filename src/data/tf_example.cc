#include "data/tf_example.h"

namespace dtrain::data {
namespace {

// Protobuf's wire format: a field is its number and wire type (a varint), then the value.
constexpr uint32_t kLengthDelimited = 2;

void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void field(std::string& out, uint32_t number, std::string_view bytes) {
  varint(out, uint64_t{number} << 3 | kLengthDelimited);
  varint(out, bytes.size());
  out.append(bytes);
}

// Feature { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
//                        Int64List int64_list = 3; } }
std::string encode_feature(const std::variant<std::string_view, int64_t>& value) {
  std::string list, out;
  if (const auto* bytes = std::get_if<std::string_view>(&value)) {
    field(list, 1, *bytes);  // BytesList { repeated bytes value = 1; }
    field(out, 1, list);
  } else {
    std::string packed;  // Int64List { repeated int64 value = 1 [packed = true]; }
    varint(packed, static_cast<uint64_t>(std::get<int64_t>(value)));
    field(list, 1, packed);
    field(out, 3, list);
  }
  return out;
}

}  // namespace

std::string encode_example(std::span<const ExampleFeature> features) {
  // Features { map<string, Feature> feature = 1; }: each entry a message { key = 1; value = 2 }.
  std::string map;
  for (const ExampleFeature& f : features) {
    std::string entry;
    field(entry, 1, f.name);
    field(entry, 2, encode_feature(f.value));
    field(map, 1, entry);
  }
  std::string example;  // Example { Features features = 1; }
  field(example, 1, map);
  return example;
}

}  // namespace dtrain::data
