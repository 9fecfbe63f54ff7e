// The directory of a launch's flight records (comm/flight_recorder.h): the workers'
// DTRAIN_FLIGHT_DIR, where each writes rank<R>.json, its beat page rank<R>.beat and, when one of
// its collectives fails, its failure record rank<R>.error (comm/failure_record.h), and where the
// launcher writes how each worker ended (rank<R>.exit) and each spare's place (spare<N>.place,
// comm/spare_place.h). `dtrain run` and the elastic agent make one per launch; the hang monitor
// (hang_monitor.h) and `dtrain doctor` read it.
#pragma once

#include <string>

namespace dtrain::launch {

class FlightDir {
 public:
  // The user's DTRAIN_FLIGHT_DIR, else $TMPDIR/dtrain-flight-<pid of the launcher> (ours);
  // created, and cleared of an earlier job's records.
  static FlightDir prepare();

  // A directory inside this one (each round of an elastic job has its own, so that a round's
  // records outlive the next round), created and cleared.
  FlightDir sub(const std::string& name) const;

  const std::string& path() const { return path_; }
  // Removes the records, beats, failure records, exit words and spares' places of an earlier
  // job or round, so that the hang monitor, `dtrain doctor` and the supervisor read this one's
  // only.
  void clear() const;
  // Whether a worker wrote a record (rank<R>.json), here or in a sub-directory.
  bool holds_records() const;
  // `dtrain run`'s word on how world rank `rank` ended ("failed with exit code 1"), read by its
  // peers (comm::launcher_exit_word).
  void write_exit_word(int rank, const std::string& how) const;
  // After a job that succeeded: a directory made for it that holds no record goes.
  void remove_if_unused() const;

 private:
  FlightDir(std::string path, bool ours) : path_(std::move(path)), ours_(ours) {}
  std::string path_;
  bool ours_ = false;
};

}  // namespace dtrain::launch
