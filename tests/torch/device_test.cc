// training_device: the --device flag of the examples. Where no GPU is visible (CI, this
// machine), "cuda" fails at once and says what it saw; where one is, it picks this rank's GPU.
#include "dtrain/torch/device.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "dtrain/error.h"

namespace dtrain {
namespace {

// The error `name` raises, or "" when it raises none.
std::string refusal(const std::string& name) {
  try {
    training_device(name);
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "";
}

TEST(TrainingDevice, CpuIsTheHost) {
  EXPECT_EQ(training_device("cpu"), c10::Device(c10::DeviceType::CPU));
}

TEST(TrainingDevice, OtherNamesAreRefusedSayingWhatIsExpected) {
  for (const std::string name : {"gpu", "CUDA", "tpu", ""}) {
    const auto text = refusal(name);
    EXPECT_NE(text.find("expected cpu, cuda (this rank's GPU) or cuda:N"), std::string::npos)
        << name << ": " << text;
  }
  for (const std::string name : {"cuda:", "cuda:x", "cuda:-1", "cuda:1x"}) {
    const auto text = refusal(name);
    EXPECT_NE(text.find("expected cuda:N with N a GPU's number"), std::string::npos)
        << name << ": " << text;
  }
}

TEST(TrainingDevice, CudaWithoutAVisibleGpuSaysWhatItSaw) {
  // Hidden from CUDA by the variable, whatever the machine has; CUDA reads it once, at its
  // initialisation, which nothing in this process has caused before.
  ASSERT_EQ(::setenv("CUDA_VISIBLE_DEVICES", "", 1), 0);
  for (const std::string name : {"cuda", "cuda:0"}) {
    const auto text = refusal(name);
    EXPECT_NE(text.find("--device " + name + ": this process can use no GPU"), std::string::npos)
        << text;
    EXPECT_NE(text.find("CUDA_VISIBLE_DEVICES=''"), std::string::npos) << text;
    // The driver: its version, or that none is loaded.
    EXPECT_TRUE(text.find("NVIDIA kernel driver") != std::string::npos ||
                text.find("driver: NVRM") != std::string::npos)
        << text;
    EXPECT_NE(text.find("LibTorch has"), std::string::npos) << text;
    EXPECT_NE(text.find("sees 0 GPU(s)"), std::string::npos) << text;
    EXPECT_NE(text.find("--device cpu"), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace dtrain
