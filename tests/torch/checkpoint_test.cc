// Checkpoints: exact round trips of model, optimizer (SGD, Adam, AdamW) and generator state;
// atomic saves keeping the newest K; a process SIGKILLed in the middle of saves; corrupt and
// truncated files detected and skipped; every rank loading the one rank 0 picked; and the
// sampler's mid-epoch resume on as many, fewer or more ranks.
//
// Everything that touches LibTorch runs in forked children (the parent only forks, kills and
// looks at files), like the other torch tests.
#include "dtrain/torch/checkpoint.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "dtrain/error.h"
#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/safetensors.h"
#include "support/expect.h"
#include "support/temp_dir.h"
#include "support/multiproc.h"
#include "torch/torch_test_support.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::expect_all_ok;
using testing::make_group;
using testing::run_ranks;

using testing::TempDir;

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// One training step of the small net on a batch drawn from `step`.
void train_step(testing::SmallNet& net, torch::optim::Optimizer& opt, int step) {
  auto b = testing::global_batch(step, 8);
  opt.zero_grad();
  torch::nn::functional::cross_entropy(net->forward(b.x), b.y).backward();
  opt.step();
}

bool same_tensors(torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = a.named_parameters();
  auto pb = b.named_parameters();
  for (const auto& p : pa)
    if (!p.value().equal(pb[p.key()])) return false;
  auto ba = a.named_buffers();
  auto bb = b.named_buffers();
  for (const auto& x : ba)
    if (!x.value().equal(bb[x.key()])) return false;
  return true;
}

// Saves after some steps, loads into a fresh net and optimizer, and checks that one more step on
// each gives bit-identical parameters: the optimizer state came back exactly.
template <typename Opt, typename Options>
void check_round_trip(Options options) {
  TempDir tmp;
  auto results = run_ranks(1, [&](int) {
    at::set_num_threads(1);
    auto net = testing::make_net(false);
    Opt opt(net->parameters(), options);
    for (int s = 0; s < 3; ++s) train_step(net, opt, s);
    CheckpointManager ckpt({.dir = tmp.path, .async = false});
    TrainingProgress p;
    p.step = 3;
    p.epoch = 1;
    p.epoch_consumed = 24;
    p.epoch_size = 100;
    p.values["loss"] = 1.25;
    ckpt.save(*net, &opt, p);
    const auto rng_before = torch::rand({4});  // what the generator gives after the save point

    torch::manual_seed(99);  // another generator state, weights, optimizer state
    testing::SmallNet fresh;
    Opt fresh_opt(fresh->parameters(), options);
    auto loaded = ckpt.load_latest(*fresh, &fresh_opt);
    RANK_CHECK(loaded.has_value(), "nothing loaded");
    RANK_CHECK(loaded->path == checkpoint_path(tmp.path, 3), "{}", loaded->path);
    RANK_CHECK(loaded->progress.step == 3 && loaded->progress.epoch == 1 &&
                   loaded->progress.epoch_consumed == 24 && loaded->progress.epoch_size == 100 &&
                   loaded->progress.world_size == 1 && loaded->progress.values.at("loss") == 1.25,
               "progress not restored");
    RANK_CHECK(loaded->skipped.empty(), "skipped {}", loaded->skipped.size());
    RANK_CHECK(torch::rand({4}).equal(rng_before), "generator state not restored");
    RANK_CHECK(same_tensors(*net, *fresh), "model state differs after load");
    fresh->train();
    train_step(net, opt, 3);
    train_step(fresh, fresh_opt, 3);
    train_step(net, opt, 4);
    train_step(fresh, fresh_opt, 4);
    RANK_CHECK(same_tensors(*net, *fresh), "two more steps differ: optimizer state not exact");
  });
  expect_all_ok(results);
}

TEST(Checkpoint, SgdWithMomentumRoundTripsExactly) {
  check_round_trip<torch::optim::SGD>(
      torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).dampening(0).weight_decay(1e-4));
}
TEST(Checkpoint, AdamRoundTripsExactly) {
  check_round_trip<torch::optim::Adam>(torch::optim::AdamOptions(0.01).amsgrad(true));
}
TEST(Checkpoint, AdamWRoundTripsExactly) {
  check_round_trip<torch::optim::AdamW>(torch::optim::AdamWOptions(0.01));
}

// copy_in_background: save() leaves the parameters and optimizer state to the writing thread, and
// the next step's forward and backward run meanwhile (the batch norm's running statistics, which
// that forward pass changes, are copied by save itself). Each checkpoint still holds exactly the
// state of its save: loading one and training on equals a twin net that never stopped.
TEST(Checkpoint, CopyingInTheBackgroundKeepsTheStateOfTheSave) {
  TempDir tmp;
  auto results = run_ranks(1, [&](int) {
    at::set_num_threads(1);
    const auto options = torch::optim::AdamOptions(0.01);
    auto net = testing::make_net(false);
    torch::optim::Adam opt(net->parameters(), options);
    auto twin = testing::make_net(false);
    torch::optim::Adam twin_opt(twin->parameters(), options);
    for (int s = 0; s < 3; ++s) {
      train_step(net, opt, s);
      train_step(twin, twin_opt, s);
    }
    CheckpointManager ckpt({.dir = tmp.path, .keep = 5, .copy_in_background = true});
    for (int s = 3; s < 6; ++s) {
      TrainingProgress p;
      p.step = s;
      ckpt.save(*net, &opt, p);
      auto b = testing::global_batch(s, 8);
      opt.zero_grad();
      torch::nn::functional::cross_entropy(net->forward(b.x), b.y).backward();
      ckpt.wait_copied();
      opt.step();
    }
    ckpt.wait();
    const CheckpointStats st = ckpt.stats();
    RANK_CHECK(st.saves == 3 && st.total_copy_ms > 0 && st.total_write_ms > 0,
               "stats: {} saves, {} ms copying, {} ms writing", st.saves, st.total_copy_ms,
               st.total_write_ms);
    for (int s = 3; s < 6; ++s) {
      torch::manual_seed(99);
      testing::SmallNet fresh;
      torch::optim::Adam fresh_opt(fresh->parameters(), options);
      auto loaded = ckpt.load(checkpoint_path(tmp.path, s), *fresh, &fresh_opt);
      RANK_CHECK(loaded.progress.step == s, "loaded step {}", loaded.progress.step);
      RANK_CHECK(same_tensors(*twin, *fresh), "checkpoint {} differs from the twin", s);
      train_step(twin, twin_opt, s);
      train_step(fresh, fresh_opt, s);
      RANK_CHECK(same_tensors(*twin, *fresh), "a step after checkpoint {} differs", s);
    }
  });
  expect_all_ok(results);
}

TEST(Checkpoint, RestoresHyperParametersAndRejectsAnotherOptimizer) {
  TempDir tmp;
  auto results = run_ranks(1, [&](int) {
    auto net = testing::make_net(false);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.5));
    train_step(net, opt, 0);
    CheckpointManager ckpt({.dir = tmp.path});  // async
    ckpt.save(*net, &opt, {.step = 1});
    ckpt.wait();
    torch::optim::SGD other(net->parameters(), torch::optim::SGDOptions(1.0));
    ckpt.load_latest(*net, &other);
    const auto& o = static_cast<torch::optim::SGDOptions&>(other.param_groups()[0].options());
    RANK_CHECK(o.lr() == 0.05 && o.momentum() == 0.5, "lr {} momentum {}", o.lr(), o.momentum());

    torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.1));
    try {
      ckpt.load_latest(*net, &adam);
      RANK_CHECK(false, "loading SGD state into Adam succeeded");
    } catch (const InvalidArgumentError& e) {
      RANK_CHECK(std::string(e.what()).find(
                     "SGD optimizer, but the optimizer to restore is Adam") != std::string::npos,
                 "{}", e.what());
    }
    torch::optim::RMSprop rms(net->parameters(), torch::optim::RMSpropOptions(0.1));
    try {
      ckpt.save(*net, &rms, {.step = 2});
      RANK_CHECK(false, "saving RMSprop succeeded");
    } catch (const InvalidArgumentError& e) {
      RANK_CHECK(std::string(e.what()).find("RMSprop is not supported (SGD, Adam and AdamW are)") !=
                     std::string::npos,
                 "{}", e.what());
    }
  });
  expect_all_ok(results);
}

TEST(Checkpoint, SavesAtomicallyAndKeepsTheNewestK) {
  TempDir tmp;
  const std::string dir = tmp.path + "/nested/ckpt";  // created by the writer
  auto results = run_ranks(1, [&](int) {
    auto net = testing::make_net(false);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    auto saved = testing::make_net(false);  // the state at the last save
    CheckpointManager ckpt({.dir = dir, .keep = 3});
    for (int s = 1; s <= 5; ++s) {
      train_step(net, opt, s);
      {
        torch::NoGradGuard no_grad;
        for (auto& p : saved->named_parameters()) p.value().copy_(net->named_parameters()[p.key()]);
        for (auto& b : saved->named_buffers()) b.value().copy_(net->named_buffers()[b.key()]);
      }
      ckpt.save(*net, &opt, {.step = s * 10});  // the write overlaps the next step
    }
    train_step(net, opt, 6);  // changes the weights while the last save may still be writing
    ckpt.wait();
    const auto st = ckpt.stats();
    RANK_CHECK(st.saves == 5 && st.bytes > 0 && st.write_ms > 0, "stats {} {} {}", st.saves,
               st.bytes, st.write_ms);
    auto fresh = testing::make_net(false);
    auto loaded = ckpt.load_latest(*fresh, nullptr);
    RANK_CHECK(loaded && loaded->progress.step == 50, "step 50 not loaded");
    RANK_CHECK(same_tensors(*fresh, *saved), "checkpoint 50 does not hold the state at its save");
  });
  expect_all_ok(results);
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"step-000030", "step-000040", "step-000050"}))
      << "the newest 3, and no temporary directory";
  EXPECT_EQ(entries(dir + "/step-000050"),
            (std::vector<std::string>{"manifest.json", "model.safetensors", "optimizer.safetensors",
                                      "rng.safetensors"}));
  std::ifstream manifest(dir + "/step-000050/manifest.json");
  std::string text((std::istreambuf_iterator<char>(manifest)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"step\": 50"), std::string::npos) << text;
  EXPECT_NE(text.find("optimizer.safetensors"), std::string::npos) << text;
  EXPECT_NE(text.find("\"momentum\": 0.9"), std::string::npos) << text;
}

// Writes checkpoints 1 and 2 of a fixed net, damages checkpoint 2 with `damage`, and expects the
// load to fall back to checkpoint 1 with a reason containing `expected_reason`.
void check_fallback(const std::function<void(const std::string& step2)>& damage,
                    const std::string& expected_reason) {
  TempDir tmp;
  auto results = run_ranks(1, [&](int) {
    auto net = testing::make_net(false);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    CheckpointManager ckpt({.dir = tmp.path, .async = false});
    train_step(net, opt, 0);
    ckpt.save(*net, &opt, {.step = 1});
    train_step(net, opt, 1);
    ckpt.save(*net, &opt, {.step = 2});
  });
  expect_all_ok(results);
  damage(checkpoint_path(tmp.path, 2));
  results = run_ranks(1, [&](int) {
    auto net = testing::make_net(false);
    auto ref = testing::make_net(false);
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    train_step(ref, ref_opt, 0);  // the state of checkpoint 1
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    CheckpointManager ckpt({.dir = tmp.path});
    auto loaded = ckpt.load_latest(*net, &opt);
    RANK_CHECK(loaded && loaded->progress.step == 1, "did not fall back to step 1");
    RANK_CHECK(same_tensors(*net, *ref), "step 1's weights not loaded");
    RANK_CHECK(loaded->skipped.size() == 1, "{} skipped", loaded->skipped.size());
    RANK_CHECK(loaded->skipped[0].find("step-000002") != std::string::npos &&
                   loaded->skipped[0].find(expected_reason) != std::string::npos,
               "reason: {}", loaded->skipped[0]);
    std::fprintf(stderr, "skipped as expected: %s\n", loaded->skipped[0].c_str());
  });
  expect_all_ok(results);
}

void flip_byte(const std::string& path, std::streamoff from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-from_end, std::ios::end);
  char c = 0;
  f.get(c);
  f.seekp(-from_end, std::ios::end);
  f.put(static_cast<char>(c ^ 0x5a));
}

TEST(Checkpoint, CorruptModelFileFallsBackToThePreviousCheckpoint) {
  check_fallback([](const std::string& d) { flip_byte(d + "/model.safetensors", 7); },
                 "model.safetensors is corrupt: CRC-32");
}
TEST(Checkpoint, TruncatedOptimizerFileFallsBackToThePreviousCheckpoint) {
  check_fallback(
      [](const std::string& d) {
        const auto p = d + "/optimizer.safetensors";
        fs::resize_file(p, fs::file_size(p) / 2);
      },
      "optimizer.safetensors has");
}
TEST(Checkpoint, TruncatedManifestFallsBackToThePreviousCheckpoint) {
  check_fallback(
      [](const std::string& d) {
        const auto p = d + "/manifest.json";
        fs::resize_file(p, fs::file_size(p) - 40);
      },
      "manifest.json is not valid JSON");
}
TEST(Checkpoint, EditedManifestFallsBackToThePreviousCheckpoint) {
  check_fallback(
      [](const std::string& d) {
        std::ifstream in(d + "/manifest.json");
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        auto at = text.find("\"step\": 2");
        ASSERT_NE(at, std::string::npos);
        text[at + 8] = '7';  // still valid JSON, wrong content
        std::ofstream(d + "/manifest.json", std::ios::trunc) << text;
      },
      "manifest.json is corrupt: CRC-32");
}

// A full disk names the file and the cause, not only "failed" (/dev/full: every write is ENOSPC).
TEST(Checkpoint, AFullDiskNamesTheFileAndTheCause) {
  torch::nn::Linear model(4, 2);
  try {
    save_module_state(*model, "/dev/full");
    FAIL() << "writing to /dev/full succeeded";
  } catch (const ResourceExhaustedError& e) {
    EXPECT_NE(std::string(e.what()).find("writing /dev/full failed: No space left on device"),
              std::string::npos)
        << e.what();
  }
}

TEST(Checkpoint, NoUsableCheckpointIsAClearError) {
  TempDir tmp;
  auto results = run_ranks(1, [&](int) {
    auto net = testing::make_net(false);
    CheckpointManager ckpt({.dir = tmp.path, .async = false});
    RANK_CHECK(!ckpt.load_latest(*net, nullptr).has_value(), "loaded from an empty directory");
    ckpt.save(*net, nullptr, {.step = 4});
    flip_byte(checkpoint_path(tmp.path, 4) + "/model.safetensors", 1);
    try {
      ckpt.load_latest(*net, nullptr);
      RANK_CHECK(false, "a corrupt checkpoint loaded");
    } catch (const DataLossError& e) {
      const std::string m = e.what();
      RANK_CHECK(
          m.find("none of the 1 checkpoints in " + tmp.path + " is usable") != std::string::npos &&
              m.find("model.safetensors is corrupt") != std::string::npos,
          "{}", m);
    }
    // A checkpoint saved without an optimizer cannot silently leave one at its initial state.
    ckpt.save(*net, nullptr, {.step = 5});
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
    try {
      ckpt.load_latest(*net, &opt);
      RANK_CHECK(false, "optimizer state appeared from nowhere");
    } catch (const InvalidArgumentError& e) {
      RANK_CHECK(std::string(e.what()).find("holds no optimizer state") != std::string::npos, "{}",
                 e.what());
    }
  });
  expect_all_ok(results);
}

pid_t fork_child(const std::function<void()>& fn) {
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid == 0) {
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      ::_exit(1);
    }
    ::_exit(0);
  }
  return pid;
}

bool wait_for_file(const std::string& path, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!fs::exists(path)) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

// Deterministic: the writer is killed after the first file of checkpoint 2 is durable, before
// its manifest. Checkpoint 1 must load, and the half-written one must be cleaned up.
TEST(Checkpoint, KilledDuringASaveLeavesThePreviousCheckpoint) {
  TempDir tmp;
  const std::string marker = tmp.path + "/writing";
  const std::string dir = tmp.path + "/ckpt";
  pid_t writer = fork_child([&] {
    auto net = testing::make_net(false);
    CheckpointOptions o{.dir = dir};
    o.after_file = [&](const std::string& file) {
      if (file.find("step-000002") == std::string::npos) return;
      std::ofstream(marker) << file;
      std::this_thread::sleep_for(60s);  // killed here
    };
    CheckpointManager ckpt(o);
    ckpt.save(*net, nullptr, {.step = 1});
    {
      torch::NoGradGuard no_grad;
      for (auto& p : net->parameters()) p.add_(1.0);
    }
    ckpt.save(*net, nullptr, {.step = 2});
    ckpt.wait();
  });
  ASSERT_TRUE(wait_for_file(marker, 30s)) << "the writer never reached checkpoint 2";
  ::kill(writer, SIGKILL);
  int status = 0;
  ::waitpid(writer, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  const auto left = entries(dir);
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0], fmt::format(".step-000002.tmp-{}", writer));
  EXPECT_EQ(left[1], "step-000001");

  auto results = run_ranks(1, [&](int) {
    auto net = testing::make_net(false);
    auto ref = testing::make_net(false);
    CheckpointManager ckpt({.dir = dir});
    auto loaded = ckpt.load_latest(*net, nullptr);
    RANK_CHECK(loaded && loaded->progress.step == 1, "did not load step 1");
    RANK_CHECK(same_tensors(*net, *ref), "checkpoint 1 holds other weights");
  });
  expect_all_ok(results);
  EXPECT_EQ(entries(dir), std::vector<std::string>{"step-000001"}) << "the temporary stayed";
}

// Random points: a writer saving a 16 MiB model over and over (each save's weights all equal to
// its step) is SIGKILLed at several delays; what is left must load, with consistent weights.
TEST(Checkpoint, KilledAtAnyPointOfRepeatedSavesAlwaysLeavesALoadableCheckpoint) {
  TempDir tmp;
  const std::string dir = tmp.path + "/ckpt";
  auto make_model = [] {
    auto m = std::make_shared<torch::nn::LinearImpl>(2048, 2048);
    return m;
  };
  int64_t last_step = 0;
  for (int delay_ms : {5, 40, 90, 170}) {
    pid_t writer = fork_child([&] {
      at::set_num_threads(1);
      auto m = make_model();
      CheckpointManager ckpt({.dir = dir, .keep = 2, .async = false});
      for (int64_t s = last_step + 1;; ++s) {
        {
          torch::NoGradGuard no_grad;
          for (auto& p : m->parameters()) p.fill_(static_cast<float>(s));
        }
        ckpt.save(*m, nullptr, {.step = s});
      }
    });
    // The first checkpoint must exist before the kill counts.
    const auto first = checkpoint_path(dir, last_step + 1) + "/manifest.json";
    ASSERT_TRUE(wait_for_file(first, 30s));
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ::kill(writer, SIGKILL);
    ::waitpid(writer, nullptr, 0);
    auto results = run_ranks(1, [&](int) {
      auto m = make_model();
      CheckpointManager ckpt({.dir = dir, .keep = 2});
      auto loaded = ckpt.load_latest(*m, nullptr);
      RANK_CHECK(loaded.has_value(), "nothing loadable after a kill at {} ms", delay_ms);
      const float s = static_cast<float>(loaded->progress.step);
      for (auto& p : m->parameters())
        RANK_CHECK(p.eq(s).all().item<bool>(), "step {} holds other weights", s);
      RANK_CHECK(loaded->skipped.empty(), "a complete-looking checkpoint was corrupt: {}",
                 loaded->skipped.empty() ? "" : loaded->skipped[0]);
      std::ofstream(dir + "/../loaded") << loaded->progress.step;
    });
    expect_all_ok(results);
    std::ifstream in(tmp.path + "/loaded");
    in >> last_step;
    for (const auto& e : entries(dir))
      EXPECT_EQ(e.rfind("step-", 0), 0u) << "left behind after the load: " << e;
  }
}

// Rank 0 picks and both ranks load the same checkpoint; a rank that cannot read it fails every
// rank, naming itself.
TEST(Checkpoint, EveryRankLoadsTheCheckpointRankZeroPicked) {
  TempDir tmp;
  const int port = testing::free_port();
  auto results = run_ranks(
      2,
      [&](int rank) {
        at::set_num_threads(1);
        auto pg = make_group(rank, 2, port);
        auto net = testing::make_net(false);
        torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
        {
          CheckpointManager ckpt({.dir = tmp.path}, pg);
          train_step(net, opt, 0);
          ckpt.save(*net, &opt, {.step = 1, .epoch_consumed = 8});  // returns at once on rank 1
          train_step(net, opt, 1);
          ckpt.save(*net, &opt, {.step = 2, .epoch_consumed = 16});
          ckpt.wait();
          pg->barrier()->wait();
        }
        if (rank == 0) flip_byte(checkpoint_path(tmp.path, 2) + "/rng.safetensors", 3);
        pg->barrier()->wait();
        auto fresh = testing::make_net(false);
        torch::optim::SGD fresh_opt(fresh->parameters(),
                                    torch::optim::SGDOptions(0.1).momentum(0.9));
        CheckpointManager ckpt({.dir = tmp.path}, pg);
        auto loaded = ckpt.load_latest(*fresh, &fresh_opt);
        RANK_CHECK(loaded && loaded->progress.step == 1 && loaded->progress.epoch_consumed == 8 &&
                       loaded->progress.world_size == 2,
                   "rank {} did not load step 1", rank);
        RANK_CHECK(rank != 0 || loaded->skipped.size() == 1, "rank 0 should report step 2 skipped");
        for (const auto& p : fresh->parameters())
          RANK_CHECK(testing::same_on_all_ranks(*pg, p), "ranks loaded different weights");

        // Rank 1 looks in another directory, as on a host that does not share the filesystem.
        const std::string elsewhere = tmp.path + (rank == 0 ? "" : "/elsewhere");
        CheckpointManager split({.dir = elsewhere}, pg);
        try {
          split.load_latest(*fresh, &fresh_opt);
          RANK_CHECK(false, "rank {} loaded although rank 1 cannot", rank);
        } catch (const InvalidArgumentError& e) {
          const std::string m = e.what();
          std::fprintf(stderr, "rank %d failed as expected: %s\n", rank, m.c_str());
          if (rank == 0)
            RANK_CHECK(m.find("rank(s) [1] could not load checkpoint") != std::string::npos, "{}",
                       m);
          else
            RANK_CHECK(m.find("must be on a filesystem every rank sees") != std::string::npos, "{}",
                       m);
        }
      },
      60s);
  expect_all_ok(results);
}

// ---- the sampler's mid-epoch resume -------------------------------------------------------

// What `world` ranks train of the rest of an epoch from `consumed` on, in `batch`-sized steps,
// until each has trained `steps` batches (all steps when negative). Returns the samples and the
// epoch's position afterwards.
std::pair<std::vector<size_t>, size_t> train_part(size_t n, int world, size_t consumed,
                                                  size_t batch, int steps, bool drop_last) {
  std::vector<size_t> trained;
  size_t position = 0;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(n, world, r, /*shuffle=*/true, /*seed=*/5, drop_last);
    s.set_epoch(2, consumed);
    size_t take = steps < 0 ? s.indices().size() : std::min(s.indices().size(), steps * batch);
    trained.insert(trained.end(), s.indices().begin(), s.indices().begin() + take);
    position = s.consumed(take);
  }
  return {trained, position};
}

TEST(DistributedSamplerResume, SameWorldSizeContinuesWithTheSameIndices) {
  auto results = run_ranks(1, [&](int) {
    for (bool drop_last : {false, true}) {
      for (int world : {1, 2, 3}) {
        for (size_t k : {0, 1, 4, 7}) {
          for (int r = 0; r < world; ++r) {
            DistributedSampler whole(103, world, r, true, 9, drop_last);
            whole.set_epoch(4);
            DistributedSampler resumed(103, world, r, true, 9, drop_last);
            resumed.set_epoch(4, whole.consumed(k * 3));  // after k steps of 3
            std::vector<size_t> rest(
                whole.indices().begin() + std::min(whole.indices().size(), k * 3),
                whole.indices().end());
            RANK_CHECK(resumed.indices() == rest, "world {} rank {} after {} steps (drop_last {})",
                       world, r, k, drop_last);
          }
        }
      }
    }
    DistributedSampler a(50, 2, 1, true, 3), b(50, 2, 1, true, 3);
    a.set_epoch(1);
    b.set_epoch(1, 0);
    RANK_CHECK(a.indices() == b.indices(), "consumed = 0 must be the plain epoch");
    RANK_CHECK(a.consumed(100) == 50 && a.consumed(3) == 6, "consumed {} {}", a.consumed(100),
               a.consumed(3));
    b.set_epoch(1, 50);
    RANK_CHECK(b.indices().empty() && b.num_samples() == 0, "a finished epoch has nothing left");
  });
  expect_all_ok(results);
}

TEST(DistributedSamplerResume, ThreeToTwoRanksMidEpochTrainsEverySampleOnce) {
  auto results = run_ranks(1, [&](int) {
    // 120 samples, 3 ranks, batches of 4: 5 steps consume 60; 2 ranks train the other 60.
    auto [first, position] = train_part(120, 3, 0, 4, 5, false);
    RANK_CHECK(position == 60, "position {}", position);
    auto [rest, end] = train_part(120, 2, position, 4, -1, false);
    RANK_CHECK(end == 120, "end {}", end);
    std::multiset<size_t> all(first.begin(), first.end());
    all.insert(rest.begin(), rest.end());
    RANK_CHECK(all.size() == 120, "{} samples trained", all.size());
    for (size_t i = 0; i < 120; ++i)
      RANK_CHECK(all.count(i) == 1, "sample {} trained {} times", i, all.count(i));
  });
  expect_all_ok(results);
}

TEST(DistributedSamplerResume, UnevenRemaindersPadOrDropAsAWholeEpochWould) {
  auto results = run_ranks(1, [&](int) {
    // 101 samples, 3 ranks for 6 steps of 5 (90 consumed), then 2 ranks, then 4 ranks.
    for (bool drop_last : {false, true}) {
      auto [a, p1] = train_part(101, 3, 0, 5, 6, drop_last);
      auto [b, p2] = train_part(101, 2, p1, 1, 3, drop_last);   // 6 more: 96
      auto [c, p3] = train_part(101, 4, p2, 5, -1, drop_last);  // 5 left over 4 ranks
      RANK_CHECK(p1 == 90 && p2 == 96, "positions {} {}", p1, p2);
      std::map<size_t, int> count;
      for (const auto* part : {&a, &b, &c})
        for (size_t i : *part) ++count[i];
      int twice = 0, missing = 0;
      for (size_t i = 0; i < 101; ++i) {
        RANK_CHECK(count[i] <= 2, "sample {} trained {} times", i, count[i]);
        twice += count[i] == 2;
        missing += count[i] == 0;
      }
      if (drop_last) {
        RANK_CHECK(twice == 0 && missing == 1 && c.size() == 4, "drop_last: {} twice, {} missing",
                   twice, missing);
      } else {
        // 5 left over 4 ranks: 2 each, 3 of them padding from the epoch's first samples.
        RANK_CHECK(twice == 3 && missing == 0 && c.size() == 8 && p3 == 101,
                   "pad: {} twice, {} missing", twice, missing);
      }
    }
  });
  expect_all_ok(results);
}

}  // namespace
}  // namespace dtrain
