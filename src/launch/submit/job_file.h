// A job description in a small YAML file (`dtrain submit --file job.yaml`), its keys the long
// flags of `dtrain submit` without the dashes before them:
//
//   name: resnet
//   engine: slurm
//   nodes: 2
//   procs-per-node: 8
//   gpus-per-proc: 1
//   gpu-model: a100
//   mem: auto
//   container: localhost/dtrain:latest
//   notify-webhook: https://hooks.example.com/dtrain
//   env: {NCCL_DEBUG: WARN}
//   command: [python3, train.py, --epochs, "90"]
//
// A flag given on the command line wins over the file's key of the same name.
#pragma once

#include <functional>
#include <string>

#include "launch/submit/job.h"

namespace dtrain::submit {

// Sets `job`'s fields from the file, but not those whose flag `given` says the command line set
// (called with the key: "procs-per-node"). Returns the file's engine ("" when it names none).
// Throws InvalidArgumentError naming the file, the line and the key for a key it does not know,
// a value of the wrong kind, or YAML it cannot parse.
std::string load_job_file(const std::string& path, Job& job,
                          const std::function<bool(const std::string& key)>& given);

}  // namespace dtrain::submit
