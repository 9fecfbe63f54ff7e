// Pipeline schedules from outside (src/pipeline): `dtrain pipeline-plan --check FILE` reads a
// schedule's JSON and verifies it, and every runner decodes the message headers its peers send.
// The first bytes choose which; either ends or throws InvalidArgumentError, never anything else.
#include <span>
#include <string>

#include "dtrain/error.h"
#include "dtrain/pipeline/chart.h"
#include "dtrain/pipeline/schedule.h"
#include "dtrain/pipeline/verifier.h"
#include "pipeline/message.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto* bytes = reinterpret_cast<const std::byte*>(data + 1);
  try {
    if (data[0] % 2 == 0) {
      dtrain::pipeline::decode(std::span<const std::byte>(bytes, size - 1));
    } else {
      auto s = dtrain::pipeline::schedule_from_json(
          std::string(reinterpret_cast<const char*>(data + 1), size - 1));
      // Keep the verifier's work bounded: the fuzzer looks for crashes, not for slow inputs.
      size_t actions = 0;
      for (const auto& list : s.actions) actions += list.size();
      if (s.stages() <= 64 && s.microbatches <= 64 && actions <= 4096) {
        auto report = dtrain::pipeline::verify(s);
        if (report.ok) dtrain::pipeline::text_chart(s, report);
      }
    }
  } catch (const dtrain::InvalidArgumentError&) {
  }
  return 0;
}
