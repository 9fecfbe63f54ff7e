// The pipeline's message header: what one runner writes the other reads back; bytes that are not
// a header, or describe an impossible tensor, are refused with what is wrong.
#include "pipeline/message.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "dtrain/error.h"

namespace dtrain::pipeline {
namespace {

MessageHeader sample() {
  MessageHeader h;
  h.direction = Direction::kGradient;
  h.stage = 3;
  h.microbatch = 7;
  h.step = 12345678901;
  h.microbatches = 8;
  h.schedule_id = schedule_id("zb-h1", 4, 1);
  h.dtype = DType::kBF16;
  h.shape = {5, 0, 17};
  return h;
}

std::string refusal(std::array<std::byte, kHeaderBytes> bytes) {
  try {
    decode(bytes);
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(PipelineMessage, RoundTrip) {
  const MessageHeader h = sample();
  const MessageHeader back = decode(encode(h));
  EXPECT_EQ(back.direction, h.direction);
  EXPECT_EQ(back.stage, 3);
  EXPECT_EQ(back.microbatch, 7);
  EXPECT_EQ(back.step, h.step);
  EXPECT_EQ(back.microbatches, 8);
  EXPECT_EQ(back.schedule_id, h.schedule_id);
  EXPECT_EQ(back.dtype, DType::kBF16);
  EXPECT_EQ(back.shape, h.shape);
  EXPECT_EQ(back.nbytes(), 0u);
  EXPECT_EQ(describe(back), "gradient of micro-batch 7 from stage 3 (step 12345678901, bf16 [5, 0, 17])");
}

TEST(PipelineMessage, ForeignOrImpossibleBytesAreRefused) {
  auto bytes = encode(sample());
  auto garbage = bytes;
  garbage[0] = std::byte{'G'};
  EXPECT_NE(refusal(garbage).find("not a pipeline message"), std::string::npos);
  auto version = bytes;
  version[4] = std::byte{9};
  EXPECT_NE(refusal(version).find("message version 9"), std::string::npos);
  auto huge = bytes;
  const int64_t big = int64_t{1} << 41;
  std::memcpy(huge.data() + 40, &big, sizeof big);  // the first dimension
  EXPECT_NE(refusal(huge).find("impossible shape"), std::string::npos) << refusal(huge);
  MessageHeader deep = sample();
  deep.shape.assign(kMaxDims + 1, 1);
  EXPECT_THROW(encode(deep), InvalidArgumentError);
  EXPECT_THROW(decode(std::span<const std::byte>(bytes.data(), 12)), InvalidArgumentError);
}

TEST(PipelineMessage, TagsAreOnePerDirectionStageAndMicrobatch) {
  std::set<int> tags;
  for (int mb = 0; mb < 8; ++mb)
    for (int s = 0; s < 4; ++s)
      for (Direction d : {Direction::kActivation, Direction::kGradient})
        EXPECT_TRUE(tags.insert(message_tag(d, s, mb, 4)).second);
  EXPECT_THROW(message_tag(Direction::kGradient, 1000, 1 << 20, 4096), InvalidArgumentError);
  EXPECT_NE(schedule_id("1f1b", 4, 1), schedule_id("1f1b", 4, 2));
  EXPECT_NE(schedule_id("1f1b", 4, 1), schedule_id("gpipe", 4, 1));
}

}  // namespace
}  // namespace dtrain::pipeline
