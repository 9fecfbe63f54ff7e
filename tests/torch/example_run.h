// Running the examples from a test, as a user would in a shell: the command's output (stdout and
// stderr) and exit status, and the RESULT line the examples end with.
#pragma once

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace dtrain::testing {

struct RunResult {
  int status = -1;  // pclose's: 0 when the command exited 0
  std::string output;
};

inline RunResult run_command(const std::string& command) {
  RunResult r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (fgets(buf, sizeof buf, p) != nullptr) r.output += buf;
  r.status = pclose(p);
  return r;
}

// The JSON of the last "RESULT {...}" line; null when there is none.
inline nlohmann::json result_of(const std::string& output) {
  auto at = output.rfind("RESULT ");
  if (at == std::string::npos) return nullptr;
  auto end = output.find('\n', at);
  return nlohmann::json::parse(output.substr(at + 7, end - at - 7));
}

}  // namespace dtrain::testing
