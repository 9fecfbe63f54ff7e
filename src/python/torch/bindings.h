// The parts of the extension dtrain._torch bound outside module.cc.
#pragma once

#include <pybind11/pybind11.h>

namespace dtrain::python {

// CheckpointManager and DistributedSampler (checkpoint_bindings.cc).
void bind_checkpoints(pybind11::module_& m);

}  // namespace dtrain::python
