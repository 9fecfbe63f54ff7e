// data_bench: how fast dtrain::data::ShardedDataset reads, against the file system's own speed,
// in one run (alternating rounds, medians):
//
//   for small (1 KiB) and large (1 MiB) records, the same bytes in TFRecord shards:
//     sequential   read(2) of every shard in 1 MiB blocks, what `dd bs=1M` does: the floor
//     dtrain       ShardedDataset, shuffled, 1 and 2 reader threads (one rank of one)
//   each from the page cache (files read once before) and from the disk (evicted with
//   posix_fadvise(DONTNEED) before each measurement; reported only where eviction took hold,
//   i.e. the first read after it is slower than a cached one).
//
// Usage: data_bench [--dir DIR] [--mib 256] [--rounds 3] [--json FILE]. It writes 2 x MIB MiB of
// shards into DIR (default /tmp/dtrain-data-bench) and removes them at the end.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dtrain/data/sharded_dataset.h"
#include "dtrain/data/tfrecord.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<std::string> write_shards(const std::string& dir, const std::string& name,
                                      size_t record_bytes, size_t total_bytes, int files) {
  std::vector<std::string> paths;
  const size_t records = std::max<size_t>(1, total_bytes / record_bytes);
  std::string record(record_bytes, '\0');
  for (size_t i = 0; i < record.size(); ++i) record[i] = static_cast<char>(i * 131 + 7);
  for (int f = 0; f < files; ++f) {
    paths.push_back(fmt::format("{}/{}-{:05d}.tfrecord", dir, name, f));
    dtrain::data::TfRecordWriter w(paths.back(), {.sync = false});
    for (size_t i = records * f / files; i < records * (f + 1) / files; ++i) {
      std::memcpy(record.data(), &i, sizeof i);  // every record different
      w.write(record);
    }
    w.close();
  }
  return paths;
}

void evict(const std::vector<std::string>& paths) {
  for (const auto& p : paths)
    for (const std::string& q : {p, p + ".index"}) {
      const int fd = ::open(q.c_str(), O_RDONLY);
      if (fd < 0) continue;
      ::fdatasync(fd);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
}

// Bytes read by read(2) in 1 MiB blocks, file after file.
uint64_t sequential(const std::vector<std::string>& paths) {
  std::vector<char> block(1 << 20);
  uint64_t total = 0;
  for (const auto& p : paths) {
    const int fd = ::open(p.c_str(), O_RDONLY);
    if (fd < 0) throw std::runtime_error("data_bench: cannot open " + p);
    for (ssize_t n; (n = ::read(fd, block.data(), block.size())) > 0;) total += static_cast<uint64_t>(n);
    ::close(fd);
  }
  return total;
}

// Records read by one rank of one, shuffled, with `readers` threads.
uint64_t through_dataset(const std::vector<std::string>& paths, int readers) {
  dtrain::data::ShardedDatasetOptions o;
  o.readers = readers;
  o.seed = 1;
  dtrain::data::ShardedDataset data(paths, o);
  uint64_t n = 0;
  while (data.next()) ++n;
  return n;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string dir = "/tmp/dtrain-data-bench", json;
  size_t mib = 256;
  int rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") dir = v;
    else if (k == "--mib") mib = std::stoul(v);
    else if (k == "--rounds") rounds = std::stoi(v);
    else if (k == "--json") json = v;
    else throw std::invalid_argument("data_bench: unknown option " + k);
  }
  fs::create_directories(dir);
  struct Set {
    std::string name;
    size_t record_bytes;
    std::vector<std::string> paths;
    size_t records = 0;
  };
  std::vector<Set> sets = {{"1KiB", 1024, {}}, {"1MiB", size_t{1} << 20, {}}};
  for (auto& s : sets) {
    s.paths = write_shards(dir, s.name, s.record_bytes, mib << 20, 8);
    for (const auto& p : s.paths) s.records += dtrain::data::count_tfrecords(p);
  }
  std::printf("data_bench: %zu MiB of 1 KiB records and of 1 MiB records, 8 files each, in %s; "
              "%d rounds\n", mib, dir.c_str(), rounds);

  // (set, way, cache) -> seconds per round
  std::map<std::tuple<std::string, std::string, std::string>, std::vector<double>> seconds;
  bool eviction_works = true;
  const std::vector<std::pair<std::string, std::function<uint64_t(const Set&)>>> ways = {
      {"sequential read", [](const Set& s) { return sequential(s.paths); }},
      {"dtrain 1 reader", [](const Set& s) { return through_dataset(s.paths, 1); }},
      {"dtrain 2 readers", [](const Set& s) { return through_dataset(s.paths, 2); }},
  };
  for (int round = 0; round < rounds; ++round) {
    for (auto& s : sets) {
      for (size_t w = 0; w < ways.size(); ++w) {
        const auto& [way, run] = ways[round % 2 ? ways.size() - 1 - w : w];
        for (const std::string cache : {"disk", "page cache"}) {
          if (cache == "disk") evict(s.paths);
          else run(s);  // warm
          const auto start = Clock::now();
          run(s);
          seconds[{s.name, way, cache}].push_back(
              std::chrono::duration<double>(Clock::now() - start).count());
        }
      }
    }
  }
  for (auto& s : sets) {
    const double disk = median(seconds[{s.name, "sequential read", "disk"}]);
    const double cached = median(seconds[{s.name, "sequential read", "page cache"}]);
    if (disk < cached * 1.5) eviction_works = false;
  }
  std::FILE* out = json.empty() ? nullptr : std::fopen(json.c_str(), "w");
  std::printf("\n%-6s %-18s %-11s %12s %14s %12s %16s\n", "record", "reader", "from", "median s",
              "records/s", "MB/s", "x sequential");
  for (auto& s : sets) {
    for (const auto& [way, run] : ways) {
      for (const std::string cache : {"page cache", "disk"}) {
        if (cache == "disk" && !eviction_works) continue;
        const double t = median(seconds[{s.name, way, cache}]);
        const double floor = median(seconds[{s.name, "sequential read", cache}]);
        const double bytes = static_cast<double>(s.records * (s.record_bytes + 16));
        std::printf("%-6s %-18s %-11s %12.3f %14.0f %12.0f %16.2f\n", s.name.c_str(), way.c_str(),
                    cache.c_str(), t, s.records / t, bytes / t / 1e6, t / floor);
        if (out)
          std::fprintf(out,
                       "{\"record\": \"%s\", \"reader\": \"%s\", \"from\": \"%s\", \"median_s\": "
                       "%.4f, \"records_per_s\": %.0f, \"mb_per_s\": %.0f, \"x_sequential\": %.3f}\n",
                       s.name.c_str(), way.c_str(), cache.c_str(), t, s.records / t,
                       bytes / t / 1e6, t / floor);
      }
    }
  }
  if (!eviction_works)
    std::printf("(disk rows left out: posix_fadvise(DONTNEED) did not evict the files here, so "
                "'disk' read from memory too)\n");
  if (out) std::fclose(out);
  fs::remove_all(dir);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
