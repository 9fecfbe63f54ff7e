// The store's request parser (store_protocol.h) on arbitrary bytes from a client: it returns
// requests within the protocol's limits or throws one of dtrain's errors; nothing else.
#include <chrono>

#include "dtrain/error.h"
#include "fuzz/fuzz_input.h"
#include "store/store_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > dtrain::fuzz::kMaxInput) return -1;
  auto d = dtrain::fuzz::deliver(data, size);
  try {
    while (auto request = dtrain::store::read_request(d.ours.get(), std::chrono::milliseconds(50),
                                                      "fuzz")) {
      dtrain::store::check_limits(request->keys, request->values, "fuzz");
      auto bytes = dtrain::store::encode_request(*request);  // what parsed re-encodes
      (void)bytes;
    }
  } catch (const dtrain::Error&) {
  }
  return 0;
}
