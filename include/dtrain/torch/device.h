// The device a rank trains on, from what the user asked for (a --device flag):
//
//   const at::Device device = dtrain::training_device(flags.device);   // "cpu", "cuda", "cuda:1"
//   model->to(device);
//
// "cuda" is this rank's GPU: LOCAL_RANK (dtrain run, torchrun, mpirun, Slurm) modulo the GPUs
// the process sees, the one the nccl backend picks too; it is made the current CUDA device.
// Without a usable GPU, "cuda" fails at once, before anything starts, and says what it saw.
#pragma once

#include <string_view>

#include <c10/core/Device.h>

namespace dtrain {

// Throws InvalidArgumentError for a name other than cpu, cuda or cuda:N, and for a GPU this
// process cannot use: the message names CUDA_VISIBLE_DEVICES, the NVIDIA driver (its version,
// or that none is loaded), whether this LibTorch was built with CUDA, and the GPUs it sees.
c10::Device training_device(std::string_view name);

}  // namespace dtrain
