// The durable-storage layer (common/durable.h) and the error kinds of I/O failures: a full disk
// is a ResourceExhaustedError that names the file and says what to do, a bad path an
// InvalidArgumentError; checksums are of what the disk holds; numbered directories are listed,
// installed, pruned, and the leftovers of unfinished saves removed.
#include "common/durable.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <fstream>

#include "common/safetensors_file.h"
#include "dtrain/error.h"
#include "support/temp_dir.h"

namespace dtrain::durable {
namespace {

namespace fs = std::filesystem;

using testing::TempDir;

TEST(Durable, AFullDiskIsResourceExhaustedNamingTheFileAndWhatToDo) {
  try {
    write_file("/dev/full", std::string(100, 'x'));  // every write to /dev/full is ENOSPC
    FAIL() << "writing /dev/full succeeded";
  } catch (const ResourceExhaustedError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("writing 100 of 100 bytes to /dev/full failed: No space left on device (28)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("free space"), std::string::npos) << m;
    EXPECT_FALSE(e.retryable());
  }
  EXPECT_THROW(write_file("/proc/no-such-dir/file", "x"), InvalidArgumentError);
  EXPECT_THROW(read_file("/proc/no-such-dir/file"), InvalidArgumentError);
}

TEST(Durable, TheErrnoKindsAndContextKeepTheKind) {
  EXPECT_EQ(kind_of_errno(ENOSPC), ErrorKind::kResourceExhausted);
  EXPECT_EQ(kind_of_errno(EDQUOT), ErrorKind::kResourceExhausted);
  EXPECT_EQ(kind_of_errno(EIO), ErrorKind::kDataLoss);
  EXPECT_EQ(kind_of_errno(EAGAIN), ErrorKind::kUnavailable);
  EXPECT_EQ(kind_of_errno(ENOENT), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(UnavailableError("x").retryable());
  try {
    rethrow_with_context(std::make_exception_ptr(DataLossError("fsync of f failed")), "rank 3");
  } catch (const DataLossError& e) {
    EXPECT_STREQ(e.what(), "rank 3: fsync of f failed");
  }
  EXPECT_THROW(rethrow_with_context(std::make_exception_ptr(std::bad_alloc()), "x"),
               ResourceExhaustedError);
  EXPECT_THROW(rethrow_with_context(std::make_exception_ptr(std::logic_error("y")), "x"),
               InternalError);
}

TEST(Durable, ChecksumsAreOfWhatTheFileHolds) {
  TempDir dir;
  const std::string path = dir.path + "/f";
  const std::string text = "the quick brown fox";
  write_file(path, text);
  EXPECT_EQ(read_file(path), text);
  const FileSum sum = sum_file(path, /*sync=*/true);
  EXPECT_EQ(sum.bytes, text.size());
  EXPECT_EQ(sum.crc, crc32_of(text));
  EXPECT_EQ(crc32_of(std::string("123456789")), 0xcbf43926u);  // CRC-32's check value
}

TEST(Durable, NumberedDirectoriesAreInstalledPrunedAndLeftoversRemoved) {
  TempDir d;
  const std::string& dir = d.path;
  for (int n : {1, 2, 3, 5}) fs::create_directories(numbered_path(dir, "ckpt-", n));
  fs::create_directories(dir + "/ckpt-abc");          // not a number: ignored
  std::ofstream(dir + "/ckpt-000009") << "a file";     // not a directory: ignored
  EXPECT_EQ(list_numbered(dir, "ckpt-"), (std::vector<int64_t>{5, 3, 2, 1}));

  // A save of 4: written under its temporary name, installed, durable.
  const std::string tmp = temporary_path(dir, "ckpt-", 4);
  fs::create_directories(tmp);
  write_file(tmp + "/data", "four");
  install(tmp, numbered_path(dir, "ckpt-", 4), dir);
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_EQ(read_file(numbered_path(dir, "ckpt-", 4) + "/data"), "four");
  // Saved again: the new one replaces the old atomically.
  fs::create_directories(tmp);
  write_file(tmp + "/data", "four again");
  install(tmp, numbered_path(dir, "ckpt-", 4), dir);
  EXPECT_EQ(read_file(numbered_path(dir, "ckpt-", 4) + "/data"), "four again");

  // After 4: 5 belongs to an abandoned history; of the rest the newest 2 stay.
  prune(dir, "ckpt-", 2, 4);
  EXPECT_EQ(list_numbered(dir, "ckpt-"), (std::vector<int64_t>{4, 3}));

  // Another process's unfinished save goes; this process's (maybe in progress) stays.
  fs::create_directories(dir + "/.ckpt-000007.tmp-999999999");
  fs::create_directories(temporary_path(dir, "ckpt-", 8));
  remove_temporaries(dir, "ckpt-");
  EXPECT_FALSE(fs::exists(dir + "/.ckpt-000007.tmp-999999999"));
  EXPECT_TRUE(fs::exists(temporary_path(dir, "ckpt-", 8)));
}

// A safetensors file written and read through the one reader and writer; a header that claims
// more bytes than the file has is refused naming the tensor.
TEST(Durable, SafetensorsRoundTripAndATruncatedFileIsNamed) {
  TempDir d;
  const std::string path = d.path + "/t.safetensors";
  std::vector<float> values{1.5f, -2.0f, 3.25f, 0.0f};
  write_safetensors_file(path, std::vector<SafetensorsView>{{"w", "F32", {2, 2}, values.data(),
                                                             values.size() * sizeof(float)}},
                         {{"format", "pt"}});
  SafetensorsReader reader(path);
  ASSERT_EQ(reader.entries().size(), 1u);
  EXPECT_EQ(reader.metadata().at("format"), "pt");
  std::vector<float> back(4);
  reader.read(reader.entries()[0], back.data());
  EXPECT_EQ(back, values);
  fs::resize_file(path, fs::file_size(path) - 4);
  try {
    SafetensorsReader cut(path);
    FAIL() << "a truncated file was read";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'w' (F32 of 4 elements) has data offsets [0, 16]"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dtrain::durable
