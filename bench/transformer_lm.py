"""A transformer language model of about 30M parameters on synthetic tokens: the model where
communication matters (135 MB of fp32 gradients against a few tokens of compute per rank),
shared by the benchmarks that need one (bench/torch_transformer.py).

    TransformerLM()              # 8 layers, width 512, 8 heads, vocabulary 8192: 33.7M parameters
    tokens(step, rank, batch, seq)   # the same synthetic batch for a (step, rank) everywhere
"""
import torch
import torch.nn as nn


class TransformerLM(nn.Module):
    def __init__(self, vocab=8192, width=512, layers=8, heads=8, ff=2048, max_seq=256):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(max_seq, width)
        layer = nn.TransformerEncoderLayer(width, heads, ff, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens):
        seq = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(seq, device=tokens.device)
        x = self.embed(tokens) + self.position(torch.arange(seq, device=tokens.device))
        return self.head(self.norm(self.blocks(x, mask=mask, is_causal=True)))


def tokens(step, rank, batch, seq, vocab=8192):
    """Inputs and next-token targets of one rank's batch at one step (deterministic)."""
    g = torch.Generator().manual_seed(step * 1000 + rank)
    t = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return t[:, :-1], t[:, 1:]


def parameters(model):
    return sum(p.numel() for p in model.parameters())

