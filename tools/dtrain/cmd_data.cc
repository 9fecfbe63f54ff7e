// `dtrain data`: shard files for dtrain::data::ShardedDataset (docs/data.md).
//
//   dtrain data write --fashion-mnist [--split train|test] [--limit N] --out DIR/fmnist --shards 4
//   dtrain data write --from FOLDER --out DIR/files --shards 8   (one record per file)
//   dtrain data inspect 'DIR/fmnist-*.tfrecord'                 (counts, sizes, every checksum; tar
//   too) dtrain data index FILE...                                    (indexes for files made
//   elsewhere) dtrain data list --rank 1 --world-size 4 --epoch 2 FILES     (which records a rank
//   takes)
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "data/shard_file.h"
#include "dtrain/data/fashion_mnist.h"
#include "dtrain/data/sharded_dataset.h"
#include "dtrain/data/tfrecord.h"
#include "dtrain/error.h"
#include "tools/dtrain/commands.h"

namespace dtrain::tools {
namespace {

namespace fs = std::filesystem;

struct WriteFlags {
  std::string out;
  int shards = 1;
  bool fashion_mnist = false;
  std::string fashion_mnist_dir = data::kFashionMnistDir;
  std::string split = "train";
  std::string from;
  size_t limit = 0;  // 0 = every image or file
};

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

// Writes `count` records, record(i) giving each, into `shards` files named
// PREFIX-00000-of-0000N.tfrecord, each a contiguous run of records.
template <typename RecordAt>
void write_shards(const std::string& prefix, int shards, size_t count, const RecordAt& record) {
  if (shards < 1 || static_cast<size_t>(shards) > std::max<size_t>(count, 1))
    throw InvalidArgumentError(fmt::format(
        "dtrain data write: --shards {} for {} records: each shard needs at least one record",
        shards, count));
  const fs::path parent = fs::path(prefix).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  uint64_t bytes = 0;
  for (int s = 0; s < shards; ++s) {
    const std::string path = fmt::format("{}-{:05d}-of-{:05d}.tfrecord", prefix, s, shards);
    data::TfRecordWriter out(path);
    const size_t begin = count * static_cast<size_t>(s) / static_cast<size_t>(shards);
    const size_t end = count * static_cast<size_t>(s + 1) / static_cast<size_t>(shards);
    for (size_t i = begin; i < end; ++i) out.write(record(i));
    out.close();
    bytes += out.bytes();
    std::printf("%s: %zu records, %s\n", path.c_str(), end - begin,
                human_bytes(out.bytes()).c_str());
  }
  std::printf("wrote %zu records in %d shards (%s) with their indexes\n", count, shards,
              human_bytes(static_cast<double>(bytes)).c_str());
}

void run_write(const WriteFlags& f) {
  if (f.fashion_mnist == !f.from.empty())
    throw InvalidArgumentError(
        "dtrain data write: give exactly one source: --fashion-mnist [DIR] or --from FOLDER");
  if (f.fashion_mnist) {
    if (f.split != "train" && f.split != "test")
      throw InvalidArgumentError(fmt::format(
          "dtrain data write: --split {}: use train (60,000 images) or test (10,000)", f.split));
    const data::FashionMnistBytes raw =
        data::read_fashion_mnist(f.fashion_mnist_dir, f.split == "train");
    const size_t pixels = static_cast<size_t>(raw.rows * raw.cols);
    std::string record(1 + pixels, '\0');
    const size_t n =
        f.limit > 0 ? std::min(f.limit, static_cast<size_t>(raw.n)) : static_cast<size_t>(raw.n);
    write_shards(f.out, f.shards, n, [&](size_t i) {
      // One byte of label, then the image's pixels (docs/data.md, "Fashion-MNIST records").
      record[0] = static_cast<char>(raw.labels[i]);
      std::copy_n(raw.images.begin() + static_cast<ptrdiff_t>(i * pixels), pixels,
                  record.begin() + 1);
      return std::string_view(record);
    });
    return;
  }
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(f.from, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file()) files.push_back(it->path());
  if (ec)
    throw InvalidArgumentError(
        fmt::format("dtrain data write: reading the folder {} failed: {}", f.from, ec.message()));
  if (files.empty())
    throw InvalidArgumentError(fmt::format("dtrain data write: {} holds no file", f.from));
  std::sort(files.begin(), files.end());
  if (f.limit > 0 && files.size() > f.limit) files.resize(f.limit);
  std::string content;
  write_shards(f.out, f.shards, files.size(), [&](size_t i) {
    std::ifstream in(files[i], std::ios::binary);
    content.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof())
      throw InvalidArgumentError(fmt::format("dtrain data write: reading {} failed: {}",
                                             files[i].string(), std::strerror(errno)));
    return std::string_view(content);
  });
}

struct ListFlags {
  std::vector<std::string> files;
  data::ShardedDatasetOptions o;
  uint64_t epoch = 0, consumed = 0;
  bool no_shuffle = false;
};

// Every record of every file read, and what the format can check checked: TFRecord's two CRCs
// per record, tar's header checksums.
int run_inspect(const std::vector<std::string>& patterns) {
  const std::vector<std::string> files = data::expand_shards(patterns);
  std::printf("%-48s %10s %12s %24s  %s\n", "file", "records", "bytes", "record min/mean/max",
              "check");
  uint64_t records = 0, bytes = 0;
  int damaged = 0;
  for (const auto& path : files) {
    uint64_t lo = UINT64_MAX, hi = 0, sum = 0, n = 0;
    try {
      auto file = data::open_shard(path);
      data::Record r;
      for (size_t i = 0; i < file->size(); ++i) {
        file->read(i, r);
        lo = std::min<uint64_t>(lo, r.bytes.size());
        hi = std::max<uint64_t>(hi, r.bytes.size());
        sum += r.bytes.size();
      }
      n = file->size();
    } catch (const Error& e) {
      ++damaged;
      std::printf("%-48s %s\n", path.c_str(), e.what());
      continue;
    }
    const uint64_t size = fs::file_size(path);
    records += n;
    bytes += size;
    const std::string spread = n == 0 ? "-" : fmt::format("{}/{:.0f}/{}", lo, double(sum) / n, hi);
    std::printf("%-48s %10llu %12s %24s  ok\n", path.c_str(), static_cast<unsigned long long>(n),
                human_bytes(static_cast<double>(size)).c_str(), spread.c_str());
  }
  std::printf("%zu files, %llu records, %s", files.size(), static_cast<unsigned long long>(records),
              human_bytes(static_cast<double>(bytes)).c_str());
  if (damaged > 0) {
    std::printf("; %d damaged (above)\n", damaged);
    return 1;
  }
  std::printf("; every check passed\n");
  return 0;
}

}  // namespace

CLI::App* add_data_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "data",
      "Write and check TFRecord shard files for dtrain::data::ShardedDataset (docs/data.md)");
  cmd->require_subcommand(1);

  auto w = std::make_shared<WriteFlags>();
  CLI::App* write = cmd->add_subcommand("write", "Write shard files (with their indexes)");
  write->add_option("--out", w->out, "Prefix of the files: PREFIX-00000-of-0000N.tfrecord")
      ->required();
  write->add_option("--shards", w->shards, "Number of files")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI::Option* fmnist = write->add_option("--fashion-mnist", w->fashion_mnist_dir,
                                          "From Fashion-MNIST's IDX files in DIR (default " +
                                              std::string(data::kFashionMnistDir) +
                                              "); a record is the label byte, then the 784 pixels");
  fmnist->expected(0, 1);
  write->add_option("--split", w->split, "Fashion-MNIST: train or test")->capture_default_str();
  write->add_option("--from", w->from,
                    "From every file under FOLDER (one record per file, in path order)");
  write->add_option("--limit", w->limit, "Only the first N images or files (0 = all)")
      ->check(CLI::NonNegativeNumber);
  write->callback([w, fmnist] {
    w->fashion_mnist = fmnist->count() > 0;
    run_write(*w);
  });

  auto files = std::make_shared<std::vector<std::string>>();
  CLI::App* inspect = cmd->add_subcommand(
      "inspect",
      "Count records (tar: samples) and check every checksum; exit 1 when a file is damaged");
  inspect->add_option("files", *files, "Files, glob patterns or @manifests")->required();
  inspect->callback([files] {
    if (const int rc = run_inspect(*files); rc != 0) std::exit(rc);
  });

  auto to_index = std::make_shared<std::vector<std::string>>();
  CLI::App* index = cmd->add_subcommand(
      "index",
      "Write FILE.index for TFRecord files made elsewhere (so ranks read only their records)");
  index->add_option("files", *to_index, "Files, glob patterns or @manifests")->required();
  index->callback([to_index] {
    for (const auto& path : data::expand_shards(*to_index)) {
      const uint64_t n = data::write_tfrecord_index(path);
      std::printf("%s.index: %llu records\n", path.c_str(), static_cast<unsigned long long>(n));
    }
  });
  auto list = std::make_shared<ListFlags>();
  CLI::App* ls = cmd->add_subcommand(
      "list", "Print the global ids of the records one rank takes in an epoch, one per line");
  ls->add_option("files", list->files, "Files, glob patterns or @manifests")->required();
  ls->add_option("--rank", list->o.rank, "The rank")->capture_default_str();
  ls->add_option("--world-size", list->o.world_size, "Ranks in the job")->capture_default_str();
  ls->add_option("--epoch", list->epoch, "The epoch")->capture_default_str();
  ls->add_option("--consumed", list->consumed, "Start at this position of the epoch")
      ->capture_default_str();
  ls->add_option("--seed", list->o.seed, "The job's seed")->capture_default_str();
  ls->add_option("--shuffle-window", list->o.shuffle_window, "Records shuffled together")
      ->capture_default_str();
  ls->add_flag("--no-shuffle", list->no_shuffle, "The files' order");
  ls->add_flag("--drop-last", list->o.drop_last, "Cut the epoch to a multiple of the world size");
  ls->callback([list] {
    data::ShardedDatasetOptions o = list->o;
    o.shuffle = !list->no_shuffle;
    data::ShardedDataset dataset(list->files, o);
    dataset.set_epoch(list->epoch, list->consumed);
    while (auto r = dataset.next()) std::printf("%llu\n", static_cast<unsigned long long>(r->id));
  });
  return cmd;
}

}  // namespace dtrain::tools
