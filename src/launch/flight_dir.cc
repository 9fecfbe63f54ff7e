#include "launch/flight_dir.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "comm/flight_recorder.h"
#include "common/env.h"

namespace dtrain::launch {

FlightDir FlightDir::prepare() {
  std::string dir = env::get_string(env::kFlightDir);
  const bool ours = dir.empty();
  if (ours) {
    const char* tmp = std::getenv("TMPDIR");
    dir = fmt::format("{}/dtrain-flight-{}", tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                      ::getpid());
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  FlightDir flight(dir, ours);
  flight.clear();
  return flight;
}

FlightDir FlightDir::sub(const std::string& name) const {
  FlightDir flight(path_ + "/" + name, false);
  std::error_code ec;
  std::filesystem::create_directories(flight.path_, ec);
  flight.clear();
  return flight;
}

void FlightDir::clear() const {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(path_, ec)) {
    const std::string name = e.path().filename().string();
    const auto ext = e.path().extension();
    const bool rank_file = name.rfind("rank", 0) == 0 &&
                           (ext == ".json" || ext == ".beat" || ext == ".exit" || ext == ".error");
    if (rank_file || (name.rfind("spare", 0) == 0 && ext == ".place"))
      std::filesystem::remove(e.path(), ec);
  }
}

bool FlightDir::holds_records() const {
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(path_, ec))
    if (e.path().extension() == ".json") return true;
  return false;
}

void FlightDir::write_exit_word(int rank, const std::string& how) const {
  const std::string path = comm::exit_word_path(path_, rank);
  std::ofstream(path + ".tmp") << how << "\n";
  std::error_code ec;
  std::filesystem::rename(path + ".tmp", path, ec);
}

void FlightDir::remove_if_unused() const {
  if (!ours_ || holds_records()) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace dtrain::launch
