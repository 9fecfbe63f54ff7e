// A fresh directory under the system's temporary folder, removed with the object.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace dtrain::testing {

struct TempDir {
  std::string path;
  explicit TempDir(const std::string& prefix = "dtrain-test") {
    std::string pattern =
        (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    path = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace dtrain::testing
