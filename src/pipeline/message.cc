#include "pipeline/message.h"

#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::pipeline {
namespace {

constexpr uint32_t kMagic = 0x4d505444;  // "DTPM" in little-endian memory
constexpr uint16_t kVersion = 1;

// The header's layout, 128 bytes, in the host's byte order (both ends run the same build).
struct Wire {
  uint32_t magic;
  uint16_t version;
  uint8_t direction;
  uint8_t dtype;
  int32_t stage;
  int32_t microbatch;
  int64_t step;
  int32_t ndim;
  int32_t microbatches;
  uint32_t schedule_id;
  int32_t reserved;
  int64_t shape[kMaxDims];
};
static_assert(sizeof(Wire) == kHeaderBytes);

}  // namespace

size_t MessageHeader::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

std::array<std::byte, kHeaderBytes> encode(const MessageHeader& h) {
  if (h.shape.size() > kMaxDims)
    throw InvalidArgumentError(
        fmt::format("pipeline: a tensor of {} dimensions cannot go between stages (at most {})",
                    h.shape.size(), kMaxDims));
  Wire w{};
  w.magic = kMagic;
  w.version = kVersion;
  w.direction = static_cast<uint8_t>(h.direction);
  w.dtype = static_cast<uint8_t>(h.dtype);
  w.stage = h.stage;
  w.microbatch = h.microbatch;
  w.step = h.step;
  w.ndim = static_cast<int32_t>(h.shape.size());
  w.microbatches = h.microbatches;
  w.schedule_id = h.schedule_id;
  for (size_t i = 0; i < h.shape.size(); ++i) {
    if (h.shape[i] < 0)
      throw InvalidArgumentError(
          fmt::format("pipeline: negative dimension {} in a shape", h.shape[i]));
    w.shape[i] = h.shape[i];
  }
  std::array<std::byte, kHeaderBytes> out;
  std::memcpy(out.data(), &w, sizeof w);
  return out;
}

MessageHeader decode(std::span<const std::byte> bytes) {
  Wire w{};
  if (bytes.size() != sizeof w)
    throw InvalidArgumentError(
        fmt::format("pipeline: a message header has {} bytes, not {}", bytes.size(), sizeof w));
  std::memcpy(&w, bytes.data(), sizeof w);
  if (w.magic != kMagic)
    throw InvalidArgumentError(fmt::format(
        "pipeline: not a pipeline message (magic 0x{:08x}); is another program using the "
        "pipeline's group?",
        w.magic));
  if (w.version != kVersion)
    throw InvalidArgumentError(fmt::format(
        "pipeline: message version {} from a peer built from another dtrain (this one speaks {})",
        w.version, kVersion));
  if (w.direction != static_cast<uint8_t>(Direction::kActivation) &&
      w.direction != static_cast<uint8_t>(Direction::kGradient))
    throw InvalidArgumentError(
        fmt::format("pipeline: message direction {} is unknown", w.direction));
  if (w.dtype > static_cast<uint8_t>(DType::kI16))  // the last code
    throw InvalidArgumentError(fmt::format("pipeline: message dtype {} is unknown", w.dtype));
  if (w.ndim < 0 || w.ndim > static_cast<int32_t>(kMaxDims))
    throw InvalidArgumentError(fmt::format("pipeline: a message of {} dimensions", w.ndim));
  MessageHeader h;
  h.direction = static_cast<Direction>(w.direction);
  h.dtype = static_cast<DType>(w.dtype);
  h.stage = w.stage;
  h.microbatch = w.microbatch;
  h.step = w.step;
  h.microbatches = w.microbatches;
  h.schedule_id = w.schedule_id;
  // At most 2^40 elements: a shape whose product overflows is refused, not allocated.
  size_t n = 1;
  for (int i = 0; i < w.ndim; ++i) {
    if (w.shape[i] < 0 || w.shape[i] > (int64_t{1} << 40) ||
        (w.shape[i] > 0 && n > (size_t{1} << 40) / static_cast<size_t>(w.shape[i])))
      throw InvalidArgumentError(
          fmt::format("pipeline: a message of impossible shape (dimension "
                      "{} is {})",
                      i, w.shape[i]));
    n *= static_cast<size_t>(w.shape[i]);
    h.shape.push_back(w.shape[i]);
  }
  return h;
}

std::string describe(const MessageHeader& h) {
  return fmt::format("{} of micro-batch {} from stage {} (step {}, {} [{}])",
                     h.direction == Direction::kActivation ? "activation" : "gradient",
                     h.microbatch, h.stage, h.step, to_string(h.dtype), fmt::join(h.shape, ", "));
}

uint32_t schedule_id(const std::string& name, int ranks, int virtual_stages) {
  uint32_t h = 2166136261u;  // FNV-1a
  for (char c : fmt::format("{}/{}/{}", name, ranks, virtual_stages)) {
    h ^= static_cast<uint8_t>(c);
    h *= 16777619u;
  }
  return h;
}

int message_tag(Direction direction, int sending_stage, int microbatch, int stages) {
  const int64_t tag = (int64_t{microbatch} * stages + sending_stage) * 2 +
                      (direction == Direction::kGradient ? 1 : 0);
  if (tag > std::numeric_limits<int32_t>::max())
    throw InvalidArgumentError(
        fmt::format("pipeline: {} micro-batches x {} stages need more message tags than there are",
                    microbatch + 1, stages));
  return static_cast<int>(tag);
}

}  // namespace dtrain::pipeline
