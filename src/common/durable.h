// Durable storage: the one way dtrain writes what must survive a crash (checkpoints of models,
// optimizers and parameter-server tables). Write and fsync, fsync the directory after a rename,
// checksum (CRC-32, zlib's) what is really on disk, install a finished directory under its
// final name in one rename, list and prune numbered directories (PREFIX + digits), remove the
// temporaries of saves that never finished.
//
// Failures carry their kind (dtrain/error.h, kind_of_errno): a full disk is a
// ResourceExhaustedError, EIO or a failed fsync a DataLossError, a bad path an
// InvalidArgumentError; the message names the file, the call and errno. Nothing here is half
// done on error: a file is complete and durable, or the caller's directory is left unfinished
// under a temporary name that remove_temporaries() clears.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::durable {

std::string errno_text(int err);  // "No space left on device (28)"
// Throws the error of errno `err`'s kind: "<what> <path> failed: <errno_text>".
[[noreturn]] void throw_io(int err, const std::string& what, const std::string& path);

// zlib's CRC-32; `start` continues the CRC of the bytes before (0: none).
uint32_t crc32_of(const void* data, size_t size, uint32_t start = 0);
inline uint32_t crc32_of(const std::string& text) { return crc32_of(text.data(), text.size()); }

struct FileSum {
  uint64_t bytes = 0;
  uint32_t crc = 0;
};
// Size and CRC-32 of what the file holds; with `sync`, also makes it durable first (fsync works
// on a read-only descriptor, and reading back checksums the bytes the disk really has).
FileSum sum_file(const std::string& path, bool sync);

// Writes `bytes` to `path` (created or truncated) and fsyncs it.
void write_file(const std::string& path, const void* bytes, size_t size);
inline void write_file(const std::string& path, const std::string& text) {
  write_file(path, text.data(), text.size());
}
std::string read_file(const std::string& path);

// A rename is durable once the directory holding the name is.
void fsync_dir(const std::string& dir);

// Puts the finished directory `tmp` in place as `final_path` in `dir`, durably. A directory of
// that name may exist (a step saved again): the two are swapped atomically and the old removed.
void install(const std::string& tmp, const std::string& final_path, const std::string& dir);

// The numbers of DIR's directories named PREFIX<digits>, newest (largest) first.
std::vector<int64_t> list_numbered(const std::string& dir, const std::string& prefix);
// "<dir>/<prefix><n>", n with at least `width` digits.
std::string numbered_path(const std::string& dir, const std::string& prefix, int64_t n,
                          int width = 6);
// The temporary name of a save of PREFIX<n> by this process: ".<prefix><n>.tmp-<pid>".
std::string temporary_path(const std::string& dir, const std::string& prefix, int64_t n);
// Removes ".<prefix>*.tmp-*" and ".<prefix>*.old-*" directories of other processes: saves that
// never finished, and old ones set aside by an install without an atomic swap.
void remove_temporaries(const std::string& dir, const std::string& prefix);
// Removes the numbered directories after `newest_kept`, and of the rest keeps the newest `keep`
// (at least 1). A directory that cannot be removed is logged, not thrown: it is garbage, and the
// save that made the new one has succeeded.
void prune(const std::string& dir, const std::string& prefix, int keep, int64_t newest_kept);

}  // namespace dtrain::durable
