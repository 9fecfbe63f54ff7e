// ShardedDataset: record-level assignment (disjoint, complete, equal, reshuffled every epoch,
// blind to file sizes), exactly once across a resume at the same or another world size, ranks in
// real processes, the prefetch bounds, bad records under both policies, and the errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/data/sharded_dataset.h"
#include "dtrain/data/tfrecord.h"
#include "dtrain/error.h"
#include "support/multiproc.h"

namespace dtrain::data {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string temp_dir() {
  auto dir = fs::path(::testing::TempDir()) /
             ("sharded_" + std::to_string(::getpid()) + "_" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// Shards of the given sizes; record j of shard s holds "s:j" padded to `bytes`.
std::vector<std::string> write_shards(const std::string& dir, const std::vector<size_t>& sizes,
                                      size_t bytes = 0) {
  std::vector<std::string> paths;
  for (size_t s = 0; s < sizes.size(); ++s) {
    char name[48];
    std::snprintf(name, sizeof name, "/part-%03zu.tfrecord", s);
    paths.push_back(dir + name);
    TfRecordWriter w(paths.back(), {.sync = false});
    for (size_t j = 0; j < sizes[s]; ++j) {
      std::string r = std::to_string(s) + ":" + std::to_string(j);
      if (r.size() < bytes) r.resize(bytes, '.');
      w.write(r);
    }
    w.close();
  }
  return paths;
}

std::string text_of(const Record& r) {
  std::string t(reinterpret_cast<const char*>(r.bytes.data()), r.bytes.size());
  return t.substr(0, t.find('.'));
}

// Every id rank `rank` of `world` gets in `epoch` (from position `consumed`), checking that
// each record's bytes are the ones its (shard, index) names.
std::vector<uint64_t> ids_of(const std::vector<std::string>& shards, int rank, int world,
                             uint64_t epoch, uint64_t consumed = 0, ShardedDatasetOptions o = {},
                             size_t take = SIZE_MAX) {
  o.rank = rank;
  o.world_size = world;
  if (o.seed == 0) o.seed = 7;
  ShardedDataset data(shards, o);
  data.set_epoch(epoch, consumed);
  std::vector<uint64_t> ids;
  while (ids.size() < take) {
    auto r = data.next();
    if (!r) break;
    EXPECT_EQ(text_of(*r), std::to_string(r->shard) + ":" + std::to_string(r->index));
    ids.push_back(r->id);
  }
  return ids;
}

const std::vector<size_t> kSizes = {1, 50, 0, 7, 200, 3};  // 261 records, one file empty
constexpr uint64_t kTotal = 261;

TEST(ShardedDataset, EveryEpochDealsEveryRecordOnceInEqualShares) {
  const auto shards = write_shards(temp_dir(), kSizes);
  std::map<int, std::vector<uint64_t>> global_order_by_world;
  for (int world : {1, 2, 3, 5, 8}) {
    std::vector<std::vector<uint64_t>> per_rank;
    for (int r = 0; r < world; ++r) per_rank.push_back(ids_of(shards, r, world, 0));
    const size_t each = (kTotal + world - 1) / world;
    std::vector<uint64_t> order;  // the epoch's order: position i is rank i % W's (i / W)-th
    for (size_t i = 0; i < each * world; ++i) {
      ASSERT_EQ(per_rank[i % world].size(), each) << "world " << world;
      order.push_back(per_rank[i % world][i / world]);
    }
    const std::set<uint64_t> first(order.begin(), order.begin() + kTotal);
    EXPECT_EQ(first.size(), kTotal) << "world " << world << ": a record twice or missing";
    EXPECT_EQ(*first.rbegin(), kTotal - 1);
    for (size_t i = kTotal; i < order.size(); ++i)  // padding: the epoch's first records
      EXPECT_EQ(order[i], order[i - kTotal]) << "world " << world;
    order.resize(kTotal);
    global_order_by_world[world] = order;
  }
  // The order is the job's, not the world size's: resizing never changes which record comes
  // when, which is what lets a resumed job continue at another size.
  for (const auto& [world, order] : global_order_by_world)
    EXPECT_EQ(order, global_order_by_world[1]) << "world " << world;
  // Record-level, not file-level: with 8 ranks and one file of 200, every rank gets records of
  // that file, and the big file's records are spread over the epoch, not in one run.
  for (int r = 0; r < 8; ++r) {
    ShardedDatasetOptions o;
    o.rank = r;
    o.world_size = 8;
    o.seed = 7;
    ShardedDataset data(shards, o);
    int from_big = 0;
    while (auto rec = data.next()) from_big += rec->shard == 4;
    EXPECT_GT(from_big, 10) << "rank " << r;
  }
}

TEST(ShardedDataset, EachEpochHasItsOwnOrderAndTheSeedDecidesIt) {
  const auto shards = write_shards(temp_dir(), kSizes);
  const auto e0 = ids_of(shards, 0, 1, 0), e1 = ids_of(shards, 0, 1, 1);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(std::set<uint64_t>(e1.begin(), e1.end()).size(), kTotal);
  EXPECT_EQ(e0, ids_of(shards, 0, 1, 0)) << "the same epoch and seed gave another order";
  ShardedDatasetOptions other;
  other.seed = 8;
  EXPECT_NE(e0, ids_of(shards, 0, 1, 0, 0, other));
  // A small window still shuffles records across the whole epoch through the shard order, and
  // shuffle=false reads the files in order, each from its start.
  ShardedDatasetOptions small;
  small.shuffle_window = 4;
  EXPECT_NE(ids_of(shards, 0, 1, 0, 0, small), ids_of(shards, 0, 1, 1, 0, small));
  ShardedDatasetOptions plain;
  plain.shuffle = false;
  const auto in_order = ids_of(shards, 0, 1, 3, 0, plain);
  for (uint64_t i = 0; i < kTotal; ++i) ASSERT_EQ(in_order[i], i);
}

TEST(ShardedDataset, FewerFilesThanRanksAndDropLast) {
  const auto shards = write_shards(temp_dir(), {5, 6});
  std::multiset<uint64_t> all;
  for (int r = 0; r < 4; ++r) {
    ShardedDatasetOptions o;
    o.drop_last = true;
    const auto ids = ids_of(shards, r, 4, 2, 0, o);
    EXPECT_EQ(ids.size(), 2u);  // floor(11 / 4)
    all.insert(ids.begin(), ids.end());
  }
  EXPECT_EQ(std::set<uint64_t>(all.begin(), all.end()).size(), all.size()) << "a record twice";
  for (int r = 0; r < 4; ++r) EXPECT_EQ(ids_of(shards, r, 4, 2).size(), 3u);  // ceil, padded
}

// Train part of an epoch at one world size, checkpoint its position, resume at another: every
// record of the epoch is trained exactly once (padding aside), and resuming at the same size
// continues exactly as the uninterrupted run would have.
TEST(ShardedDataset, AResumedEpochTrainsEveryRecordOnceAtAnyWorldSize) {
  const auto shards = write_shards(temp_dir(), kSizes);
  for (int before : {3, 4}) {
    for (int after : {1, 2, 3, 5}) {
      std::multiset<uint64_t> trained;
      uint64_t position = 0;
      for (int r = 0; r < before; ++r) {
        ShardedDatasetOptions o;
        o.rank = r;
        o.world_size = before;
        o.seed = 7;
        ShardedDataset data(shards, o);
        data.set_epoch(5);
        for (int t = 0; t < 20; ++t) trained.insert(data.next()->id);
        position = data.consumed();
        EXPECT_EQ(position, data.consumed(20));
      }
      EXPECT_EQ(position, 20u * before);
      std::vector<std::vector<uint64_t>> rest;
      for (int r = 0; r < after; ++r) rest.push_back(ids_of(shards, r, after, 5, position));
      const uint64_t left = kTotal - position;
      for (uint64_t i = 0; i < left; ++i) trained.insert(rest[i % after][i / after]);
      std::set<uint64_t> once(trained.begin(), trained.end());
      EXPECT_EQ(once.size(), kTotal) << before << " -> " << after << ": a record missing";
      EXPECT_EQ(trained.size(), kTotal) << before << " -> " << after << ": a record twice";
      if (after == before) {
        for (int r = 0; r < after; ++r) {
          const auto whole = ids_of(shards, r, after, 5);
          EXPECT_EQ(std::vector<uint64_t>(whole.begin() + 20, whole.end()), rest[r]);
        }
      }
    }
  }
}

// Live recovery: rank 1 of 3 is lost after 20 records each; the survivors regroup their open
// datasets as ranks 0 and 1 of 2 and take the rest of the epoch, exactly what fresh datasets of a
// 2-rank world would take: every record of the epoch once. A bad place is refused.
TEST(ShardedDataset, RegroupedSurvivorsTakeTheRestOfTheEpochOnce) {
  const auto shards = write_shards(temp_dir(), kSizes);
  std::vector<std::unique_ptr<ShardedDataset>> ranks;
  std::multiset<uint64_t> trained;
  for (int r = 0; r < 3; ++r) {
    ShardedDatasetOptions o;
    o.rank = r;
    o.world_size = 3;
    o.seed = 7;
    o.prefetch_records = 8;  // reading ahead when the world changes
    ranks.push_back(std::make_unique<ShardedDataset>(shards, o));
    ranks.back()->set_epoch(5);
    for (int t = 0; t < 20; ++t) trained.insert(ranks.back()->next()->id);
  }
  const uint64_t position = ranks[0]->consumed();
  ASSERT_EQ(position, 60u);
  ranks.erase(ranks.begin() + 1);
  EXPECT_THROW(ranks[0]->regroup(2, 2), InvalidArgumentError);
  std::vector<std::vector<uint64_t>> rest(2);
  for (int r = 0; r < 2; ++r) {
    ranks[r]->regroup(r, 2);
    ranks[r]->set_epoch(5, position);
    while (auto record = ranks[r]->next()) {
      EXPECT_EQ(text_of(*record), std::to_string(record->shard) + ":" +
                                      std::to_string(record->index));
      rest[r].push_back(record->id);
    }
    EXPECT_EQ(rest[r], ids_of(shards, r, 2, 5, position)) << "rank " << r;
  }
  // 201 records left: rank 1's last pads.
  EXPECT_FALSE(ranks[0]->is_padding(100));
  EXPECT_TRUE(ranks[1]->is_padding(100));
  EXPECT_FALSE(ranks[1]->is_padding(99));
  for (uint64_t i = 0; i < kTotal - position; ++i) trained.insert(rest[i % 2][i / 2]);
  EXPECT_EQ(std::set<uint64_t>(trained.begin(), trained.end()).size(), kTotal);
  EXPECT_EQ(trained.size(), kTotal);
}

// Ranks as separate processes, reading the same files at once: together they cover the epoch.
TEST(ShardedDataset, RanksInSeparateProcessesCoverTheEpoch) {
  const std::string dir = temp_dir();
  const auto shards = write_shards(dir, kSizes, 300);
  const int world = 3;
  auto results = testing::run_ranks(world, [&](int rank) {
    std::ofstream out(dir + "/rank" + std::to_string(rank) + ".ids");
    for (uint64_t id : ids_of(shards, rank, world, 1)) out << id << "\n";
  });
  for (auto& r : results) ASSERT_TRUE(r.ok());
  std::vector<std::vector<uint64_t>> per_rank(world);
  for (int r = 0; r < world; ++r) {
    std::ifstream in(dir + "/rank" + std::to_string(r) + ".ids");
    for (uint64_t id; in >> id;) per_rank[r].push_back(id);
    EXPECT_EQ(per_rank[r].size(), 87u);
  }
  std::set<uint64_t> all;
  for (auto& ids : per_rank) all.insert(ids.begin(), ids.end());
  EXPECT_EQ(all.size(), kTotal);
  EXPECT_EQ(per_rank[1], ids_of(shards, 1, world, 1));  // the same in one process
}

TEST(ShardedDataset, ReadingAheadStaysWithinItsBounds) {
  const auto shards = write_shards(temp_dir(), {40, 40}, 1000);
  struct Case {
    size_t records, bytes;
    size_t most;  // records decoded but not yet taken, at most
  };
  // +1: the slot next() waits for may exceed the bytes; +1: `taken` counts a beat late.
  for (const Case c : {Case{100, 5000, 5 + 1 + 1}, Case{3, size_t{1} << 30, 3 + 1}}) {
    std::atomic<int> decoded{0}, taken{0}, most{0};
    ShardedDatasetOptions o;
    o.readers = 4;
    o.prefetch_records = c.records;
    o.prefetch_bytes = c.bytes;
    o.decode = [&](Record&) {
      const int ahead = ++decoded - taken.load();
      int m = most.load();
      while (ahead > m && !most.compare_exchange_weak(m, ahead)) {
      }
    };
    ShardedDataset data(shards, o);
    std::this_thread::sleep_for(100ms);  // let the readers fill what they may
    while (data.next()) {
      ++taken;
      std::this_thread::sleep_for(1ms);
    }
    EXPECT_EQ(taken.load(), 80);
    EXPECT_LE(static_cast<size_t>(most.load()), c.most)
        << "read ahead " << most.load() << " records of 1000 bytes with prefetch_records "
        << c.records << ", prefetch_bytes " << c.bytes;
    EXPECT_GE(most.load(), 2) << "no reading ahead at all";
  }
}

TEST(ShardedDataset, ABadRecordFailsOrIsReplacedAndListed) {
  const std::string dir = temp_dir();
  const auto shards = write_shards(dir, {30, 30});
  const TfRecordFile f(shards[1]);
  {  // damage record 4 of the second file (global id 34): one byte of its data
    std::fstream io(shards[1], std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(f.offset(4) + 13));
    io.put('#');
  }
  ShardedDatasetOptions o;
  o.shuffle = false;
  {
    ShardedDataset data(shards, o);
    for (int i = 0; i < 34; ++i) ASSERT_EQ(data.next()->id, static_cast<uint64_t>(i));
    try {
      data.next();
      FAIL() << "a damaged record was returned";
    } catch (const InvalidArgumentError& e) {
      const std::string text = e.what();
      EXPECT_NE(text.find("rank 0: TFRecord file " + shards[1] + ": record 4 at byte " +
                          std::to_string(f.offset(4))),
                std::string::npos)
          << text;
    }
    EXPECT_EQ(data.next()->id, 35u);  // the records after it still come
  }
  o.on_bad_record = OnBadRecord::kSkip;
  ShardedDataset data(shards, o);
  std::vector<uint64_t> ids;
  while (auto r = data.next()) ids.push_back(r->id);
  ASSERT_EQ(ids.size(), 60u) << "skipping changed the rank's count";
  EXPECT_EQ(ids[34], 35u);  // replaced by the next good record of the epoch
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 34u), 0);
  ASSERT_EQ(data.skipped().size(), 1u);
  EXPECT_NE(data.skipped()[0].find("record 4 at byte"), std::string::npos) << data.skipped()[0];
}

TEST(ShardedDataset, DecodeErrorsAndSlowReadsAreNamed) {
  const auto shards = write_shards(temp_dir(), {10});
  ShardedDatasetOptions o;
  o.shuffle = false;
  o.decode = [](Record& r) {
    if (r.index == 3) throw std::runtime_error("bad label");
    r.value = static_cast<int>(r.index);
  };
  {
    ShardedDataset data(shards, o);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(std::any_cast<int>(data.next()->value), i);
    try {
      data.next();
      FAIL() << "the decode error was lost";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0: decoding " + shards[0] +
                                           " record 3 failed: bad label"),
                std::string::npos)
          << e.what();
    }
  }
  o.readers = 1;
  o.timeout = 300ms;
  o.decode = [](Record& r) {
    if (r.index == 1) std::this_thread::sleep_for(1500ms);
  };
  ShardedDataset data(shards, o);
  data.next();
  try {
    data.next();
    FAIL() << "next() waited past its limit";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("did not arrive within 300 ms (reading " + shards[0] +
                                         " record 1)"),
              std::string::npos)
        << e.what();
  }
}

// TensorFlow's gzip'd TFRecord files: decompressed into a temporary file when opened, then read
// like any other; a damaged gzip stream is named.
TEST(ShardedDataset, GzipCompressedShardsReadLikeOthers) {
  const std::string dir = temp_dir();
  const auto plain = write_shards(dir, {30, 12});
  ASSERT_EQ(std::system(("gzip -k " + plain[1] + " && mv " + plain[1] + ".gz " + dir +
                         "/zipped.tfrecord").c_str()),
            0);
  ShardedDatasetOptions o;
  o.shuffle = false;
  ShardedDataset mixed({plain[0], dir + "/zipped.tfrecord"}, o);
  ASSERT_EQ(mixed.size(), 42u);
  for (uint64_t i = 0; i < 42; ++i) {
    const auto r = mixed.next();
    ASSERT_EQ(text_of(*r), i < 30 ? "0:" + std::to_string(i) : "1:" + std::to_string(i - 30));
  }
  fs::resize_file(dir + "/zipped.tfrecord", fs::file_size(dir + "/zipped.tfrecord") - 9);
  try {
    ShardedDataset cut({dir + "/zipped.tfrecord"}, o);
    FAIL() << "a cut gzip stream was read";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/zipped.tfrecord: the gzip stream ends early"),
              std::string::npos)
        << e.what();
  }
}

TEST(ShardedDataset, PatternsManifestsAndEmptyInputs) {
  const std::string dir = temp_dir();
  write_shards(dir, {2, 3, 4});
  ShardedDatasetOptions o;
  EXPECT_EQ(ShardedDataset({dir + "/part-*.tfrecord"}, o).size(), 9u);
  std::ofstream(dir + "/list.txt") << "# the training set\npart-002.tfrecord\n\n" << dir
                                   << "/part-000.tfrecord\n";
  ShardedDataset listed({"@" + dir + "/list.txt"}, o);
  EXPECT_EQ(listed.size(), 6u);
  EXPECT_EQ(listed.shards()[0], dir + "/part-002.tfrecord");
  auto refusal = [&](std::vector<std::string> shards, ShardedDatasetOptions opts = {}) {
    try {
      ShardedDataset d(shards, opts);
    } catch (const InvalidArgumentError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(refusal({dir + "/nothing-*.tfrecord"}).find("no file matches"), std::string::npos);
  EXPECT_NE(refusal({"@" + dir + "/missing.txt"}).find("cannot read the manifest"),
            std::string::npos);
  TfRecordWriter(dir + "/empty.tfrecord").close();
  EXPECT_NE(refusal({dir + "/empty.tfrecord"}).find("hold no record at all"), std::string::npos);
  ShardedDatasetOptions bad;
  bad.rank = 3;
  bad.world_size = 2;
  EXPECT_NE(refusal({dir + "/part-000.tfrecord"}, bad).find("rank 3 is not in [0, world_size=2)"),
            std::string::npos);
}

}  // namespace
}  // namespace dtrain::data
