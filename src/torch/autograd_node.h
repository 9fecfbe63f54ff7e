// How dtrain holds a parameter's gradient accumulator (an autograd Node), to keep the hooks it
// registers there alive: by the pointer type torch's autograd returns it in, std::shared_ptr up to
// torch 2.14 and c10::intrusive_ptr from 2.15 on.
#pragma once

#include <utility>

#include <torch/csrc/autograd/variable.h>

namespace dtrain {

using AutogradNodePtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

}  // namespace dtrain
