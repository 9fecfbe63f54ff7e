// TarWriter: what it writes, GNU tar extracts byte for byte (names past ustar's 100 and 255
// bytes included) and TarShard reads back as the same samples; a writer destroyed before close()
// leaves no file behind.
#include "data/tar_writer.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "data/tar_shard.h"
#include "dtrain/error.h"

namespace dtrain::data {
namespace {

namespace fs = std::filesystem;

fs::path scratch() {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       ("tar_writer_" + std::to_string(::getpid()) + "_" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(TarWriter, GnuTarExtractsWhatItWroteAndTarShardReadsTheSamples) {
  const fs::path dir = scratch();
  // 150 bytes: ustar splits it into a prefix and a name; 300 bytes: only pax can hold it.
  const std::string split = std::string(100, 'p') + "/" + std::string(40, 'n') + "/0002";
  const std::string pax = std::string(150, 'q') + "/" + std::string(140, 'r') + "/0003";
  const std::vector<std::pair<std::string, std::string>> members = {
      {"a/0001.jpg", std::string(512, 'j')},  // exactly one block
      {"a/0001.cls", "3"},
      {split + ".txt", std::string(1000, 't')},
      {pax + ".seg.png", ""},
      {pax + ".json", "{}"}};
  {
    TarWriter out((dir / "s.tar").string());
    for (const auto& [name, data] : members) out.add(name, data);
    EXPECT_EQ(out.members(), members.size());
    out.close();
  }
  EXPECT_FALSE(fs::exists(dir / "s.tar.tmp"));

  fs::create_directories(dir / "x");
  const std::string cmd = "tar -xf " + (dir / "s.tar").string() + " -C " + (dir / "x").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  for (const auto& [name, data] : members) EXPECT_EQ(read_file(dir / "x" / name), data) << name;

  const TarShard shard((dir / "s.tar").string());
  ASSERT_EQ(shard.size(), 3u);
  const std::vector<std::string> keys = {"a/0001", split, pax};
  const std::vector<std::vector<std::string>> parts = {
      {"jpg", "cls"}, {"txt"}, {"seg.png", "json"}};
  size_t m = 0;
  for (size_t i = 0; i < shard.size(); ++i) {
    Record r;
    shard.read(i, r);
    EXPECT_EQ(r.key, keys[i]);
    ASSERT_EQ(r.parts.size(), parts[i].size());
    for (size_t p = 0; p < r.parts.size(); ++p, ++m) {
      EXPECT_EQ(r.parts[p].name, parts[i][p]);
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(r.bytes.data()) + r.parts[p].offset,
                            r.parts[p].size),
                members[m].second);
    }
  }
}

TEST(TarWriter, AWriterDestroyedBeforeCloseLeavesNoFile) {
  const fs::path dir = scratch();
  {
    TarWriter out((dir / "s.tar").string());
    out.add("a/0001.txt", "x");
  }
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(TarWriter, NamesATarCannotHoldAreRefused) {
  const fs::path dir = scratch();
  TarWriter out((dir / "s.tar").string());
  EXPECT_THROW(out.add("", "x"), InvalidArgumentError);
  EXPECT_THROW(out.add("a/", "x"), InvalidArgumentError);
  EXPECT_THROW(out.add(std::string("a\0b", 3), "x"), InvalidArgumentError);
}

}  // namespace
}  // namespace dtrain::data
