// A worker's failure as data for its launcher, as torchelastic's error file is: when one of its
// collectives fails, a worker under `dtrain run` writes DIR/rank<R>.error beside its flight
// records (DIR = DTRAIN_FLIGHT_DIR), saying whether a peer caused the failure and which ranks
// went silent. The launcher reads it to name the cause of a job's failure rather than its
// consequences (launch/supervisor.cc), where it once matched words in the workers' stderr; the
// text stays in stderr for people. A worker that catches the error and prints its own words
// still names the cause.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace dtrain::comm {

struct FailureRecord {
  int rank = -1;             // world rank of the writer
  std::string kind;          // the error's kind: "peer failure", "timeout", ...
  bool peer_caused = false;  // another rank's failure or departure brought this one down
  std::vector<int> silent;   // world ranks that stopped answering (stopped or stuck), if any
  std::string what;          // the error's whole text
};

std::string failure_record_path(const std::string& dir, int rank);
// Writes the record where the launcher reads it, once per process (the first failure is the one
// that counts: later ones are its consequences); nothing without a launcher's DTRAIN_FLIGHT_DIR.
void write_failure_record(const FailureRecord& record);
// Rank `rank`'s record in `dir`, if it wrote a readable one.
std::optional<FailureRecord> read_failure_record(const std::string& dir, int rank);

}  // namespace dtrain::comm
