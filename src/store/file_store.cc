// FileStore: the store as an append-only log in one shared file.
//
//   record  u8 kind (1 set, 2 delete) | u64 key size | key | [u64 value size | value]   (set only)
//
// Every operation opens the file, takes an exclusive flock, reads the records appended since
// its last visit (each FileStore object caches the replayed map and the offset it reached),
// applies itself, appends its own records, and closes the file, which releases the lock. Waits
// poll with backoff from 1 ms to 50 ms. The log is never compacted: a rendezvous writes little,
// and a file that only grows is easy to read consistently without coordination. A record cut
// short (a writer killed mid-write) is dropped by the next writer.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "common/byte_order.h"
#include "common/log.h"
#include "common/socket.h"
#include "dtrain/store.h"
#include "store/store_protocol.h"
#include "store/store_util.h"

namespace dtrain {
namespace {

constexpr uint8_t kSetRecord = 1;
constexpr uint8_t kDeleteRecord = 2;
constexpr std::chrono::milliseconds kFirstBackoff{1};
constexpr std::chrono::milliseconds kMaxBackoff{50};

std::string errno_text() { return fmt::format("{} (errno {})", std::strerror(errno), errno); }

void append_set(std::vector<uint8_t>& out, const std::string& key, const Bytes& value) {
  ByteWriter w(out);
  w.u8(kSetRecord);
  w.sized(key);
  w.u64(value.size());
  w.bytes(value.data(), value.size());
}

void append_delete(std::vector<uint8_t>& out, const std::string& key) {
  ByteWriter w(out);
  w.u8(kDeleteRecord);
  w.sized(key);
}

}  // namespace

struct FileStore::Impl {
  std::string path;
  std::string who;  // "file store /shared/rdzv"

  std::mutex mutex;  // guards data, offset, dev and ino; one operation of this object at a time
  std::map<std::string, Bytes> data;  // the log replayed up to `offset`
  uint64_t offset = 0;
  dev_t dev = 0;  // the file `data` was read from: a file replaced under the same path is
  ino_t ino = 0;  // read again from its start

  // Runs fn(data, appended) with the file locked and `data` up to date; fn appends the records of
  // its changes to `appended` (and applies them to data itself). Gives up on the lock at the
  // deadline.
  template <typename Fn>
  auto locked(const Deadline& deadline, std::string_view call, Fn fn);

  // Polls until every key exists, then returns fn(data) under the lock; TimeoutError naming the
  // missing keys at the deadline.
  template <typename Fn>
  auto when_present(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                    const std::string& call, Fn fn);

 private:
  void catch_up(int fd);
  void write_records(int fd, const std::vector<uint8_t>& records);
};

void FileStore::Impl::catch_up(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw StoreError(fmt::format("{}: fstat failed: {}", who, errno_text()));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (st.st_dev != dev || st.st_ino != ino || size < offset) {
    data.clear();
    offset = 0;
    dev = st.st_dev;
    ino = st.st_ino;
  }
  if (size == offset) return;
  std::vector<uint8_t> buf(size - offset);
  size_t done = 0;
  while (done < buf.size()) {
    ssize_t n =
        ::pread(fd, buf.data() + done, buf.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw StoreError(fmt::format("{}: read failed: {}", who, errno_text()));
    if (n == 0) break;  // cannot happen while we hold the lock, but never loop forever
    done += static_cast<size_t>(n);
  }
  buf.resize(done);

  size_t pos = 0;
  auto corrupt = [&](std::string_view what) {
    return StoreError(
        fmt::format("{} is corrupt at byte {}: {}; it is not a dtrain file store, or "
                    "was damaged: delete it and restart the job",
                    who, offset + pos, what));
  };
  // Reads a u64 at `at`; false when the buffer ends first.
  auto u64_at = [&](size_t at, uint64_t& v) {
    if (at + sizeof(v) > buf.size()) return false;
    v = load_le<uint64_t>(buf.data() + at);
    return true;
  };
  while (pos < buf.size()) {
    uint8_t kind = buf[pos];
    if (kind != kSetRecord && kind != kDeleteRecord)
      throw corrupt(fmt::format("unknown record kind {}", kind));
    uint64_t key_size = 0, value_size = 0;
    size_t at = pos + 1;
    if (!u64_at(at, key_size)) break;
    if (key_size > store::kMaxKeyBytes) throw corrupt(fmt::format("key of {} bytes", key_size));
    at += sizeof(uint64_t);
    if (at + key_size > buf.size()) break;
    std::string key(reinterpret_cast<const char*>(buf.data() + at), key_size);
    at += key_size;
    if (kind == kSetRecord) {
      if (!u64_at(at, value_size)) break;
      if (value_size > store::kMaxValueBytes)
        throw corrupt(fmt::format("value of {} bytes", value_size));
      at += sizeof(uint64_t);
      if (at + value_size > buf.size()) break;
      data[std::move(key)] = Bytes(buf.begin() + at, buf.begin() + at + value_size);
      at += value_size;
    } else {
      data.erase(key);
    }
    pos = at;
  }
  if (pos < buf.size()) {
    // A record cut short by a writer that died mid-write; we hold the lock, so drop it.
    DTRAIN_LOG_WARN("{}: dropping an incomplete record of {} bytes at byte {}", who,
                    buf.size() - pos, offset + pos);
    if (::ftruncate(fd, static_cast<off_t>(offset + pos)) != 0)
      throw StoreError(fmt::format("{}: cannot drop an incomplete record: {}", who, errno_text()));
  }
  offset += pos;
}

void FileStore::Impl::write_records(int fd, const std::vector<uint8_t>& records) {
  size_t done = 0;
  while (done < records.size()) {
    ssize_t n = ::pwrite(fd, records.data() + done, records.size() - done,
                         static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      // Whatever part was written is cut off by the next writer (or by us, on the next call).
      throw StoreError(
          fmt::format("{}: write of {} bytes failed after {}: {}; check the free space "
                      "and permissions of the file system",
                      who, records.size(), done, errno_text()));
    }
    done += static_cast<size_t>(n);
  }
  offset += done;
}

template <typename Fn>
auto FileStore::Impl::locked(const Deadline& deadline, std::string_view call, Fn fn) {
  net::Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd.valid())
    throw StoreError(fmt::format("{}: {} cannot open the file: {}", who, call, errno_text()));
  // Non-blocking attempts with backoff: a process stopped while holding the lock must not hang
  // us past the deadline.
  auto backoff = std::chrono::microseconds(100);
  while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR)
      throw StoreError(fmt::format("{}: {} cannot lock the file: {}", who, call, errno_text()));
    if (deadline.expired())
      throw TimeoutError(
          fmt::format("{}: {} could not lock the file after {}: another process "
                      "holds it (stopped or hung?)",
                      who, call, deadline.describe()));
    std::this_thread::sleep_for(std::min<std::chrono::microseconds>(backoff, deadline.remaining()));
    backoff = std::min<std::chrono::microseconds>(backoff * 2, kMaxBackoff);
  }
  catch_up(fd.get());
  std::vector<uint8_t> appended;
  auto result = fn(data, appended);
  // Apply-then-write: if the write fails, forget the cache so the next call rereads the file.
  try {
    if (!appended.empty()) write_records(fd.get(), appended);
  } catch (...) {
    data.clear();
    offset = 0;
    ino = 0;
    throw;
  }
  return result;
}

template <typename Fn>
auto FileStore::Impl::when_present(const std::vector<std::string>& keys,
                                   std::chrono::milliseconds timeout, const std::string& call,
                                   Fn fn) {
  const Deadline deadline = Deadline::after(timeout);
  auto backoff = kFirstBackoff;
  for (;;) {
    std::vector<std::string> missing;
    std::optional<decltype(fn(data))> result;
    locked(deadline, call, [&](std::map<std::string, Bytes>& d, std::vector<uint8_t>&) {
      for (const auto& k : keys)
        if (!d.contains(k)) missing.push_back(k);
      if (missing.empty()) result.emplace(fn(d));
      return 0;
    });
    if (result) return std::move(*result);
    if (deadline.expired())
      throw TimeoutError(store::missing_keys_message(who, call, keys, missing, deadline));
    std::this_thread::sleep_for(std::min(backoff, deadline.remaining()));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

FileStore::FileStore(const std::string& path, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->who = fmt::format("file store {}", path);
  set_timeout(timeout);
  net::Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd.valid())
    throw StoreError(
        fmt::format("{}: cannot open or create the file: {}; check that the "
                    "directory exists and is writable",
                    impl_->who, errno_text()));
}

FileStore::~FileStore() = default;

void FileStore::set(const std::string& key, const Bytes& value) { multi_set({key}, {value}); }

Bytes FileStore::get(const std::string& key) { return std::move(multi_get({key})[0]); }

int64_t FileStore::add(const std::string& key, int64_t delta) {
  store::check_limits({key}, {}, impl_->who);
  std::lock_guard lock(impl_->mutex);
  std::string call = store::describe_call("add", {key});
  return impl_->locked(Deadline::after(timeout()), call, [&](auto& d, auto& out) {
    auto it = d.find(key);
    int64_t sum = store::add_to_value(it == d.end() ? nullptr : &it->second, delta, key);
    Bytes value = store::integer_value(sum);
    append_set(out, key, value);
    d[key] = std::move(value);
    return sum;
  });
}

Bytes FileStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  store::check_limits({key}, {expected, desired}, impl_->who);
  std::lock_guard lock(impl_->mutex);
  std::string call = store::describe_call("compare_set", {key});
  return impl_->locked(Deadline::after(timeout()), call, [&](auto& d, auto& out) {
    bool changed = false;
    Bytes now = store::compare_set_in(d, key, expected, desired, changed);
    if (changed) append_set(out, key, now);
    return now;
  });
}

bool FileStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(impl_->mutex);
  return impl_->locked(Deadline::after(timeout()), store::describe_call("check", keys),
                       [&](auto& d, auto&) {
                         return std::all_of(keys.begin(), keys.end(),
                                            [&](const std::string& k) { return d.contains(k); });
                       });
}

void FileStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::lock_guard lock(impl_->mutex);
  impl_->when_present(keys, timeout, store::describe_call("wait", keys), [](auto&) { return 0; });
}

bool FileStore::delete_key(const std::string& key) {
  std::lock_guard lock(impl_->mutex);
  return impl_->locked(Deadline::after(timeout()), store::describe_call("delete_key", {key}),
                       [&](auto& d, auto& out) {
                         if (d.erase(key) == 0) return false;
                         append_delete(out, key);
                         return true;
                       });
}

int64_t FileStore::num_keys() {
  std::lock_guard lock(impl_->mutex);
  return impl_->locked(Deadline::after(timeout()), "num_keys()",
                       [](auto& d, auto&) { return static_cast<int64_t>(d.size()); });
}

std::vector<Bytes> FileStore::multi_get(const std::vector<std::string>& keys) {
  std::lock_guard lock(impl_->mutex);
  return impl_->when_present(keys, timeout(), store::describe_call("multi_get", keys),
                             [&](auto& d) {
                               std::vector<Bytes> values;
                               values.reserve(keys.size());
                               for (const auto& k : keys) values.push_back(d.at(k));
                               return values;
                             });
}

void FileStore::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size())
    throw InvalidArgumentError(
        fmt::format("{}: multi_set got {} keys but {} values; pass one value "
                    "per key",
                    impl_->who, keys.size(), values.size()));
  store::check_limits(keys, values, impl_->who);
  std::lock_guard lock(impl_->mutex);
  impl_->locked(Deadline::after(timeout()), store::describe_call("multi_set", keys),
                [&](auto& d, auto& out) {
                  for (size_t i = 0; i < keys.size(); ++i) {
                    append_set(out, keys[i], values[i]);
                    d[keys[i]] = values[i];
                  }
                  return 0;
                });
}

}  // namespace dtrain
