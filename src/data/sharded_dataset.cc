#include "dtrain/data/sharded_dataset.h"

#include <glob.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <list>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "common/env.h"
#include "common/log.h"
#include "data/epoch_order.h"
#include "data/shard_file.h"
#include "dtrain/error.h"

namespace dtrain::data {
namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

void expand_one(const std::string& pattern, std::vector<std::string>& out) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
    ::globfree(&g);
    throw InvalidArgumentError(
        fmt::format("ShardedDataset: no file matches '{}' (from the working directory {})", pattern,
                    std::filesystem::current_path().string()));
  }
  if (rc != 0) {
    ::globfree(&g);
    throw InvalidArgumentError(
        fmt::format("ShardedDataset: cannot expand '{}' (glob error {})", pattern, rc));
  }
  for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
}

}  // namespace

std::vector<std::string> expand_shards(const std::vector<std::string>& patterns) {
  std::vector<std::string> files;
  for (const auto& p : patterns) {
    if (!p.starts_with("@")) {
      expand_one(p, files);
      continue;
    }
    const std::filesystem::path manifest = p.substr(1);
    std::ifstream in(manifest);
    if (!in)
      throw InvalidArgumentError(fmt::format("ShardedDataset: cannot read the manifest {}: {}",
                                             manifest.string(), std::strerror(errno)));
    std::string line;
    while (std::getline(in, line)) {
      line = trim(line);
      if (line.empty() || line.starts_with("#")) continue;
      std::filesystem::path entry = line;
      if (entry.is_relative()) entry = manifest.parent_path() / entry;  // beside the manifest
      expand_one(entry.string(), files);
    }
  }
  return files;
}

struct ShardedDataset::Impl {
  // Set once.
  ShardedDatasetOptions o;
  std::vector<std::string> files;
  std::vector<uint64_t> counts;
  uint64_t total = 0;
  std::chrono::milliseconds timeout{0};

  struct Result {
    Record record;
    std::exception_ptr error;
    size_t bytes = 0;  // counted against prefetch_bytes
    // The bad records this one replaces (OnBadRecord::kSkip): listed once next() hands it out,
    // so that records read ahead for an epoch set_epoch() then dropped are not counted.
    std::vector<std::string> replaced;
  };
  // A claimed slot: where its record is read from (for a timeout's message), and its result.
  struct Slot {
    size_t shard = 0;
    uint64_t index = 0;
    bool done = false;
    Result result;
  };

  std::mutex mu;                        // guards everything below, up to the files' cache
  std::condition_variable readers_cv;   // work or room for the readers
  std::condition_variable consumer_cv;  // the slot next() waits for is done
  uint64_t generation = 0;              // set_epoch() bumps it: results of an older one are dropped
  uint64_t epoch = 0, start = 0, left = 0, num_samples = 0;
  std::unique_ptr<EpochOrder> order;
  uint64_t planned = 0;   // slots handed to readers
  uint64_t returned = 0;  // slots next() returned
  size_t bytes_in_flight = 0;
  // Slot k lives at ring[k % prefetch_records]: the claimed slots are [returned, planned), never
  // more than prefetch_records of them.
  std::vector<Slot> ring;
  std::vector<std::string> skipped;
  // The slot next()/try_next() waits for, and since when: the timeout runs across slices.
  uint64_t waiting_for = UINT64_MAX, waiting_generation = 0;
  std::chrono::steady_clock::time_point waiting_since;
  bool stopping = false;
  std::vector<std::thread> threads;

  std::mutex files_mu;                                                  // guards open_files
  std::list<std::pair<size_t, std::shared_ptr<ShardFile>>> open_files;  // most recent first

  std::string who() const { return fmt::format("rank {}: ShardedDataset", o.rank); }

  Slot& slot(uint64_t k) { return ring[k % ring.size()]; }

  void reset_locked(uint64_t e, uint64_t consumed) {
    ++generation;
    epoch = e;
    start = std::min(consumed, total);
    left = total - start;
    const auto w = static_cast<uint64_t>(o.world_size);
    num_samples = o.drop_last ? left / w : (left + w - 1) / w;
    order = std::make_unique<EpochOrder>(counts, o.seed, epoch, o.shuffle, o.shuffle_window);
    planned = returned = 0;
    bytes_in_flight = 0;
    ring.assign(o.prefetch_records, Slot{});
  }

  // The epoch position of this rank's slot k: the sampler's dealing, padded from the start.
  uint64_t position(uint64_t k) const {
    const uint64_t i = static_cast<uint64_t>(o.rank) + k * static_cast<uint64_t>(o.world_size);
    return i < left ? start + i : (i - left) % total;
  }

  std::shared_ptr<ShardFile> file(size_t s) {
    // Consecutive records mostly come from one file: each reader keeps the last one it used.
    thread_local const Impl* last_owner = nullptr;
    thread_local size_t last_shard = 0;
    thread_local std::shared_ptr<ShardFile> last;
    if (last_owner == this && last_shard == s && last) return last;
    std::shared_ptr<ShardFile> found;
    {
      std::lock_guard lock(files_mu);
      for (auto it = open_files.begin(); it != open_files.end(); ++it)
        if (it->first == s) {
          open_files.splice(open_files.begin(), open_files, it);
          found = it->second;
          break;
        }
    }
    if (!found) {
      found = open_shard(files[s]);  // outside the lock: may be slow
      if (found->size() != counts[s])
        throw InvalidArgumentError(fmt::format(
            "{}: {} now holds {} records, {} when the dataset was opened: the file changed "
            "during the job",
            who(), files[s], found->size(), counts[s]));
      std::lock_guard lock(files_mu);
      open_files.emplace_front(s, found);
      while (open_files.size() > std::max<size_t>(o.open_files, 1)) open_files.pop_back();
    }
    last_owner = this;
    last_shard = s;
    last = found;
    return found;
  }

  // Reads global record `id` into r (for a substitute: not counted, not decoded here).
  void read(uint64_t id, EpochOrder& locator, Record& r) {
    const auto [s, index] = locator.locate(id);
    r.shard = s;
    r.index = index;
    r.id = id;
    file(s)->read(index, r);
  }

  void reader_loop() {
    std::unique_lock lock(mu);
    for (;;) {
      readers_cv.wait(lock, [&] {
        return stopping || (planned < num_samples && planned - returned < o.prefetch_records &&
                            bytes_in_flight < o.prefetch_bytes);
      });
      if (stopping) return;
      const uint64_t gen = generation, k = planned++, p = position(k), id = order->at(p);
      const auto [s, index] = order->locate(id);
      Slot& claimed = slot(k);
      claimed = Slot{s, index, false, {}};
      const uint64_t e = epoch;
      lock.unlock();
      Result result = fetch(gen, k, e, p, id, s, index);
      lock.lock();
      if (stopping) return;
      if (gen != generation) continue;  // set_epoch() dropped the slot
      Slot& done = slot(k);
      done.result = std::move(result);
      done.done = true;
      if (k == returned) consumer_cv.notify_one();
    }
  }

  // Reads and decodes slot k (global record id, file s, record index) of generation gen. A
  // result of a generation that set_epoch() has since replaced is dropped by the caller.
  Result fetch(uint64_t gen, uint64_t k, uint64_t e, uint64_t p, uint64_t id, size_t s,
               uint64_t index) {
    Result r;
    r.record.shard = s;
    r.record.index = index;
    r.record.id = id;
    try {
      auto f = file(s);
      const size_t bytes = f->data_bytes(index);
      {
        std::unique_lock lock(mu);
        // Room for its bytes, except for the slot next() waits for (a record larger than the
        // whole budget still goes, alone): waiting there could never end.
        readers_cv.wait(lock, [&] {
          return stopping || gen != generation || k == returned ||
                 bytes_in_flight + bytes <= o.prefetch_bytes;
        });
        if (stopping || gen != generation) return r;
        bytes_in_flight += bytes;
        r.bytes = bytes;
      }
      f->read(index, r.record);
    } catch (const InvalidArgumentError& bad) {  // a damaged or unreadable file
      if (o.on_bad_record == OnBadRecord::kFail)
        r.error = std::make_exception_ptr(
            InvalidArgumentError(fmt::format("rank {}: {}", o.rank, bad.what())));
      else
        substitute(e, p, bad.what(), r);
    } catch (...) {
      r.error = std::current_exception();
    }
    if (!r.error && o.decode) {
      try {
        o.decode(r.record);
      } catch (const std::exception& ex) {
        r.error = std::make_exception_ptr(
            InvalidArgumentError(fmt::format("rank {}: decoding {} record {} failed: {}", o.rank,
                                             files[r.record.shard], r.record.index, ex.what())));
      } catch (...) {
        r.error = std::current_exception();
      }
    }
    return r;
  }

  // OnBadRecord::kSkip: notes the bad record and reads, in its place, the first record that
  // reads well after position p of the epoch's order (wrapping), as padding repeats records.
  void substitute(uint64_t e, uint64_t p, const std::string& why, Result& result) {
    result.replaced.push_back(why);
    EpochOrder own(counts, o.seed, e, o.shuffle, o.shuffle_window);
    for (uint64_t step = 1; step < total; ++step) {
      const uint64_t q = (p + step) % total;
      try {
        Record r;
        read(own.at(q), own, r);
        result.record = std::move(r);
        return;
      } catch (const InvalidArgumentError& again) {
        result.replaced.push_back(again.what());
      }
    }
    result.error = std::make_exception_ptr(InvalidArgumentError(
        fmt::format("{}: every record of the epoch failed to read; the first: {}", who(), why)));
  }
};

namespace {

void check_place(int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw InvalidArgumentError(fmt::format(
        "ShardedDataset: rank {} is not in [0, world_size={}); pass the process group's rank() "
        "and size()",
        rank, world_size));
}

void check_drop_last(const ShardedDatasetOptions& o, uint64_t total, int world_size) {
  if (o.drop_last && total < static_cast<uint64_t>(world_size))
    throw InvalidArgumentError(fmt::format(
        "ShardedDataset: drop_last with {} records and {} ranks leaves every rank with nothing",
        total, world_size));
}

}  // namespace

ShardedDataset::ShardedDataset(std::vector<std::string> shards, ShardedDatasetOptions options)
    : impl_(std::make_unique<Impl>()) {
  auto& d = *impl_;
  d.o = std::move(options);
  check_place(d.o.rank, d.o.world_size);
  if (d.o.readers < 1 || d.o.prefetch_records < 1 || d.o.prefetch_bytes < 1)
    throw InvalidArgumentError(fmt::format(
        "ShardedDataset: readers ({}), prefetch_records ({}) and prefetch_bytes ({}) must each "
        "be at least 1",
        d.o.readers, d.o.prefetch_records, d.o.prefetch_bytes));
  d.timeout = d.o.timeout.count() > 0 ? d.o.timeout
                                      : std::chrono::milliseconds(env::get_seconds(env::kTimeout));
  d.files = expand_shards(shards);
  if (d.files.empty()) throw InvalidArgumentError("ShardedDataset: no shard files given");
  d.counts.reserve(d.files.size());
  for (const auto& f : d.files) {
    d.counts.push_back(count_shard_records(f));
    d.total += d.counts.back();
  }
  if (d.total == 0)
    throw InvalidArgumentError(fmt::format(
        "ShardedDataset: the {} files hold no record at all ({} first): there is nothing to "
        "train",
        d.files.size(), d.files.front()));
  check_drop_last(d.o, d.total, d.o.world_size);
  {
    std::lock_guard lock(d.mu);
    d.reset_locked(0, 0);
  }
  for (int i = 0; i < d.o.readers; ++i) d.threads.emplace_back([&d] { d.reader_loop(); });
}

ShardedDataset::~ShardedDataset() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->readers_cv.notify_all();
  for (auto& t : impl_->threads) t.join();
}

bool ShardedDataset::is_padding(uint64_t k) const {
  std::lock_guard lock(impl_->mu);
  const auto& d = *impl_;
  return static_cast<uint64_t>(d.o.rank) + k * static_cast<uint64_t>(d.o.world_size) >= d.left;
}

void ShardedDataset::regroup(int rank, int world_size) {
  auto& d = *impl_;
  check_place(rank, world_size);
  check_drop_last(d.o, d.total, world_size);
  // The readers read the rank in their messages without the lock: they stop while it changes
  // (each finishes the record it reads), then start again on the new dealing.
  {
    std::lock_guard lock(d.mu);
    d.stopping = true;
  }
  d.readers_cv.notify_all();
  for (auto& t : d.threads) t.join();
  d.threads.clear();
  {
    std::lock_guard lock(d.mu);
    d.stopping = false;
    d.o.rank = rank;
    d.o.world_size = world_size;
    d.reset_locked(d.epoch, d.start);
  }
  for (int i = 0; i < d.o.readers; ++i) d.threads.emplace_back([&d] { d.reader_loop(); });
}

void ShardedDataset::set_epoch(uint64_t epoch, uint64_t consumed) {
  {
    std::lock_guard lock(impl_->mu);
    auto& d = *impl_;
    // The same start again before anything was taken (a loop that sets the epoch it is already
    // in): what the readers got ahead is kept.
    if (epoch == d.epoch && std::min(consumed, d.total) == d.start && d.returned == 0) return;
    d.reset_locked(epoch, consumed);
  }
  impl_->readers_cv.notify_all();
}

std::optional<Record> ShardedDataset::next() {
  Record r;
  for (;;) {
    switch (try_next(impl_->timeout, r)) {
      case Fetch::kRecord:
        return r;
      case Fetch::kEnd:
        return std::nullopt;
      case Fetch::kNotYet:
        break;  // the slice ended just before the timeout: the next call throws
    }
  }
}

ShardedDataset::Fetch ShardedDataset::try_next(std::chrono::milliseconds slice, Record& out) {
  auto& d = *impl_;
  std::unique_lock lock(d.mu);
  if (d.returned >= d.num_samples) return Fetch::kEnd;
  const uint64_t k = d.returned;
  const auto now = std::chrono::steady_clock::now();
  if (d.waiting_for != k || d.waiting_generation != d.generation) {
    d.waiting_for = k;
    d.waiting_generation = d.generation;
    d.waiting_since = now;
  }
  const auto deadline = d.waiting_since + d.timeout;
  const auto until = std::min(deadline, now + slice);
  const auto arrived = [&] { return k < d.planned && d.slot(k).done; };
  // A reader that is on it usually finishes within microseconds: yielding until then costs less
  // than sleeping and being woken for every record.
  for (int spins = 0; spins < 64 && !arrived() && k < d.planned; ++spins) {
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  }
  if (!d.consumer_cv.wait_until(lock, until, arrived)) {
    if (std::chrono::steady_clock::now() < deadline) return Fetch::kNotYet;
    throw TimeoutError(fmt::format(
        "{}: record {} of {} of epoch {} did not arrive within {} ms{}: is the file system slow "
        "or hung? (raise ShardedDatasetOptions::timeout or DTRAIN_TIMEOUT)",
        d.who(), k, d.num_samples, d.epoch, d.timeout.count(),
        k < d.planned
            ? fmt::format(" (reading {} record {})", d.files[d.slot(k).shard], d.slot(k).index)
            : std::string(" (no reader has started it)")));
  }
  Impl::Slot& s = d.slot(k);
  Impl::Result r = std::move(s.result);
  s = Impl::Slot{};
  ++d.returned;
  for (auto& why : r.replaced) {
    DTRAIN_LOG_WARN("{}: skipping a bad record (OnBadRecord::kSkip): {}", d.who(), why);
    d.skipped.push_back(std::move(why));
  }
  d.bytes_in_flight -= r.bytes;
  // Readers that wait for room are woken once half of it is free, so that they then read many
  // records per wake-up, not one; and at once when the slot now waited for is theirs (it may
  // exceed the byte budget, and nothing else would wake them).
  const bool wake = (d.returned < d.planned && !d.slot(d.returned).done) ||
                    (d.planned - d.returned) * 2 <= d.o.prefetch_records ||
                    d.bytes_in_flight * 2 <= d.o.prefetch_bytes;
  lock.unlock();
  if (wake) d.readers_cv.notify_all();
  if (r.error) std::rethrow_exception(r.error);
  out = std::move(r.record);
  return Fetch::kRecord;
}

uint64_t ShardedDataset::epoch() const {
  std::lock_guard lock(impl_->mu);
  return impl_->epoch;
}
uint64_t ShardedDataset::size() const { return impl_->total; }
uint64_t ShardedDataset::num_samples() const {
  std::lock_guard lock(impl_->mu);
  return impl_->num_samples;
}
uint64_t ShardedDataset::epoch_start() const {
  std::lock_guard lock(impl_->mu);
  return impl_->start;
}
uint64_t ShardedDataset::consumed(uint64_t taken) const {
  std::lock_guard lock(impl_->mu);
  const auto& d = *impl_;
  taken = std::min(taken, d.num_samples);
  return std::min(d.total, d.start + taken * static_cast<uint64_t>(d.o.world_size));
}
uint64_t ShardedDataset::consumed() const {
  uint64_t taken;
  {
    std::lock_guard lock(impl_->mu);
    taken = impl_->returned;
  }
  return consumed(taken);
}
const std::vector<std::string>& ShardedDataset::shards() const { return impl_->files; }
std::vector<std::string> ShardedDataset::skipped() const {
  std::lock_guard lock(impl_->mu);
  return impl_->skipped;
}

}  // namespace dtrain::data
