// bench/transformer_lm.py's transformer language model in LibTorch, for the C++ benchmarks that
// need a model where communication matters: the same shapes and parameter count (33.7M: 8
// pre-norm layers of width 512, 8 heads, feed-forward 2048, vocabulary 8192), as a Sequential of
// units (embedding, each layer, norm and head) that ShardedDataParallel gathers one at a time.
// The arithmetic is the Python model's; its weights are drawn in another order, so the two models
// are not equal weight for weight.
#pragma once

#include <cmath>
#include <limits>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

namespace dtrain::bench {

struct TransformerShape {
  int64_t vocab = 8192, width = 512, layers = 8, heads = 8, ff = 2048, max_sequence = 256;
};

// Token and position embeddings: [batch, sequence] ids -> [batch, sequence, width].
class EmbeddingsImpl : public torch::nn::Module {
 public:
  explicit EmbeddingsImpl(const TransformerShape& s)
      : token(register_module("token", torch::nn::Embedding(s.vocab, s.width))),
        position(register_module("position", torch::nn::Embedding(s.max_sequence, s.width))) {}
  at::Tensor forward(const at::Tensor& ids) {
    return token->forward(ids) + position->forward(torch::arange(ids.size(1)));
  }
  torch::nn::Embedding token, position;
};
TORCH_MODULE(Embeddings);

// One pre-norm layer, as torch's TransformerEncoderLayer(norm_first=True, activation=relu,
// dropout=0) with a causal mask: x + attention(norm1(x)), then h + ff(norm2(h)).
class LayerImpl : public torch::nn::Module {
 public:
  explicit LayerImpl(const TransformerShape& s)
      : heads_(s.heads),
        norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.width})))),
        qkv(register_module("qkv", torch::nn::Linear(s.width, 3 * s.width))),
        out(register_module("out", torch::nn::Linear(s.width, s.width))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.width})))),
        linear1(register_module("linear1", torch::nn::Linear(s.width, s.ff))),
        linear2(register_module("linear2", torch::nn::Linear(s.ff, s.width))) {}

  at::Tensor forward(const at::Tensor& x) {
    const int64_t batch = x.size(0), length = x.size(1), width = x.size(2);
    auto parts = qkv->forward(norm1->forward(x)).chunk(3, -1);
    auto split = [&](const at::Tensor& t) {  // [batch, heads, length, width / heads]
      return t.reshape({batch, length, heads_, width / heads_}).transpose(1, 2);
    };
    at::Tensor scores = at::matmul(split(parts[0]), split(parts[1]).transpose(-2, -1)) /
                        std::sqrt(static_cast<double>(width / heads_));
    at::Tensor future = at::ones({length, length}, at::kBool).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
    at::Tensor context = at::matmul(at::softmax(scores, -1), split(parts[2]))
                             .transpose(1, 2)
                             .reshape({batch, length, width});
    at::Tensor h = x + out->forward(context);
    return h + linear2->forward(torch::relu(linear1->forward(norm2->forward(h))));
  }

 private:
  int64_t heads_;

 public:
  torch::nn::LayerNorm norm1;
  torch::nn::Linear qkv, out;
  torch::nn::LayerNorm norm2;
  torch::nn::Linear linear1, linear2;
};
TORCH_MODULE(Layer);

// The final norm and the vocabulary projection (no bias): [..., width] -> [..., vocab] logits.
class HeadImpl : public torch::nn::Module {
 public:
  explicit HeadImpl(const TransformerShape& s)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.width})))),
        projection(register_module(
            "projection", torch::nn::Linear(torch::nn::LinearOptions(s.width, s.vocab).bias(false)))) {}
  at::Tensor forward(const at::Tensor& x) { return projection->forward(norm->forward(x)); }
  torch::nn::LayerNorm norm;
  torch::nn::Linear projection;
};
TORCH_MODULE(Head);

inline torch::nn::Sequential make_transformer_lm(const TransformerShape& s = {}) {
  torch::nn::Sequential model;
  model->push_back("embed", Embeddings(s));
  for (int64_t i = 0; i < s.layers; ++i) model->push_back("layer" + std::to_string(i), Layer(s));
  model->push_back("head", Head(s));
  return model;
}

// bench/transformer_lm.py's tokens(): the inputs and next-token targets of one rank's batch at
// one step, drawn by the same generator from the same seed (LibTorch and torch draw alike).
inline std::pair<at::Tensor, at::Tensor> tokens(int64_t step, int64_t rank, int64_t batch,
                                                int64_t sequence, int64_t vocab = 8192) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(step * 1000 + rank));
  at::Tensor t = at::randint(0, vocab, {batch, sequence + 1}, g);
  return {t.slice(1, 0, sequence), t.slice(1, 1, sequence + 1)};
}

}  // namespace dtrain::bench
