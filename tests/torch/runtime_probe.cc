// Prints LibTorch's intra-op thread count as main() finds it: what dtrain::torch's defaults made of
// the launcher's variables, in a program that calls nothing of dtrain (runtime_test.cc runs it).
#include <ATen/Parallel.h>

#include <cstdio>

int main() {
  std::printf("threads %d\n", at::get_num_threads());
  return 0;
}
