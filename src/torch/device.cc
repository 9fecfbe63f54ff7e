#include "dtrain/torch/device.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>

#include "dtrain/error.h"
#include "dtrain/identity.h"

namespace dtrain {
namespace {

// The loaded NVIDIA kernel driver's first line ("NVRM version: NVIDIA UNIX x86_64 Kernel Module
// 580.95.05 ..."), or why there is none.
std::string driver() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  if (!in || !std::getline(in, line) || line.empty())
    return "no NVIDIA kernel driver is loaded (/proc/driver/nvidia/version is missing)";
  return "driver: " + line;
}

// Whether LibTorch's CUDA library is in the process (it registers CUDA's guard when loaded,
// with or without a driver).
bool torch_has_cuda() { return c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA); }

// What this process sees of CUDA: for an error that says why "cuda" cannot be used.
std::string what_cuda_sees(int visible) {
  const char* devices = std::getenv("CUDA_VISIBLE_DEVICES");
  return fmt::format("CUDA_VISIBLE_DEVICES={}; {}; LibTorch {} and sees {} GPU(s)",
                     devices == nullptr ? "(not set)" : fmt::format("'{}'", devices), driver(),
                     torch_has_cuda() ? "has CUDA" : "has no CUDA (a CPU-only build)", visible);
}

// The GPUs CUDA lets this process use: 0 without a driver, a device or LibTorch's CUDA.
int visible_gpus() {
  if (!torch_has_cuda()) return 0;
  return static_cast<int>(c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->deviceCount());
}

}  // namespace

c10::Device training_device(std::string_view name) {
  const std::string text(name);
  if (text == "cpu") return c10::Device(c10::DeviceType::CPU);
  if (text != "cuda" && text.rfind("cuda:", 0) != 0)
    throw InvalidArgumentError(
        fmt::format("--device {}: expected cpu, cuda (this rank's GPU) or cuda:N", text));
  int index = -1;
  if (text != "cuda") {
    const std::string number = text.substr(5);
    char* end = nullptr;
    const long n = std::strtol(number.c_str(), &end, 10);
    if (number.empty() || *end != '\0' || n < 0 || n > 1023)
      throw InvalidArgumentError(
          fmt::format("--device {}: expected cuda:N with N a GPU's number", text));
    index = static_cast<int>(n);
  }
  const int visible = visible_gpus();
  if (visible == 0)
    throw InvalidArgumentError(fmt::format(
        "--device {}: this process can use no GPU ({}); train with --device cpu, or run where "
        "a GPU and its driver are",
        text, what_cuda_sees(visible)));
  if (index < 0) index = resolve_identity().local_rank % visible;
  if (index >= visible)
    throw InvalidArgumentError(
        fmt::format("--device {}: there is no GPU {} ({})", text, index, what_cuda_sees(visible)));
  const c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
  // Current from now on: the streams dtrain's views name, and torch's own, are on it.
  c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(device);
  return device;
}

}  // namespace dtrain
