// A spare's place (`dtrain run --live --spares K`): the launcher starts K workers ahead of any
// failure, with no rank of their own (DTRAIN_LIVE_SPARE=N, N = 1, 2, ...). Each builds what its
// program builds before it first needs the world (importing torch, making the model) and then
// waits. When a worker dies, its launcher writes DIR/spare<N>.place (DIR = DTRAIN_FLIGHT_DIR,
// replaced whole by rename) with the dead worker's rank and local rank and when it gave the
// place, and the spare joins the live workers in that place as a replacement does
// (dtrain/live_membership.h), seconds sooner than a process started only then.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace dtrain::comm {

struct SparePlace {
  int rank = 0;        // the dead worker's rank at start, which the spare takes
  int local_rank = 0;  // its rank among its node's workers
  // When the launcher gave it (write_spare_place sets it), for a spare to tell how long the
  // place waited for it.
  std::chrono::system_clock::time_point given;
};

std::string spare_place_path(const std::string& dir, int spare);
// The launcher's side: gives spare `spare` its place (durable::throw_io's errors).
void write_spare_place(const std::string& dir, int spare, SparePlace place);
// The spare's side: its place, once its launcher gave it one.
std::optional<SparePlace> read_spare_place(const std::string& dir, int spare);

}  // namespace dtrain::comm
