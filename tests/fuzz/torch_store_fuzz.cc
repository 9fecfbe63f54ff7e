// The server side of torch's TCPStore protocol (torch_store_protocol.h) on arbitrary bytes: it
// answers well-formed queries and stops on anything else with one of dtrain's errors.
#include <map>
#include <string>

#include "dtrain/error.h"
#include "fuzz/fuzz_input.h"
#include "store/torch_store_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > dtrain::fuzz::kMaxInput) return -1;
  auto d = dtrain::fuzz::deliver(data, size);
  // A tiny store of its own, so that get/add/check answer as a real one would.
  std::map<std::string, dtrain::Bytes> keys;
  dtrain::store::TorchClientHooks hooks{[&](const dtrain::store::Request& r) {
    dtrain::store::Response resp;
    using dtrain::store::Command;
    switch (r.command) {
      case Command::kSet:
        if (!r.keys.empty() && !r.values.empty()) keys[r.keys[0]] = r.values[0];
        break;
      case Command::kCompareSet:  // the current value, or empty when the key is missing
        if (!r.keys.empty()) resp.values.push_back(keys.count(r.keys[0]) ? keys[r.keys[0]]
                                                                          : dtrain::Bytes{});
        break;
      case Command::kGet:
        if (!r.keys.empty() && keys.count(r.keys[0])) resp.values.push_back(keys[r.keys[0]]);
        else resp.status = dtrain::store::Status::kTimeout;
        break;
      case Command::kAdd:
        resp.integer = static_cast<int64_t>(keys.size());
        break;
      default:
        break;
    }
    return resp;
  }};
  try {
    dtrain::store::serve_torch_client(d.ours.get(), hooks, "fuzz");
  } catch (const dtrain::Error&) {
  }
  return 0;
}
