// What the documentation's C++ snippets use without declaring it: they are fragments of a
// program (tools/docs_snippets.py compiles each as a function body after this header).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "dtrain/dtrain.h"
#include "dtrain/ps.h"

namespace snippets {
extern std::shared_ptr<dtrain::ProcessGroup> pg;
extern std::vector<float> weights, grads, rows, row_grads;
extern std::vector<uint64_t> ids;
// docs/data.md: a training loop's own pieces.
struct Sample {};
Sample parse(const std::vector<std::byte>& bytes);
void train(Sample& sample);
void train_one_step(int64_t step);   // docs/fault_tolerance.md, preemption
void save_checkpoint(int64_t step);
extern uint64_t epochs;
}  // namespace snippets
