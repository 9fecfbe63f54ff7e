#include "data/tar_writer.h"

#include <array>
#include <cstring>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::data {
namespace {

constexpr size_t kBlock = 512;
constexpr size_t kName = 100, kPrefix = 155;
constexpr uint64_t kMaxUstarSize = (uint64_t{1} << 33) - 1;  // 11 octal digits

// Where ustar splits a long name: a prefix (up to 155 bytes) and a name (up to 100) joined by a
// '/'; npos when no '/' allows it.
size_t ustar_split(std::string_view name) {
  if (name.size() <= kName) return std::string_view::npos;
  for (size_t slash = name.find('/'); slash != std::string_view::npos;
       slash = name.find('/', slash + 1)) {
    if (slash > kPrefix) break;
    const size_t rest = name.size() - slash - 1;
    if (rest > 0 && rest <= kName) return slash;
  }
  return std::string_view::npos;
}

// A pax record, "LEN key=value\n", LEN counting its own digits.
std::string pax_record(std::string_view key, std::string_view value) {
  const size_t body = 1 + key.size() + 1 + value.size() + 1;  // ' ', '=', '\n'
  size_t length = body + 1;
  while (std::to_string(length).size() + body != length)
    length = std::to_string(length).size() + body;
  return fmt::format("{} {}={}\n", length, key, value);
}

}  // namespace

TarWriter::TarWriter(std::string path) : out_(std::move(path)) {}

void TarWriter::header(std::string_view name, std::string_view prefix, uint64_t size, char type) {
  std::array<char, kBlock> h{};
  std::memcpy(h.data(), name.data(), std::min(name.size(), kName));
  std::memcpy(h.data() + 100, "0000644", 8);
  std::memcpy(h.data() + 108, "0000000", 8);
  std::memcpy(h.data() + 116, "0000000", 8);
  fmt::format_to_n(h.data() + 124, 12, "{:011o}", std::min(size, kMaxUstarSize));
  std::memcpy(h.data() + 136, "00000000000", 12);
  h[156] = type;
  std::memcpy(h.data() + 257, "ustar", 6);
  std::memcpy(h.data() + 263, "00", 2);
  std::memcpy(h.data() + 345, prefix.data(), std::min(prefix.size(), kPrefix));
  // The checksum: the header's bytes summed with its own field counted as spaces.
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  fmt::format_to_n(h.data() + 148, 7, "{:06o}", sum);
  h[154] = '\0';
  out_.write(h.data(), h.size());
}

void TarWriter::padding(uint64_t size) {
  static constexpr std::array<char, kBlock> kZeros{};
  if (const uint64_t rest = size % kBlock; rest != 0) out_.write(kZeros.data(), kBlock - rest);
}

void TarWriter::add(std::string_view name, std::string_view data) {
  if (name.empty() || name.back() == '/' || name.find('\0') != std::string_view::npos)
    throw InvalidArgumentError(
        fmt::format("tar file {}: '{}' cannot name a member", out_.path(), name));
  const size_t slash = ustar_split(name);
  const bool fits = name.size() <= kName || slash != std::string_view::npos;
  if (!fits || data.size() > kMaxUstarSize) {
    std::string pax;
    if (!fits) pax += pax_record("path", name);
    if (data.size() > kMaxUstarSize) pax += pax_record("size", std::to_string(data.size()));
    header("././@PaxHeader", "", pax.size(), 'x');
    out_.write(pax.data(), pax.size());
    padding(pax.size());
  }
  if (slash != std::string_view::npos)
    header(name.substr(slash + 1), name.substr(0, slash), data.size(), '0');
  else
    header(name, "", data.size(), '0');
  out_.write(data.data(), data.size());
  padding(data.size());
  ++members_;
}

void TarWriter::close(bool sync) {
  if (!out_.open()) return;
  static constexpr std::array<char, 2 * kBlock> kEnd{};
  out_.write(kEnd.data(), kEnd.size());
  out_.finish(sync);
  out_.install();
}

}  // namespace dtrain::data
