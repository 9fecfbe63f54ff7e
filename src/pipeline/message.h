// What the pipeline runners send between stages: a fixed-size header that describes the tensor
// that follows it (direction, sending stage, micro-batch, step, dtype, shape), so shapes may
// change from batch to batch and a wrong message is named instead of being read as data.
// Header and tensor go with the same point-to-point tag, one tag per (direction, stage,
// micro-batch), so messages of different micro-batches never wait for each other. The C++ runner
// (src/torch/pipeline.cc) and the Python one (python/dtrain/pipeline.py, through dtrain._core)
// both use this.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dtrain/tensor.h"

namespace dtrain::pipeline {

enum class Direction : uint8_t { kActivation = 1, kGradient = 2 };

struct MessageHeader {
  Direction direction = Direction::kActivation;
  int stage = 0;  // the stage that sent it
  int microbatch = 0;
  int64_t step = 0;          // the runner's step count, so a message from another step is caught
  int microbatches = 0;      // the sender's micro-batches per step
  uint32_t schedule_id = 0;  // schedule_id() of the sender's schedule
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;

  size_t numel() const;
  size_t nbytes() const { return numel() * element_size(dtype); }
};

constexpr size_t kHeaderBytes = 128;
constexpr size_t kMaxDims = 11;

// Throws InvalidArgumentError when the shape has more than kMaxDims dimensions or a negative one.
std::array<std::byte, kHeaderBytes> encode(const MessageHeader& header);
// Throws InvalidArgumentError naming what is wrong (not a pipeline message, another version,
// an impossible shape or dtype).
MessageHeader decode(std::span<const std::byte> bytes);

// "activation of micro-batch 3 from stage 1 (step 7, f32 [4, 16])".
std::string describe(const MessageHeader& header);

// A fingerprint of a schedule's name, ranks and virtual stages: ranks that disagree on them are
// told so by the first message instead of waiting for messages that never come.
uint32_t schedule_id(const std::string& name, int ranks, int virtual_stages);

// The tag of a message: one per (direction, sending stage, micro-batch) in a step.
int message_tag(Direction direction, int sending_stage, int microbatch, int stages);

}  // namespace dtrain::pipeline
