// TFRecord files: the checksum against published values, files that round-trip, and every kind of
// damage named with the file, the record and its byte offset.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "data/crc32c.h"
#include "dtrain/data/tfrecord.h"
#include "dtrain/error.h"

namespace dtrain::data {
namespace {

namespace fs = std::filesystem;

std::string temp_dir() {
  auto dir = fs::path(::testing::TempDir()) /
             ("tfrecord_" + std::to_string(::getpid()) + "_" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string record_text(size_t i) { return "record " + std::to_string(i) + std::string(i % 7, 'x'); }

std::string write_file(const std::string& path, size_t n, TfRecordWriterOptions o = {}) {
  TfRecordWriter w(path, o);
  for (size_t i = 0; i < n; ++i) w.write(record_text(i));
  w.close();
  return path;
}

std::string as_string(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

// How errors name a record: "TFRecord file F: record I at byte B".
std::string fmt_record(const std::string& path, size_t record, uint64_t offset) {
  return "TFRecord file " + path + ": record " + std::to_string(record) + " at byte " +
         std::to_string(offset);
}

// The error text of f(), which must throw InvalidArgumentError.
template <typename F>
std::string refusal(F f) {
  try {
    f();
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InvalidArgumentError";
  return "";
}

TEST(Crc32c, MatchesThePublishedCheckValues) {
  // RFC 3720 (iSCSI) B.4 and the usual "123456789" check value.
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8a9136aau);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62a8ab43u);
  std::string ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i);
  EXPECT_EQ(crc32c(ascending.data(), ascending.size()), 0x46dd794eu);
  // Continuing a CRC over pieces equals the CRC of the whole, at every split and alignment.
  const std::string text = "The quick brown fox jumps over the lazy dog, twice or more.";
  for (size_t cut = 0; cut <= text.size(); ++cut)
    EXPECT_EQ(crc32c(text.data() + cut, text.size() - cut, crc32c(text.data(), cut)),
              crc32c(text.data(), text.size()));
}

TEST(TfRecord, TensorFlowsFramingOfAKnownRecord) {
  // A file TensorFlow writes for the one record "abc": length 3, masked CRCs as
  // tensorflow/core/lib/io/record_writer.cc computes them.
  const std::string dir = temp_dir();
  write_file(dir + "/one.tfrecord", 0);
  {
    TfRecordWriter w(dir + "/abc.tfrecord");
    w.write(std::string_view("abc"));
    w.close();
  }
  std::ifstream in(dir + "/abc.tfrecord", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  auto u32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[at + i]);
    return v;
  };
  EXPECT_EQ(u32(8), masked_crc32c(bytes.data(), 8));
  EXPECT_EQ(bytes.substr(12, 3), "abc");
  EXPECT_EQ(u32(15), masked_crc32c("abc", 3));
  const uint32_t crc = crc32c("abc", 3);
  EXPECT_EQ(u32(15), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  EXPECT_EQ(TfRecordFile(dir + "/one.tfrecord").size(), 0u);  // an empty file is valid
}

TEST(TfRecord, RecordsRoundTripWithAndWithoutAnIndex) {
  const std::string dir = temp_dir();
  const std::string path = write_file(dir + "/a.tfrecord", 300);
  ASSERT_TRUE(fs::exists(path + ".index"));
  ASSERT_FALSE(fs::exists(path + ".tmp"));
  {
    TfRecordWriter big(dir + "/big.tfrecord");
    big.write(std::string(3 << 20, 'b'));  // larger than the writer's buffer
    big.write(std::string_view(""));        // and an empty one
    big.close();
    TfRecordFile f(dir + "/big.tfrecord");
    std::vector<std::byte> r;
    f.read(0, r);
    EXPECT_EQ(as_string(r), std::string(3 << 20, 'b'));
    f.read(1, r);
    EXPECT_TRUE(r.empty());
  }
  for (bool with_index : {true, false}) {
    if (!with_index) fs::remove(path + ".index");
    TfRecordFile f(path);
    EXPECT_EQ(f.indexed(), with_index);
    ASSERT_EQ(f.size(), 300u);
    EXPECT_EQ(count_tfrecords(path), 300u);
    std::vector<std::byte> r;
    for (size_t i : {299, 0, 17, 150}) {  // in any order
      f.read(i, r);
      EXPECT_EQ(as_string(r), record_text(i));
      EXPECT_EQ(f.data_bytes(i), record_text(i).size());
    }
  }
  EXPECT_EQ(write_tfrecord_index(path), 300u);
  EXPECT_TRUE(TfRecordFile(path).indexed());
  EXPECT_EQ(verify_tfrecord_file(path), "");
}

TEST(TfRecord, AWriterDestroyedWithoutCloseLeavesNoFile) {
  const std::string dir = temp_dir();
  {
    TfRecordWriter w(dir + "/partial.tfrecord");
    w.write(std::string_view("half"));
  }
  EXPECT_TRUE(fs::is_empty(dir)) << "a partial shard or its .tmp was left behind";
  const std::string text = refusal([&] { TfRecordWriter w(dir + "/no/such/dir/x.tfrecord"); });
  EXPECT_NE(text.find("creating " + dir + "/no/such/dir/x.tfrecord.tmp failed: No such file"),
            std::string::npos)
      << text;
}

TEST(TfRecord, DamageIsNamedWithTheFileTheRecordAndItsOffset) {
  const std::string dir = temp_dir();
  const std::string path = write_file(dir + "/d.tfrecord", 20);
  const TfRecordFile intact(path);
  const uint64_t at = intact.offset(7);

  // A flipped byte in the data of record 7.
  fs::copy_file(path, dir + "/data.tfrecord");
  fs::copy_file(path + ".index", dir + "/data.tfrecord.index");
  flip_byte(dir + "/data.tfrecord", at + 12 + 2);
  std::string text = refusal([&] {
    std::vector<std::byte> r;
    TfRecordFile(dir + "/data.tfrecord").read(7, r);
  });
  EXPECT_NE(text.find(fmt_record(dir + "/data.tfrecord", 7, at)), std::string::npos) << text;
  EXPECT_NE(text.find("checksum of the record's"), std::string::npos) << text;
  EXPECT_NE(verify_tfrecord_file(dir + "/data.tfrecord").find("record 7 at byte"),
            std::string::npos);

  // A flipped byte in record 7's length field: found when reading, and when scanning.
  fs::copy_file(path, dir + "/length.tfrecord");
  flip_byte(dir + "/length.tfrecord", at + 1);
  text = refusal([&] { TfRecordFile f(dir + "/length.tfrecord"); });  // no index: scans
  EXPECT_NE(text.find(fmt_record(dir + "/length.tfrecord", 7, at)), std::string::npos) << text;
  EXPECT_NE(text.find("checksum of the length field"), std::string::npos) << text;

  // Truncated in the middle of record 12, with no index (the scan finds it) and with the old
  // index (stale: the file's size changed).
  fs::copy_file(path, dir + "/cut.tfrecord");
  fs::resize_file(dir + "/cut.tfrecord", intact.offset(12) + 9);
  text = refusal([&] { TfRecordFile f(dir + "/cut.tfrecord"); });
  EXPECT_NE(text.find(fmt_record(dir + "/cut.tfrecord", 12, intact.offset(12))), std::string::npos)
      << text;
  EXPECT_NE(text.find("truncated"), std::string::npos) << text;
  fs::copy_file(path + ".index", dir + "/cut.tfrecord.index");
  text = refusal([&] { TfRecordFile f(dir + "/cut.tfrecord"); });
  EXPECT_NE(text.find("cut.tfrecord.index is stale"), std::string::npos) << text;
  EXPECT_NE(text.find("dtrain data index"), std::string::npos) << text;

  // An index whose last offset is so large that adding a record's framing wraps round (found by
  // tfrecord_fuzz): named as damaged, not read as a record of 2^64 bytes.
  fs::copy_file(path, dir + "/wrap.tfrecord");
  fs::copy_file(path + ".index", dir + "/wrap.tfrecord.index");
  {
    std::fstream index(dir + "/wrap.tfrecord.index", std::ios::in | std::ios::out | std::ios::binary);
    index.seekp(-8, std::ios::end);
    const std::string all_ones(8, '\xff');
    index.write(all_ones.data(), 8);
  }
  text = refusal([&] { TfRecordFile f(dir + "/wrap.tfrecord"); });
  EXPECT_NE(text.find("wrap.tfrecord.index is damaged"), std::string::npos) << text;

  // An index that is not one.
  fs::copy_file(path, dir + "/junk.tfrecord");
  std::ofstream(dir + "/junk.tfrecord.index") << "not an index at all, just text";
  text = refusal([&] { TfRecordFile f(dir + "/junk.tfrecord"); });
  EXPECT_NE(text.find("is not a dtrain TFRecord index"), std::string::npos) << text;

  // Not a TFRecord file at all.
  std::ofstream(dir + "/text.tfrecord") << "hello, this is a text file and no TFRecord";
  text = refusal([&] { TfRecordFile f(dir + "/text.tfrecord"); });
  EXPECT_NE(text.find("record 0 at byte 0"), std::string::npos) << text;

  // A gzip'd TFRecord file (TensorFlow's compression_type="GZIP"): refused, saying why.
  fs::copy_file(path, dir + "/zipped.tfrecord");
  ASSERT_EQ(std::system(("gzip -f " + dir + "/zipped.tfrecord").c_str()), 0);
  text = refusal([&] { TfRecordFile f(dir + "/zipped.tfrecord.gz"); });
  EXPECT_NE(text.find("zipped.tfrecord.gz is gzip-compressed"), std::string::npos) << text;

  // A missing file.
  text = refusal([&] { TfRecordFile f(dir + "/missing.tfrecord"); });
  EXPECT_NE(text.find("opening " + dir + "/missing.tfrecord failed: No such file"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace dtrain::data
