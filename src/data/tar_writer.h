// Writes a tar file that GNU tar, Python's tarfile, WebDataset and TarShard (tar_shard.h) read:
// ustar headers, with a pax header before a member whose name or size ustar cannot hold. Every
// member is a regular file of mode 0644, owner 0 and time 0, so that the same members make the
// same bytes. Written through OutputFile: installed whole by close(), or not at all.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "data/output_file.h"

namespace dtrain::data {

class TarWriter {
 public:
  explicit TarWriter(std::string path);

  void add(std::string_view name, std::string_view data);
  // The archive's end (two zero blocks), synced when `sync`, then installed under its name.
  void close(bool sync = true);

  uint64_t bytes() const { return out_.bytes(); }
  size_t members() const { return members_; }
  const std::string& path() const { return out_.path(); }

 private:
  void header(std::string_view name, std::string_view prefix, uint64_t size, char type);
  void padding(uint64_t size);

  OutputFile out_;
  size_t members_ = 0;
};

}  // namespace dtrain::data
