// ShardedDataset: a training set kept as many shard files (on a shared file system, or copied to
// every machine), dealt out to the ranks of a job record by record. Files named *.tar are
// WebDataset shards (a record is a sample: the members that share a key); others are TFRecord.
//
//   dtrain::data::ShardedDatasetOptions o;
//   o.rank = pg->rank(); o.world_size = pg->size(); o.seed = 42;
//   o.decode = [](dtrain::data::Record& r) { r.value = parse(r.bytes); };  // on reader threads
//   dtrain::data::ShardedDataset data({"/data/train-*.tfrecord"}, o);
//   for (epoch ...) {
//     data.set_epoch(epoch);
//     while (auto record = data.next()) ... train on record->value ...
//   }
//
// Every epoch visits the records in an order drawn from (seed, epoch) that all ranks compute
// alike without talking (src/data/epoch_order.h: the shards shuffled, then windows of
// `shuffle_window` records shuffled), and rank r of W takes positions r, r + W, r + 2W, ... of
// it: record-level assignment, so ranks get equal counts whatever the files' sizes and however
// few files there are. As DistributedSampler does, the last positions are padded with the
// epoch's first records (or cut, with drop_last) so that every rank gets the same count.
//
// Each rank reads only its own records (through each TFRecord file's index, `<file>.index`, or a
// tar file's headers, read when it is opened), on `readers` background threads that read and
// decode ahead of the training loop, never more than `prefetch_records` records or
// `prefetch_bytes` bytes at a time; next() hands them out in order.
//
// Exactly once across restarts: once every rank has taken t records, the job has consumed the
// first t * W positions of the epoch's order, whoever took which. consumed(t) gives that
// position for a checkpoint; set_epoch(epoch, consumed) deals out the rest, on any number of
// ranks, so every record of the epoch is trained once even when the job resumes with another
// world size.
//
// A bad record (a checksum that does not match, a truncated or unreadable file) fails next()
// with an error naming the file, the record and its byte offset (OnBadRecord::kFail), or
// (kSkip) is replaced by another record of the epoch, as padding is, so that every rank keeps
// its count, and is listed by skipped().
#pragma once

#include <any>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::data {

struct Record {
  std::vector<std::byte> bytes;
  size_t shard = 0;    // which file: an index into ShardedDataset::shards()
  uint64_t index = 0;  // the record's number in that file
  uint64_t id = 0;     // global id: the files in the order of shards(), their records in turn
  // Tar shards: the sample's key ("train/0001") and its files, one after the other in `bytes`
  // ({"jpg", 0, 5123}, {"cls", 5123, 1}). Empty for TFRecord.
  struct Part {
    std::string name;
    size_t offset = 0;
    size_t size = 0;
  };
  std::string key;
  std::vector<Part> parts;
  std::any value;  // what the decode function made of the record
};

enum class OnBadRecord { kFail, kSkip };

struct ShardedDatasetOptions {
  int rank = 0;
  int world_size = 1;
  uint64_t seed = 0;
  bool shuffle = true;
  uint64_t shuffle_window = 8192;  // records shuffled together (4 bytes each while in use)
  bool drop_last = false;          // cut the epoch to a multiple of world_size instead of padding
  int readers = 2;                 // background threads that read and decode
  size_t prefetch_records = 256;   // records read ahead of next(), at most
  size_t prefetch_bytes = size_t{64} << 20;  // and at most this many bytes of them
  OnBadRecord on_bad_record = OnBadRecord::kFail;
  std::function<void(Record&)> decode;   // runs on the reader threads; may throw
  std::chrono::milliseconds timeout{0};  // next() waits at most this; 0 = DTRAIN_TIMEOUT
  size_t open_files = 64;                // shard files kept open (with their indexes) at once
};

// next(), try_next() and set_epoch() belong to one thread (the training loop's); the readers
// are the dataset's own threads.
class ShardedDataset {
 public:
  // `shards`: paths, glob patterns ("data/train-*.tfrecord", expanded in sorted order) and
  // manifests ("@list.txt": one path or pattern per line), in the order that defines global ids.
  // Every rank must pass the same list. Reads each file's record count (from its index, or by
  // scanning it); throws InvalidArgumentError when a pattern matches nothing, a file cannot be
  // read, or the files hold no record at all.
  ShardedDataset(std::vector<std::string> shards, ShardedDatasetOptions options);
  ~ShardedDataset();
  ShardedDataset(const ShardedDataset&) = delete;
  ShardedDataset& operator=(const ShardedDataset&) = delete;

  // Starts `epoch` from position `consumed` of its order (0: the whole epoch), dropping what
  // was read ahead for the previous one.
  void set_epoch(uint64_t epoch, uint64_t consumed = 0);
  // Makes this dataset rank `rank` of `world_size` (live recovery: the world changed, the files
  // stay open); what was read ahead is dropped. set_epoch(epoch, consumed) must follow, with the
  // position every rank agreed on. Throws InvalidArgumentError as the constructor does.
  void regroup(int rank, int world_size);
  // This rank's next record of the epoch, or nullopt at its end. Throws the reader's error for
  // a bad record (OnBadRecord::kFail) or a failed decode, and TimeoutError when nothing arrives
  // within the timeout, naming the file being read.
  std::optional<Record> next();
  // next() in slices, for callers that must look at something else while they wait (Python's
  // Ctrl-C): waits at most `slice`; kNotYet means call again (the timeout runs from the first
  // call for the record, and the TimeoutError comes from a call like next()'s).
  enum class Fetch { kRecord, kNotYet, kEnd };
  Fetch try_next(std::chrono::milliseconds slice, Record& out);

  uint64_t epoch() const;
  uint64_t size() const;         // records in all the files
  uint64_t num_samples() const;  // this rank's records in this (rest of the) epoch
  uint64_t epoch_start() const;  // the `consumed` set_epoch started from
  // The epoch's position once every rank has taken `taken` records of it (never more than
  // size()); consumed() uses the number next() has returned on this rank.
  uint64_t consumed(uint64_t taken) const;
  uint64_t consumed() const;
  // Whether this rank's k-th record of the (rest of the) epoch only pads it to equal counts per
  // rank (one of the epoch's first records again), as DistributedSampler::is_padding.
  bool is_padding(uint64_t k) const;
  const std::vector<std::string>& shards() const;
  // "FILE: record N at byte B: what" for each bad record replaced so far (OnBadRecord::kSkip).
  std::vector<std::string> skipped() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Expands paths, globs and @manifests into the list of files, in order (what the constructor
// reads). Throws InvalidArgumentError for a pattern that matches nothing or an unreadable
// manifest.
std::vector<std::string> expand_shards(const std::vector<std::string>& patterns);

}  // namespace dtrain::data
