// Kernels built once per x86-64 level (AVX-512, AVX2 + F16C, baseline SSE2) from one scalar
// source, the best chosen once at load time by an ifunc: the binary still runs on any x86-64.
#pragma once

// Not under ThreadSanitizer: the clones' ifunc resolvers run during relocation, before its
// runtime is up, and the program dies of SIGSEGV before main.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define DTRAIN_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DTRAIN_CLONES
#endif
// Inlined into each clone, so that each is compiled for its own level.
#define DTRAIN_INLINE __attribute__((always_inline))
