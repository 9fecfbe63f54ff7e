// Integers as bytes, little-endian: the one byte order of everything dtrain writes to a file or a
// socket (the store's protocol and file store, Horovod's negotiation rows, TFRecord, safetensors,
// the flight recorder's beat page). TFRecord and safetensors define theirs as little-endian; on
// the machines dtrain runs on these are plain copies.
#pragma once

#include <bit>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace dtrain {

template <std::integral T>
void store_le(void* at, T value) {
  auto v = static_cast<std::make_unsigned_t<T>>(value);
  if constexpr (std::endian::native == std::endian::big) {
    unsigned char bytes[sizeof(T)];
    for (size_t i = 0; i < sizeof(T); ++i) bytes[i] = static_cast<unsigned char>(v >> (8 * i));
    std::memcpy(at, bytes, sizeof(T));
  } else {
    std::memcpy(at, &v, sizeof(T));
  }
}

template <std::integral T>
T load_le(const void* at) {
  std::make_unsigned_t<T> v = 0;
  if constexpr (std::endian::native == std::endian::big) {
    unsigned char bytes[sizeof(T)];
    std::memcpy(bytes, at, sizeof(T));
    for (size_t i = 0; i < sizeof(T); ++i)
      v |= static_cast<std::make_unsigned_t<T>>(bytes[i]) << (8 * i);
  } else {
    std::memcpy(&v, at, sizeof(T));
  }
  return static_cast<T>(v);
}

// An integer kept little-endian inside a struct that goes to a socket or a file as it is (a
// header read and written whole): assigned and read as a T, stored as its bytes, with no
// alignment of its own, so the struct's layout is its fields' sizes in order.
//   struct Header { Le<uint32_t> magic; Le<uint64_t> size; };
template <std::integral T>
class Le {
 public:
  constexpr Le() = default;
  Le(T value) { store_le(bytes_, value); }           // NOLINT(google-explicit-constructor): a T
  operator T() const { return load_le<T>(bytes_); }  // NOLINT(google-explicit-constructor)
  T get() const { return *this; }

 private:
  unsigned char bytes_[sizeof(T)] = {};
};

// Appends to a byte buffer: integers little-endian, byte strings as they are.
class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>& out) : out_(out) {}

  template <std::integral T>
  void integer(T value) {
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    store_le(out_.data() + at, value);
  }
  void u8(uint8_t v) { out_.push_back(v); }
  void u64(uint64_t v) { integer(v); }
  void i64(int64_t v) { integer(v); }
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    out_.insert(out_.end(), p, p + n);
  }
  // Its length (u64), then its bytes.
  void sized(std::string_view s) {
    u64(s.size());
    bytes(s.data(), s.size());
  }

 private:
  std::vector<uint8_t>& out_;
};

}  // namespace dtrain

// Formats as the T it holds ("{:08x}" and all).
template <std::integral T>
struct fmt::formatter<dtrain::Le<T>> : fmt::formatter<T> {
  template <class Context>
  auto format(const dtrain::Le<T>& value, Context& ctx) const {
    return fmt::formatter<T>::format(value.get(), ctx);
  }
};
