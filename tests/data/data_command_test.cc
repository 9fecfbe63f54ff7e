// `dtrain data`: shards written from a folder and from Fashion-MNIST, read back record for
// record, checked by `inspect` (a damaged file named, exit 1), and indexed after the fact.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "dtrain/data/fashion_mnist.h"
#include "dtrain/data/sharded_dataset.h"
#include "dtrain/data/tfrecord.h"
#include "launch/command.h"

namespace dtrain::data {
namespace {

namespace fs = std::filesystem;

const std::string kDtrain = std::string(DTRAIN_BIN_DIR) + "/dtrain";

testing::CommandResult dtrain(std::vector<std::string> args) {
  args.insert(args.begin(), kDtrain);
  return testing::run_command(args);
}

std::string bytes_of(const Record& r) {
  return std::string(reinterpret_cast<const char*>(r.bytes.data()), r.bytes.size());
}

TEST(DataCommand, WritesInspectsAndIndexesShardsOfAFolder) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("data_cmd_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "in" / "sub");
  const std::vector<std::pair<std::string, std::string>> files = {
      {"a.txt", "alpha"},
      {"b.bin", std::string("\0\1\2", 3)},
      {"sub/c", ""},
      {"sub/d", "delta"},
      {"z", std::string(5000, 'z')}};
  for (const auto& [name, content] : files)
    std::ofstream(dir / "in" / name, std::ios::binary) << content;

  // WebDataset tar by default: a sample per key, each file a part named by its extension.
  auto r = dtrain({"data", "write", "--from", (dir / "in").string(), "--out",
                   (dir / "out" / "samples").string(), "--shards", "2"});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  EXPECT_NE(r.output.find("wrote 5 records in 2 shards"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("classes"), std::string::npos) << "not every file is in a folder";
  {
    ShardedDatasetOptions o;
    o.shuffle = false;
    ShardedDataset data({(dir / "out" / "samples-*.tar").string()}, o);
    const std::vector<std::pair<std::string, std::string>> keys = {
        {"a", "txt"}, {"b", "bin"}, {"sub/c", ""}, {"sub/d", ""}, {"z", ""}};
    for (size_t i = 0; i < files.size(); ++i) {
      const Record rec = *data.next();
      EXPECT_EQ(rec.key, keys[i].first);
      ASSERT_EQ(rec.parts.size(), 1u) << rec.key;
      EXPECT_EQ(rec.parts[0].name, keys[i].second);
      EXPECT_EQ(bytes_of(rec), files[i].second) << rec.key;
    }
  }

  // TFRecord: one tf.train.Example per sample, holding the file's bytes (tests/python/test_data.py
  // parses them with TensorFlow).
  r = dtrain({"data", "write", "--from", (dir / "in").string(), "--format", "tfrecord", "--out",
              (dir / "out" / "files").string(), "--shards", "2"});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  EXPECT_NE(r.output.find("wrote 5 records in 2 shards"), std::string::npos) << r.output;
  const std::string pattern = (dir / "out" / "files-*.tfrecord").string();
  ShardedDatasetOptions o;
  o.shuffle = false;
  ShardedDataset data({pattern}, o);
  for (const auto& [name, content] : files)
    EXPECT_NE(bytes_of(*data.next()).find(content), std::string::npos) << name;

  r = dtrain({"data", "inspect", pattern});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  EXPECT_NE(r.output.find("2 files, 5 records"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("every check passed"), std::string::npos) << r.output;

  // One damaged byte: inspect names the file and the record, and fails.
  const std::string second = (dir / "out" / "files-00001-of-00002.tfrecord").string();
  {
    std::fstream io(second, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(14);
    io.put('#');
  }
  r = dtrain({"data", "inspect", pattern});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("TFRecord file " + second + ": record 0 at byte 0"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("1 damaged"), std::string::npos) << r.output;
  // The way around it in the words of the Python and C++ APIs, not only C++'s enum.
  EXPECT_NE(r.output.find("on_bad_record=\"skip\") in Python, OnBadRecord::kSkip in C++"),
            std::string::npos)
      << r.output;

  // An index for a file without one.
  const std::string first = (dir / "out" / "files-00000-of-00002.tfrecord").string();
  fs::remove(first + ".index");
  EXPECT_FALSE(TfRecordFile(first).indexed());
  r = dtrain({"data", "index", first});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  EXPECT_TRUE(TfRecordFile(first).indexed());

  // Mistakes, each one line and a non-zero exit.
  r = dtrain({"data", "write", "--from", (dir / "in").string(), "--out", (dir / "x").string(),
              "--shards", "9"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--shards 9 for 5 records"), std::string::npos) << r.output;
  r = dtrain({"data", "write", "--out", (dir / "x").string()});
  EXPECT_NE(r.output.find("give exactly one source"), std::string::npos) << r.output;
  r = dtrain({"data", "write", "--from", (dir / "in").string(), "--out", (dir / "x").string(),
              "--format", "zip"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("zip"), std::string::npos) << r.output;
  r = dtrain({"data", "inspect", (dir / "none-*").string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("no file matches"), std::string::npos) << r.output;
}

// An image folder: the first-level folders are the classes (as torchvision's ImageFolder), kept
// as each sample's "cls" part and named in PREFIX.classes.txt; a sample's files stay together.
TEST(DataCommand, AnImageFolderKeepsItsNamesAndItsClasses) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("data_cls_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::vector<std::pair<std::string, std::string>> files = {
      {"dog/b/0002.jpg", "woof"}, {"cat/0001.jpg", "meow"}, {"cat/0001.json", "{}"},
      {"dog/0003.jpg", "wuff"},   {"dog/0004.jpg", "grr"},  {"dog/0004.cls", "7"}};
  for (const auto& [name, content] : files) {
    fs::create_directories((dir / "in" / name).parent_path());
    std::ofstream(dir / "in" / name, std::ios::binary) << content;
  }
  auto r = dtrain(
      {"data", "write", "--from", (dir / "in").string(), "--out", (dir / "out" / "pets").string()});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  EXPECT_NE(r.output.find("2 classes from the first-level folders (cat=0, dog=1)"),
            std::string::npos)
      << r.output;
  std::ifstream names(dir / "out" / "pets.classes.txt");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(names), {}), "cat\ndog\n");
  ShardedDatasetOptions o;
  o.shuffle = false;
  ShardedDataset data({(dir / "out" / "pets-*.tar").string()}, o);
  ASSERT_EQ(data.size(), 4u);
  const std::vector<std::pair<std::string, std::map<std::string, std::string>>> want = {
      {"cat/0001", {{"jpg", "meow"}, {"json", "{}"}, {"cls", "0"}}},
      {"dog/0003", {{"jpg", "wuff"}, {"cls", "1"}}},
      {"dog/0004", {{"jpg", "grr"}, {"cls", "7"}}},  // its own label stays
      {"dog/b/0002", {{"jpg", "woof"}, {"cls", "1"}}}};
  for (const auto& [key, parts] : want) {
    const Record rec = *data.next();
    EXPECT_EQ(rec.key, key);
    std::map<std::string, std::string> got;
    for (const auto& p : rec.parts) got[p.name] = bytes_of(rec).substr(p.offset, p.size);
    EXPECT_EQ(got, parts) << key;
  }
}

TEST(DataCommand, FashionMnistRecordsAreTheLabelThenThePixels) {
  if (!fs::exists(std::string(kFashionMnistDir) + "/t10k-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("data_fmnist_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto r = dtrain({"data", "write", "--fashion-mnist", "--split", "test", "--out",
                   (dir / "t10k").string(), "--shards", "3"});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  const FashionMnistBytes raw = read_fashion_mnist(kFashionMnistDir, /*train=*/false);
  ShardedDatasetOptions o;
  o.shuffle = false;
  ShardedDataset data({(dir / "t10k-*.tfrecord").string()}, o);
  ASSERT_EQ(data.size(), 10000u);
  for (size_t i = 0; i < 10000; ++i) {
    const Record rec = *data.next();
    ASSERT_EQ(rec.bytes.size(), 785u);
    ASSERT_EQ(std::to_integer<uint8_t>(rec.bytes[0]), raw.labels[i]) << "record " << i;
    ASSERT_EQ(std::memcmp(rec.bytes.data() + 1, raw.images.data() + i * 784, 784), 0) << i;
  }
}

}  // namespace
}  // namespace dtrain::data
