// Fashion-MNIST IDX reader: gzip through zlib's gzread (which also reads uncompressed files).
#include "dtrain/data/fashion_mnist.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::data {

namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // IDX: unsigned byte, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // IDX: unsigned byte, 1 dimension

std::vector<uint8_t> read_gz(const std::string& dir, const std::string& stem) {
  namespace fs = std::filesystem;
  fs::path gz = fs::path(dir) / (stem + ".gz");
  fs::path plain = fs::path(dir) / stem;
  fs::path path = fs::exists(gz) ? gz : plain;
  if (!fs::exists(path))
    throw InvalidArgumentError(fmt::format(
        "Fashion-MNIST: {} not found (nor {}); install Debian's dataset-fashion-mnist "
        "(apt-get install dataset-fashion-mnist, files in {}), or name the folder that holds "
        "the *-ubyte.gz files",
        gz.string(), plain.string(), kFashionMnistDir));
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr)
    throw InvalidArgumentError(
        fmt::format("Fashion-MNIST: cannot open {}: {}", path.string(), std::strerror(errno)));
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 20);
  for (;;) {
    int n = gzread(f, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int code = 0;
      std::string message = gzerror(f, &code);
      gzclose(f);
      throw InvalidArgumentError(fmt::format("Fashion-MNIST: {} is corrupt after {} bytes: {}",
                                             path.string(), out.size(), message));
    }
    if (n == 0) break;
    out.insert(out.end(), chunk.begin(), chunk.begin() + n);
  }
  gzclose(f);
  return out;
}

uint32_t be32(const std::vector<uint8_t>& b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) | (uint32_t{b[at + 2]} << 8) |
         uint32_t{b[at + 3]};
}

}  // namespace

FashionMnistBytes read_fashion_mnist(const std::string& dir, bool train) {
  const std::string prefix = train ? "train" : "t10k";
  const std::string image_stem = prefix + "-images-idx3-ubyte";
  const std::string label_stem = prefix + "-labels-idx1-ubyte";
  std::vector<uint8_t> images = read_gz(dir, image_stem);
  std::vector<uint8_t> labels = read_gz(dir, label_stem);

  if (images.size() < 16 || be32(images, 0) != kImagesMagic)
    throw InvalidArgumentError(fmt::format(
        "Fashion-MNIST: {}/{}: not an IDX image file (magic at byte 0 should be 0x{:08x})", dir,
        image_stem, kImagesMagic));
  if (labels.size() < 8 || be32(labels, 0) != kLabelsMagic)
    throw InvalidArgumentError(fmt::format(
        "Fashion-MNIST: {}/{}: not an IDX label file (magic at byte 0 should be 0x{:08x})", dir,
        label_stem, kLabelsMagic));
  const int64_t n = be32(images, 4);
  const int64_t rows = be32(images, 8);
  const int64_t cols = be32(images, 12);
  const int64_t n_labels = be32(labels, 4);
  if (n != n_labels || images.size() != static_cast<size_t>(16 + n * rows * cols) ||
      labels.size() != static_cast<size_t>(8 + n))
    throw InvalidArgumentError(fmt::format(
        "Fashion-MNIST: {}: {} images of {}x{} ({} bytes) and {} labels ({} bytes) do not match; "
        "reinstall dataset-fashion-mnist",
        dir, n, rows, cols, images.size(), n_labels, labels.size()));

  if (n == 0)
    throw InvalidArgumentError(fmt::format(
        "Fashion-MNIST: {}/{} holds no images: there is nothing to train on", dir, image_stem));
  FashionMnistBytes out;
  out.n = n;
  out.rows = rows;
  out.cols = cols;
  out.images.assign(images.begin() + 16, images.end());
  out.labels.assign(labels.begin() + 8, labels.end());
  return out;
}

}  // namespace dtrain::data
