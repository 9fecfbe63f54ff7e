// `dtrain data`: shard files for dtrain::data::ShardedDataset (docs/data.md).
//
//   dtrain data write --fashion-mnist [--split train|test] [--limit N] --out DIR/fmnist --shards 4
//   dtrain data write --from FOLDER --out DIR/files --shards 8   (one sample per key: tar, or
//                                                     --format tfrecord: tf.train.Example)
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
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "data/shard_file.h"
#include "data/tar_writer.h"
#include "data/tf_example.h"
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
  std::string format;  // tar or tfrecord; "" = the source's own (tar for --from)
  size_t limit = 0;    // 0 = every image or sample
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

// Writes `count` records into `shards` files named PREFIX-00000-of-0000N.EXT, each a contiguous
// run of records; write(i, file) adds record i to an open file (of type File, made from a path).
template <typename File, typename Write>
void write_shards(const std::string& prefix, std::string_view ext, int shards, size_t count,
                  const Write& write) {
  if (shards < 1 || static_cast<size_t>(shards) > std::max<size_t>(count, 1))
    throw InvalidArgumentError(fmt::format(
        "dtrain data write: --shards {} for {} records: each shard needs at least one record",
        shards, count));
  const fs::path parent = fs::path(prefix).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  uint64_t bytes = 0;
  for (int s = 0; s < shards; ++s) {
    const std::string path = fmt::format("{}-{:05d}-of-{:05d}.{}", prefix, s, shards, ext);
    File out(path);
    const size_t begin = count * static_cast<size_t>(s) / static_cast<size_t>(shards);
    const size_t end = count * static_cast<size_t>(s + 1) / static_cast<size_t>(shards);
    for (size_t i = begin; i < end; ++i) write(i, out);
    out.close();
    bytes += out.bytes();
    std::printf("%s: %zu records, %s\n", path.c_str(), end - begin,
                human_bytes(static_cast<double>(out.bytes())).c_str());
  }
  std::printf("wrote %zu records in %d shards (%s)%s\n", count, shards,
              human_bytes(static_cast<double>(bytes)).c_str(),
              ext == "tfrecord" ? " with their indexes" : "");
}

// A folder's files as samples, as WebDataset groups a tar's members: the key is the path under
// the folder up to the first dot of the file's name, the part what follows ("cat/0001.jpg": key
// "cat/0001", part "jpg"; "notes": key "notes", part ""). When every file lies in a subfolder,
// the first-level folders are classes (as torchvision's ImageFolder): each sample gets a part
// "cls", the class's index in the sorted folder names, unless it has a "cls" file of its own.
struct FolderSample {
  std::string key;
  std::vector<std::pair<std::string, fs::path>> parts;  // (part, file), in name order
  int cls = -1;
};
struct FolderSamples {
  std::vector<FolderSample> samples;
  std::vector<std::string> classes;
};

FolderSamples samples_of(const std::string& folder) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file()) files.push_back(fs::relative(it->path(), folder));
  if (ec)
    throw InvalidArgumentError(
        fmt::format("dtrain data write: reading the folder {} failed: {}", folder, ec.message()));
  if (files.empty())
    throw InvalidArgumentError(fmt::format("dtrain data write: {} holds no file", folder));
  std::map<std::string, FolderSample> by_key;
  bool all_in_folders = true;
  std::set<std::string> folders;
  for (const fs::path& file : files) {
    const std::string name = file.generic_string();
    const size_t slash = name.rfind('/');
    const size_t dot = name.find('.', slash == std::string::npos ? 0 : slash + 1);
    FolderSample& s = by_key[name.substr(0, dot)];
    s.key = name.substr(0, dot);
    s.parts.emplace_back(dot == std::string::npos ? "" : name.substr(dot + 1), file);
    if (slash == std::string::npos)
      all_in_folders = false;
    else
      folders.insert(name.substr(0, name.find('/')));
  }
  FolderSamples out;
  if (all_in_folders) out.classes.assign(folders.begin(), folders.end());
  for (auto& [key, s] : by_key) {
    std::sort(s.parts.begin(), s.parts.end());
    const bool own_cls =
        std::any_of(s.parts.begin(), s.parts.end(), [](const auto& p) { return p.first == "cls"; });
    if (all_in_folders && !own_cls) {
      const std::string top = key.substr(0, key.find('/'));
      s.cls = static_cast<int>(std::lower_bound(out.classes.begin(), out.classes.end(), top) -
                               out.classes.begin());
    }
    out.samples.push_back(std::move(s));
  }
  return out;
}

std::string read_whole(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof())
    throw InvalidArgumentError(fmt::format("dtrain data write: reading {} failed: {}",
                                           path.string(), std::strerror(errno)));
  return content;
}

void write_folder(const WriteFlags& f) {
  const std::string format = f.format.empty() ? "tar" : f.format;
  FolderSamples folder = samples_of(f.from);
  std::vector<FolderSample>& samples = folder.samples;
  if (f.limit > 0 && samples.size() > f.limit) samples.resize(f.limit);
  if (format == "tar") {
    write_shards<data::TarWriter>(
        f.out, "tar", f.shards, samples.size(), [&](size_t i, data::TarWriter& out) {
          const FolderSample& s = samples[i];
          for (const auto& [part, file] : s.parts)
            out.add(part.empty() ? s.key : s.key + "." + part, read_whole(fs::path(f.from) / file));
          if (s.cls >= 0) out.add(s.key + ".cls", std::to_string(s.cls));
        });
  } else {
    write_shards<data::TfRecordWriter>(
        f.out, "tfrecord", f.shards, samples.size(), [&](size_t i, data::TfRecordWriter& out) {
          const FolderSample& s = samples[i];
          std::vector<std::string> contents;
          for (const auto& part : s.parts)
            contents.push_back(read_whole(fs::path(f.from) / part.second));
          std::vector<data::ExampleFeature> features{{"key", std::string_view(s.key)}};
          for (size_t p = 0; p < s.parts.size(); ++p) {
            const std::string& part = s.parts[p].first;
            features.push_back({part.empty() ? std::string_view("data") : std::string_view(part),
                                std::string_view(contents[p])});
          }
          if (s.cls >= 0) features.push_back({"cls", int64_t{s.cls}});
          out.write(data::encode_example(features));
        });
  }
  if (folder.classes.empty()) return;
  // The classes' names, line i naming class i, beside the shards.
  const std::string names_path = f.out + ".classes.txt";
  std::ofstream names(names_path);
  for (const std::string& c : folder.classes) names << c << "\n";
  names.close();
  if (!names)
    throw InvalidArgumentError(
        fmt::format("dtrain data write: writing {} failed: {}", names_path, std::strerror(errno)));
  std::string listed;
  for (size_t c = 0; c < folder.classes.size() && c < 8; ++c)
    listed += fmt::format("{}{}={}", c == 0 ? "" : ", ", folder.classes[c], c);
  if (folder.classes.size() > 8) listed += ", ...";
  std::printf("%zu classes from the first-level folders (%s), named in %s\n", folder.classes.size(),
              listed.c_str(), names_path.c_str());
}

void run_write(const WriteFlags& f) {
  if (f.fashion_mnist == !f.from.empty())
    throw InvalidArgumentError(
        "dtrain data write: give exactly one source: --fashion-mnist [DIR] or --from FOLDER");
  if (f.fashion_mnist && f.format == "tar")
    throw InvalidArgumentError(
        "dtrain data write: Fashion-MNIST is written as TFRecord (a label byte, then the "
        "pixels): leave out --format tar");
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
    write_shards<data::TfRecordWriter>(
        f.out, "tfrecord", f.shards, n, [&](size_t i, data::TfRecordWriter& out) {
          // One byte of label, then the image's pixels (docs/data.md, "Fashion-MNIST records").
          record[0] = static_cast<char>(raw.labels[i]);
          std::copy_n(raw.images.begin() + static_cast<ptrdiff_t>(i * pixels), pixels,
                      record.begin() + 1);
          out.write(std::string_view(record));
        });
    return;
  }
  write_folder(f);
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
  CLI::App* cmd = app.add_subcommand("data",
                                     "Write and check shard files (TFRecord, WebDataset tar) for "
                                     "ShardedDataset (`dtrain docs data`)");
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
                    "From every file under FOLDER: a sample per key (cat/0001.jpg and "
                    "cat/0001.json make sample cat/0001), in key order; first-level folders are "
                    "classes (a 'cls' part)");
  write
      ->add_option("--format", w->format,
                   "tar (WebDataset; the default for --from) or tfrecord (one tf.train.Example "
                   "per sample: 'key', a feature per part, 'cls')")
      ->check(CLI::IsMember({"tar", "tfrecord"}));
  write->add_option("--limit", w->limit, "Only the first N images or samples (0 = all)")
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
