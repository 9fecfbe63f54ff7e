// ctr_sparse: a click-through-rate model trained through the parameter server, on data the
// example generates from a known model, so it can say how close training gets to the truth.
//
//   build/bin/dtrain run --servers 2 -n 2 -- build/bin/ctr_sparse --steps 1500
//
// Data: each sample has --fields categorical features (ids drawn from a Zipf distribution over
// --vocab values per field, hashed into one 64-bit id space) and 4 dense features. The generating
// model gives every id a hidden weight w*(id) ~ N(0, 0.7) and the label is
// Bernoulli(sigmoid(sum of the ids' w* + v*.x + b*)).
// Model: a sparse table of embeddings (width --dim, one row per id, created on first touch; far
// more ids exist than any worker ever holds) and a dense part [u, v, b]:
// logit = sum over fields of e(id).u + v.x + b. Both tables live on the servers, which run Adagrad.
// At the end worker 0 compares, on held-out samples, the learned model's log loss with the
// generating model's (the best possible) and a constant predictor's, and prints
//   RESULT {"test_logloss":..., "generating_logloss":..., "constant_logloss":..., ...}
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <unordered_map>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dtrain/ps.h"

namespace {

using Clock = std::chrono::steady_clock;

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

constexpr int kDense = 4;

struct Sample {
  std::vector<uint64_t> ids;  // one per field
  float x[kDense];
  float label;
  double true_logit;
};

// The generating model and a sampler of its data.
class World {
 public:
  World(int fields, int vocab, double zipf, uint64_t seed) : fields_(fields), seed_(seed) {
    cdf_.resize(vocab);
    double total = 0;
    for (int k = 0; k < vocab; ++k) cdf_[k] = total += 1.0 / std::pow(k + 1.0, zipf);
    for (double& c : cdf_) c /= total;
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> n(0.0, 1.0);
    for (double& v : v_) v = n(rng);
  }

  // Hidden weight of an id: N(0, 0.7) from the id's hash (Box-Muller).
  double weight(uint64_t id) const {
    uint64_t h = mix(id ^ seed_);
    double u1 = ((h >> 11) + 1.0) * 0x1p-53, u2 = (mix(h) >> 11) * 0x1p-53;
    return 0.7 * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

  Sample draw(std::mt19937_64& rng) const {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::normal_distribution<float> n(0.0f, 1.0f);
    Sample s;
    double logit = -1.0;
    for (int f = 0; f < fields_; ++f) {
      uint64_t value = std::lower_bound(cdf_.begin(), cdf_.end(), u(rng)) - cdf_.begin();
      uint64_t id = (static_cast<uint64_t>(f) << 48) | value;
      s.ids.push_back(id);
      logit += weight(id);
    }
    for (int j = 0; j < kDense; ++j) {
      s.x[j] = n(rng);
      logit += v_[j] * s.x[j];
    }
    s.true_logit = logit;
    s.label = u(rng) < 1.0 / (1.0 + std::exp(-logit)) ? 1.0f : 0.0f;
    return s;
  }

 private:
  int fields_;
  uint64_t seed_;
  std::vector<double> cdf_;
  double v_[kDense];
};

double logloss(double p, float y) {
  p = std::clamp(p, 1e-7, 1 - 1e-7);
  return y > 0.5f ? -std::log(p) : -std::log(1 - p);
}

// The learned model for one batch: distinct ids and their rows, and the dense part.
struct Model {
  int dim;
  std::vector<uint64_t> ids;
  std::unordered_map<uint64_t, size_t> row_of;
  std::vector<float> rows;   // ids.size() * dim
  std::vector<float> dense;  // u (dim), v (kDense), b

  float* u() { return dense.data(); }
  float* v() { return dense.data() + dim; }
  float& b() { return dense[dim + kDense]; }

  void index(const std::vector<Sample>& batch) {
    ids.clear();
    row_of.clear();
    for (const auto& s : batch)
      for (uint64_t id : s.ids)
        if (row_of.emplace(id, ids.size()).second) ids.push_back(id);
    rows.assign(ids.size() * dim, 0.0f);
  }

  double logit(const Sample& s) {
    double z = b();
    for (uint64_t id : s.ids) {
      const float* e = &rows[row_of.at(id) * dim];
      for (int j = 0; j < dim; ++j) z += e[j] * u()[j];
    }
    for (int j = 0; j < kDense; ++j) z += v()[j] * s.x[j];
    return z;
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ctr_sparse: a sparse CTR model trained through the parameter server"};
  app.option_defaults()->always_capture_default();  // --help shows every default
  int steps = 1500, batch = 256, fields = 8, vocab = 200'000, dim = 8, eval = 20'000;
  double zipf = 1.1, lr = 0.05;
  uint64_t seed = 1;
  std::string mode = "async";
  uint32_t staleness = 2;
  app.add_option("--steps", steps, "Steps per worker");
  app.add_option("--batch-size", batch, "Samples per step per worker");
  app.add_option("--fields", fields, "Categorical features per sample");
  app.add_option("--vocab", vocab, "Distinct values per field");
  app.add_option("--zipf", zipf, "Zipf exponent of the id distribution");
  app.add_option("--dim", dim, "Embedding width");
  app.add_option("--lr", lr, "Adagrad learning rate");
  app.add_option("--eval", eval, "Held-out samples (worker 0)");
  app.add_option("--seed", seed, "Seed of the generating model");
  app.add_option("--ps-mode", mode, "sync, async or ssp")->check(CLI::IsMember({"sync", "async", "ssp"}));
  app.add_option("--staleness", staleness, "SSP: how many steps a worker may lead the slowest");
  CLI11_PARSE(app, argc, argv);

  try {
    auto client = dtrain::ps::Client::from_env();
    const int worker = client->worker();
    World world(fields, vocab, zipf, seed);

    dtrain::ps::TableOptions table;
    table.optimizer.kind = dtrain::ps::OptimizerOptions::Kind::kAdagrad;
    table.optimizer.lr = static_cast<float>(lr);
    table.optimizer.initial_accumulator = 0.1f;
    table.consistency = mode == "sync"    ? dtrain::ps::Consistency::kSync
                        : mode == "async" ? dtrain::ps::Consistency::kAsync
                                          : dtrain::ps::Consistency::kBounded;
    table.staleness = staleness;
    dtrain::ps::SparseTableOptions emb;
    emb.width = static_cast<size_t>(dim);
    emb.init = {dtrain::ps::RowInit::Kind::kNormal, 0.0f, 0.1f, 42};
    emb.table = table;
    client->create_sparse("embedding", emb);
    Model m;
    m.dim = dim;
    m.dense.assign(dim + kDense + 1, 0.0f);
    for (int j = 0; j < dim; ++j) m.u()[j] = 0.1f;
    client->create_dense("dense", dtrain::TensorView::of(m.dense), table);

    std::mt19937_64 rng(seed * 1000 + 17 + worker);
    std::vector<Sample> data(batch);
    std::vector<float> row_grads, dense_grad(m.dense.size());
    const auto start = Clock::now();
    double recent = 0;
    for (int step = 1; step <= steps; ++step) {
      for (auto& s : data) s = world.draw(rng);
      m.index(data);
      auto rows = client->pull_rows("embedding", m.ids, dtrain::TensorView::of(m.rows));
      auto dense = client->pull("dense", dtrain::TensorView::of(m.dense));
      rows.wait();
      dense.wait();
      // Backward: d loss / d logit = p - y, averaged over the batch.
      row_grads.assign(m.rows.size(), 0.0f);
      std::fill(dense_grad.begin(), dense_grad.end(), 0.0f);
      double loss = 0;
      for (const auto& s : data) {
        double z = m.logit(s), p = 1.0 / (1.0 + std::exp(-z));
        loss += logloss(p, s.label);
        const float g = static_cast<float>((p - s.label) / batch);
        for (uint64_t id : s.ids) {
          const size_t r = m.row_of.at(id) * dim;
          for (int j = 0; j < dim; ++j) {
            row_grads[r + j] += g * m.u()[j];
            dense_grad[j] += g * m.rows[r + j];
          }
        }
        for (int j = 0; j < kDense; ++j) dense_grad[dim + j] += g * s.x[j];
        dense_grad[dim + kDense] += g;
      }
      recent = step == 1 ? loss / batch : 0.98 * recent + 0.02 * loss / batch;
      auto push_rows = client->push_rows("embedding", m.ids, dtrain::TensorView::of(row_grads));
      auto push_dense = client->push("dense", dtrain::TensorView::of(dense_grad));
      push_rows.wait();
      push_dense.wait();
      if (worker == 0 && (step % 250 == 0 || step == steps))
        std::printf("step %d/%d  train loss %.4f  %.0f samples/s (this worker)\n", step, steps,
                    recent,
                    step * batch / std::chrono::duration<double>(Clock::now() - start).count());
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();

    if (worker == 0) {
      // Held-out data from another stream of the same generating model.
      std::mt19937_64 test_rng(seed * 1000 + 999'983);
      std::vector<Sample> test(eval);
      for (auto& s : test) s = world.draw(test_rng);
      m.index(test);
      client->pull_rows("embedding", m.ids, dtrain::TensorView::of(m.rows)).wait();
      client->pull("dense", dtrain::TensorView::of(m.dense)).wait();
      double learned = 0, truth = 0, constant = 0, positives = 0;
      double sxy = 0, sx = 0, sy = 0, sxx = 0, syy = 0;
      for (const auto& s : test) positives += s.label;
      const double base = positives / eval;
      for (const auto& s : test) {
        double z = m.logit(s);
        learned += logloss(1 / (1 + std::exp(-z)), s.label);
        truth += logloss(1 / (1 + std::exp(-s.true_logit)), s.label);
        constant += logloss(base, s.label);
        sx += z, sy += s.true_logit, sxy += z * s.true_logit, sxx += z * z,
            syy += s.true_logit * s.true_logit;
      }
      const double n = eval;
      const double corr = (n * sxy - sx * sy) / std::sqrt((n * sxx - sx * sx) * (n * syy - sy * sy));
      std::printf("test log loss %.4f; the generating model's %.4f (the best possible), a constant "
                  "predictor's %.4f; correlation of learned and true logits %.3f\n",
                  learned / n, truth / n, constant / n, corr);
      nlohmann::json result = {{"mode", mode},
                               {"servers", client->num_servers()},
                               {"steps", steps},
                               {"samples_per_sec_worker0", steps * batch / seconds},
                               {"test_logloss", learned / n},
                               {"generating_logloss", truth / n},
                               {"constant_logloss", constant / n},
                               {"logit_correlation", corr}};
      std::printf("RESULT %s\n", result.dump().c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ctr_sparse: %s\n", e.what());
    return 1;
  }
  return 0;
}
