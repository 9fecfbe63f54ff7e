#include "data/tar_shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "data/bad_record_hint.h"
#include "dtrain/error.h"

namespace dtrain::data {
namespace {

constexpr uint64_t kBlock = 512;

[[noreturn]] void damaged(const std::string& path, uint64_t offset, const std::string& what) {
  throw InvalidArgumentError(fmt::format(
      "tar file {}: the member at byte {}: {}: the file is damaged or not an uncompressed tar "
      "file ({})",
      path, offset, what, kBadRecordHint));
}

bool pread_exact(int fd, char* data, size_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, data, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    data += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

// A numeric header field: octal digits (space or NUL terminated), or GNU's base-256 for large
// values (the high bit of the first byte set).
std::optional<uint64_t> number(std::string_view field) {
  if (!field.empty() && (static_cast<unsigned char>(field[0]) & 0x80)) {
    uint64_t v = static_cast<unsigned char>(field[0]) & 0x7f;
    for (size_t i = 1; i < field.size(); ++i) {
      if (v >> 56) return std::nullopt;
      v = (v << 8) | static_cast<unsigned char>(field[i]);
    }
    return v;
  }
  uint64_t v = 0;
  size_t i = 0;
  while (i < field.size() && field[i] == ' ') ++i;
  bool any = false;
  for (; i < field.size() && field[i] >= '0' && field[i] <= '7'; ++i) {
    if (v >> 60) return std::nullopt;
    v = v * 8 + static_cast<uint64_t>(field[i] - '0');
    any = true;
  }
  for (; i < field.size(); ++i)
    if (field[i] != ' ' && field[i] != '\0') return std::nullopt;
  return any ? std::optional<uint64_t>(v) : std::nullopt;
}

std::string c_string(std::string_view field) {
  return std::string(field.substr(0, field.find('\0')));
}

// The values of a pax extended header ("LEN key=value\n" records) that matter here.
// `size` stays as it was when the header has no valid one.
void parse_pax(std::string_view data, std::string& path, uint64_t& size, bool& has_size) {
  while (!data.empty()) {
    const size_t space = data.find(' ');
    if (space == std::string_view::npos) return;
    size_t length = 0;  // decimal: the record's whole length
    for (char c : data.substr(0, space)) {
      if (c < '0' || c > '9') return;
      length = length * 10 + static_cast<size_t>(c - '0');
    }
    if (length <= space + 1 || length > data.size()) return;
    const std::string_view record = data.substr(space + 1, length - space - 2);  // no '\n'
    const size_t eq = record.find('=');
    if (eq != std::string_view::npos) {
      const std::string_view key = record.substr(0, eq), value = record.substr(eq + 1);
      if (key == "path") path = std::string(value);
      if (key == "size") {  // decimal digits; anything else (or an overflow) is no size
        uint64_t v = 0;
        bool ok = !value.empty();
        for (char c : value) {
          if (c < '0' || c > '9' || v > (UINT64_MAX - 9) / 10) {
            ok = false;
            break;
          }
          v = v * 10 + static_cast<uint64_t>(c - '0');
        }
        if (ok) {
          size = v;
          has_size = true;
        }
      }
    }
    data.remove_prefix(length);
  }
}

}  // namespace

TarShard::TarShard(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0)
    throw InvalidArgumentError(fmt::format("opening {} failed: {}", path_, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int e = errno;
    ::close(fd_);
    throw InvalidArgumentError(fmt::format("fstat of {} failed: {}", path_, std::strerror(e)));
  }
  file_size_ = static_cast<uint64_t>(st.st_size);
  try {
    char h[kBlock];
    std::string long_name;  // from a GNU 'L' member or a pax header
    uint64_t pax_size = 0;  // from a pax header, when has_pax_size
    bool has_pax_size = false;
    uint64_t at = 0;
    uint64_t entry_header = 0;  // where the current entry's first header (pax, 'L') began
    bool pending = false;
    while (at + kBlock <= file_size_) {
      if (!pread_exact(fd_, h, kBlock, at)) damaged(path_, at, "the header cannot be read");
      if (std::all_of(h, h + kBlock, [](char c) { return c == 0; })) break;  // end of archive
      if (!pending) entry_header = at;
      // The checksum: the header's bytes summed with its own field counted as spaces.
      const auto stored = number(std::string_view(h + 148, 8));
      uint64_t sum = 0;
      for (uint64_t i = 0; i < kBlock; ++i)
        sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(h[i]);
      if (!stored || *stored != sum) damaged(path_, at, "its header checksum does not match");
      const auto size = number(std::string_view(h + 124, 12));
      if (!size) damaged(path_, at, "its size field is not a number");
      const char type = h[156];
      const uint64_t data = at + kBlock;
      const uint64_t padded = (*size + kBlock - 1) / kBlock * kBlock;
      if (*size > file_size_ - data)
        damaged(path_, at,
                fmt::format("it claims {} bytes but the file ends {} bytes later "
                            "(truncated)",
                            *size, file_size_ - data));
      if (type == 'x' || type == 'L') {  // describes the next member
        std::string content(*size, '\0');
        if (!pread_exact(fd_, content.data(), content.size(), data))
          damaged(path_, at, "its extended header cannot be read");
        if (type == 'L')
          long_name = c_string(content);
        else
          parse_pax(content, long_name, pax_size, has_pax_size);
        pending = true;
        at = data + padded;
        continue;
      }
      if (type == '0' || type == '\0' || type == '7') {  // a regular file
        std::string name = long_name;
        if (name.empty()) {
          name = c_string(std::string_view(h, 100));
          if (std::memcmp(h + 257, "ustar", 5) == 0) {
            const std::string prefix = c_string(std::string_view(h + 345, 155));
            if (!prefix.empty()) name = prefix + "/" + name;
          }
        }
        const uint64_t member_size = has_pax_size ? pax_size : *size;
        if (member_size > file_size_ - data)  // a pax size may differ from the header's own
          damaged(path_, entry_header,
                  fmt::format("it claims {} bytes but the file ends {} bytes later (truncated)",
                              member_size, file_size_ - data));
        // The key: the name up to the first dot of its last component.
        const size_t slash = name.rfind('/');
        const size_t dot = name.find('.', slash == std::string::npos ? 0 : slash + 1);
        const std::string key = name.substr(0, dot);
        const std::string part = dot == std::string::npos ? "" : name.substr(dot + 1);
        if (samples_.empty() || samples_.back().key != key)
          samples_.push_back(Sample{key, entry_header, 0, {}});
        samples_.back().members.push_back(Member{part, data, member_size});
        samples_.back().bytes += member_size;
        at = data + (member_size + kBlock - 1) / kBlock * kBlock;
      } else {
        at = data + padded;  // directories, links, global headers: not samples
      }
      long_name.clear();
      has_pax_size = false;
      pending = false;
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

TarShard::~TarShard() {
  if (fd_ >= 0) ::close(fd_);
}

void TarShard::read(size_t i, Record& out) const {
  const Sample& s = samples_.at(i);
  out.key = s.key;
  out.parts.clear();
  out.bytes.resize(s.bytes);
  size_t at = 0;
  for (const Member& m : s.members) {
    if (!pread_exact(fd_, reinterpret_cast<char*>(out.bytes.data() + at), m.size, m.offset))
      damaged(path_, s.header,
              fmt::format("sample '{}' (record {}) cannot be read: {}", s.key, i,
                          errno ? std::strerror(errno) : "the file ended"));
    out.parts.push_back(Record::Part{m.part, at, m.size});
    at += m.size;
  }
}

}  // namespace dtrain::data
