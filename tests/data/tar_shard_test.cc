// WebDataset-style tar shards, as GNU tar writes them (its gnu and pax formats, long names
// included): samples grouped by key, their parts read back exactly, dealt by ShardedDataset like
// TFRecord records, and damage named with the file and the member's byte offset.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "data/tar_shard.h"
#include "dtrain/data/sharded_dataset.h"
#include "dtrain/error.h"

namespace dtrain::data {
namespace {

namespace fs = std::filesystem;

struct Folder {
  fs::path dir;
  std::vector<std::string> names;  // in the order they go into the archive
};

const std::string kLong = "a-rather-long-folder-name-that-ustar-alone-cannot-hold/and-another-one-"
                          "to-pass-the-hundred-bytes/sample-0004";

// Four samples: two with jpg and cls, one with a two-dot part, one under a long path.
Folder make_folder() {
  Folder f;
  f.dir = fs::path(::testing::TempDir()) / ("tar_" + std::to_string(::getpid()) + "_" +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(f.dir);
  const std::vector<std::pair<std::string, std::string>> files = {
      {"train/0001.jpg", std::string(700, 'j')}, {"train/0001.cls", "3"},
      {"train/0002.jpg", "jj"},                  {"train/0002.cls", "7"},
      {"train/0003.seg.png", std::string(1500, 's')},
      {kLong + ".txt", "long"},                  {kLong + ".cls", "1"}};
  for (const auto& [name, content] : files) {
    fs::create_directories((f.dir / "src" / name).parent_path());
    std::ofstream(f.dir / "src" / name, std::ios::binary) << content;
    f.names.push_back(name);
  }
  return f;
}

std::string tar(const Folder& f, const std::string& format) {
  const std::string out = (f.dir / ("shard-" + format + ".tar")).string();
  std::string cmd = "tar --format=" + format + " -cf " + out + " -C " + (f.dir / "src").string();
  for (const auto& n : f.names) cmd += " " + n;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return out;
}

std::map<std::string, std::string> parts_of(const Record& r) {
  std::map<std::string, std::string> parts;
  for (const auto& p : r.parts)
    parts[p.name] = std::string(reinterpret_cast<const char*>(r.bytes.data()) + p.offset, p.size);
  return parts;
}

TEST(TarShard, SamplesAreGroupedByKeyAndReadBack) {
  const Folder f = make_folder();
  for (const std::string format : {"gnu", "pax", "ustar"}) {
    if (format == "ustar") continue;  // ustar cannot hold the long name: tar refuses it
    const TarShard shard(tar(f, format));
    ASSERT_EQ(shard.size(), 4u) << format;
    Record r;
    shard.read(0, r);
    EXPECT_EQ(r.key, "train/0001");
    EXPECT_EQ(parts_of(r), (std::map<std::string, std::string>{{"jpg", std::string(700, 'j')},
                                                               {"cls", "3"}}));
    EXPECT_EQ(shard.data_bytes(0), 701u);
    shard.read(2, r);
    EXPECT_EQ(r.key, "train/0003");
    EXPECT_EQ(parts_of(r), (std::map<std::string, std::string>{{"seg.png", std::string(1500, 's')}}));
    shard.read(3, r);
    EXPECT_EQ(r.key, kLong) << format;
    EXPECT_EQ(parts_of(r), (std::map<std::string, std::string>{{"txt", "long"}, {"cls", "1"}}));
  }
}

TEST(TarShard, ShardedDatasetDealsTarSamplesLikeRecords) {
  const Folder f = make_folder();
  const std::string a = tar(f, "gnu"), b = tar(f, "pax");
  std::multiset<uint64_t> ids;
  for (int rank = 0; rank < 3; ++rank) {
    ShardedDatasetOptions o;
    o.rank = rank;
    o.world_size = 3;
    o.seed = 4;
    o.drop_last = true;
    ShardedDataset data({a, b}, o);
    EXPECT_EQ(data.size(), 8u);
    while (auto r = data.next()) {
      ids.insert(r->id);
      EXPECT_EQ(r->key, r->index == 3 ? kLong : "train/000" + std::to_string(r->index + 1));
      EXPECT_FALSE(r->parts.empty());
    }
  }
  EXPECT_EQ(ids.size(), 6u);  // floor(8 / 3) each
  EXPECT_EQ(std::set<uint64_t>(ids.begin(), ids.end()).size(), 6u);
}

TEST(TarShard, DamageIsNamedWithTheFileAndTheMembersOffset) {
  const Folder f = make_folder();
  const std::string path = tar(f, "gnu");
  auto refusal = [](const std::string& p) {
    try {
      TarShard shard(p);
    } catch (const InvalidArgumentError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  // The second member's header (after the first's 512-byte header and 2 blocks of data).
  const std::string flipped = f.dir / "flipped.tar";
  fs::copy_file(path, flipped);
  {
    std::fstream io(flipped, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(512 * 3 + 20);
    io.put('!');
  }
  std::string text = refusal(flipped);
  EXPECT_NE(text.find("tar file " + flipped + ": the member at byte 1536: its header checksum "
                      "does not match"),
            std::string::npos)
      << text;
  // Cut inside the first member's data.
  const std::string cut = f.dir / "cut.tar";
  fs::copy_file(path, cut);
  fs::resize_file(cut, 512 + 100);
  text = refusal(cut);
  EXPECT_NE(text.find("the member at byte 0: it claims 700 bytes but the file ends 100 bytes "
                      "later (truncated)"),
            std::string::npos)
      << text;
  EXPECT_NE(refusal((f.dir / "missing.tar").string()).find("No such file"), std::string::npos);
  // A pax header whose size is past the end of the file (the fuzzer's find: that size was
  // trusted, and the sample's buffer sized from it).
  auto header = [](char type, const std::string& name, size_t size) {
    std::string h(512, '\0');
    h.replace(0, name.size(), name);
    std::snprintf(h.data() + 124, 12, "%011zo", size);
    h[156] = type;
    std::memcpy(h.data() + 257, "ustar", 5);
    std::memset(h.data() + 148, ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : h) sum += c;
    std::snprintf(h.data() + 148, 8, "%06o", sum);
    return h;
  };
  const std::string record = "19 size=1000000000\n";  // 19 bytes, as its length says
  const std::string pax = (f.dir / "pax_size.tar").string();
  std::ofstream(pax, std::ios::binary)
      << header('x', "pax", record.size()) + record + std::string(512 - record.size(), '\0') +
             header('0', "a.txt", 3) + "abc" + std::string(509 + 1024, '\0');
  text = refusal(pax);
  EXPECT_NE(text.find("the member at byte 0: it claims 1000000000 bytes but the file ends"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace dtrain::data
