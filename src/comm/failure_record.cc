#include "comm/failure_record.h"

#include <atomic>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/env.h"
#include "common/log.h"

namespace dtrain::comm {

std::string failure_record_path(const std::string& dir, int rank) {
  return fmt::format("{}/rank{}.error", dir, rank);
}

void write_failure_record(const FailureRecord& record) {
  static std::atomic<bool> written{false};
  const std::string dir = env::get_string(env::kFlightDir);
  if (dir.empty() || written.exchange(true)) return;
  const nlohmann::json j = {{"rank", record.rank},
                            {"kind", record.kind},
                            {"peer_caused", record.peer_caused},
                            {"silent", record.silent},
                            {"what", record.what}};
  // Whole or not at all: written aside, then renamed into place.
  const std::string path = failure_record_path(dir, record.rank);
  std::error_code ec;
  {
    std::ofstream out(path + ".tmp");
    out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    if (!out) {
      DTRAIN_LOG_WARN("cannot write {}: the launcher will name the failure's cause from stderr",
                      path);
      return;
    }
  }
  std::filesystem::rename(path + ".tmp", path, ec);
}

std::optional<FailureRecord> read_failure_record(const std::string& dir, int rank) {
  std::ifstream in(failure_record_path(dir, rank));
  if (!in) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("rank") || !j["rank"].is_number_integer()) return std::nullopt;
  FailureRecord r;
  r.rank = j["rank"].get<int>();
  if (j.contains("kind") && j["kind"].is_string()) r.kind = j["kind"].get<std::string>();
  if (j.contains("peer_caused") && j["peer_caused"].is_boolean())
    r.peer_caused = j["peer_caused"].get<bool>();
  if (j.contains("silent") && j["silent"].is_array())
    for (const auto& s : j["silent"])
      if (s.is_number_integer()) r.silent.push_back(s.get<int>());
  if (j.contains("what") && j["what"].is_string()) r.what = j["what"].get<std::string>();
  return r;
}

}  // namespace dtrain::comm
