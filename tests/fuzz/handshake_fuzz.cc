// The listening side of the handshake (handshake.h) on arbitrary bytes, with and without a
// token: it accepts a well-formed hello or throws HandshakeRefused (or one of dtrain's errors).
#include <chrono>

#include "common/handshake.h"
#include "dtrain/error.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > dtrain::fuzz::kMaxInput) return -1;
  const bool with_token = (data[0] & 1) != 0;
  auto d = dtrain::fuzz::deliver(data + 1, size - 1);
  const dtrain::net::HandshakeConfig config{"dtrain", with_token ? "fuzz-token" : ""};
  try {
    dtrain::net::handshake_accept(d.ours.get(), config, dtrain::net::Role::kPair, 0,
                                  dtrain::Deadline::after(std::chrono::milliseconds(50)));
  } catch (const dtrain::net::HandshakeRefused&) {
  } catch (const dtrain::Error&) {
  }
  return 0;
}
