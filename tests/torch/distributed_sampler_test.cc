// DistributedSampler: disjoint and complete coverage, reshuffling, agreement, padding, drop_last;
// empty datasets refused.
#include "dtrain/torch/distributed_sampler.h"

#include <unistd.h>
#include <zlib.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dtrain/error.h"
#include "dtrain/torch/fashion_mnist.h"

namespace dtrain {
namespace {

std::vector<std::vector<size_t>> split(size_t n, int replicas, bool shuffle, uint64_t seed,
                                       uint64_t epoch, bool drop_last) {
  std::vector<std::vector<size_t>> out;
  for (int r = 0; r < replicas; ++r) {
    DistributedSampler s(n, replicas, r, shuffle, seed, drop_last);
    s.set_epoch(epoch);
    out.push_back(s.indices());
  }
  return out;
}

TEST(DistributedSampler, EvenSplitIsDisjointAndComplete) {
  for (int replicas : {1, 2, 3, 4}) {
    auto parts = split(120, replicas, true, 7, 0, false);
    std::set<size_t> all;
    for (const auto& p : parts) {
      EXPECT_EQ(p.size(), 120u / replicas);
      for (size_t i : p) EXPECT_TRUE(all.insert(i).second) << "sample " << i << " twice";
    }
    EXPECT_EQ(all.size(), 120u);
    EXPECT_EQ(*all.rbegin(), 119u);
  }
}

TEST(DistributedSampler, PaddingRepeatsFirstSamplesToEqualLengths) {
  auto parts = split(10, 4, true, 3, 0, false);  // 3 each, 2 padded
  std::map<size_t, int> count;
  for (const auto& p : parts) {
    EXPECT_EQ(p.size(), 3u);
    for (size_t i : p) ++count[i];
  }
  EXPECT_EQ(count.size(), 10u);  // every sample is seen
  int twice = 0;
  for (auto [i, c] : count) twice += c == 2;
  EXPECT_EQ(twice, 2);
}

TEST(DistributedSampler, DropLastCutsToEqualLengths) {
  auto parts = split(10, 4, false, 0, 0, true);  // 2 each, 2 dropped
  std::set<size_t> all;
  for (const auto& p : parts) {
    EXPECT_EQ(p.size(), 2u);
    for (size_t i : p) EXPECT_TRUE(all.insert(i).second);
  }
  EXPECT_EQ(all.size(), 8u);
  DistributedSampler s(10, 4, 1, false, 0, true);
  EXPECT_EQ(s.indices(), (std::vector<size_t>{1, 5}));  // rank 1 of 0..7, in order
}

TEST(DistributedSampler, ReshufflesPerEpochAndAgreesAcrossInstances) {
  auto e0 = split(100, 2, true, 11, 0, false);
  auto e0_again = split(100, 2, true, 11, 0, false);
  auto e1 = split(100, 2, true, 11, 1, false);
  auto other_seed = split(100, 2, true, 12, 0, false);
  EXPECT_EQ(e0, e0_again);  // every rank computes the same split without communicating
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, other_seed);
  std::vector<size_t> a = e0[0], b = e1[0];
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_NE(a, b) << "a new epoch should give rank 0 other samples, not a reordering";
}

TEST(DistributedSampler, WithoutShuffleTakesEveryNthSample) {
  DistributedSampler s(7, 3, 2, false);
  EXPECT_EQ(s.indices(), (std::vector<size_t>{2, 5, 1}));  // 0..6 padded with 0, 1
}

TEST(DistributedSampler, BatchesThroughTheSamplerInterface) {
  DistributedSampler s(10, 2, 0, false);
  auto b1 = s.next(3);
  auto b2 = s.next(3);
  auto b3 = s.next(3);
  ASSERT_TRUE(b1 && b2);
  EXPECT_EQ(*b1, (std::vector<size_t>{0, 2, 4}));
  EXPECT_EQ(*b2, (std::vector<size_t>{6, 8}));
  EXPECT_FALSE(b3.has_value());
  s.reset();
  EXPECT_EQ(*s.next(5), (std::vector<size_t>{0, 2, 4, 6, 8}));
}

TEST(DistributedSampler, RejectsABadRank) {
  EXPECT_THROW(DistributedSampler(10, 2, 2), std::exception);
  EXPECT_THROW(DistributedSampler(1, 2, 0, true, 0, true), std::exception);
}

// An empty dataset used to "train" zero steps and exit 0: it is refused, saying so.
TEST(DistributedSampler, RefusesAnEmptyDataset) {
  try {
    DistributedSampler(0, 2, 0);
    FAIL() << "an empty dataset was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("the dataset is empty (0 samples)"), std::string::npos)
        << e.what();
  }
}

// Fashion-MNIST files that hold no images: refused, naming the file.
TEST(FashionMnist, FilesWithNoImagesAreRefused) {
  const std::filesystem::path dir = ::testing::TempDir() + "/dtrain_empty_mnist_" +
                                    std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, std::vector<uint8_t> header) {
    gzFile f = gzopen((dir / (name + ".gz")).c_str(), "wb");
    ASSERT_NE(f, nullptr);
    gzwrite(f, header.data(), static_cast<unsigned>(header.size()));
    gzclose(f);
  };
  for (const std::string prefix : {"train", "t10k"}) {
    write(prefix + "-images-idx3-ubyte", {0, 0, 8, 3, 0, 0, 0, 0, 0, 0, 0, 28, 0, 0, 0, 28});
    write(prefix + "-labels-idx1-ubyte", {0, 0, 8, 1, 0, 0, 0, 0});
  }
  try {
    load_fashion_mnist(dir.string(), /*train=*/true);
    FAIL() << "an empty training set was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("train-images-idx3-ubyte holds no images"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dtrain
