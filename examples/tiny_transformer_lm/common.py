"""What train.py (1-bit Adam through onebit) and ddp_adam.py (Adam over DDP) share: the
corpus, the model, the batches and the held-out evaluation."""
import math
import os

import torch
from torch import nn

LICENSES = "/usr/share/common-licenses"  # Debian's base-files: always installed
CORPUS = ["GPL-3", "GPL-2", "LGPL-2.1", "LGPL-3", "Apache-2.0", "MPL-2.0", "GFDL-1.3",
          "Artistic", "MPL-1.1"]
HELD_OUT = 0.1  # the last tenth of the text is never trained on
BLOCK = 64      # characters of context


def load_corpus():
    """(train ids, held-out ids, vocabulary): the license texts concatenated, as character
    ids over the characters that occur anywhere in them."""
    texts = []
    for name in CORPUS:
        path = os.path.join(LICENSES, name)
        with open(path, encoding="utf-8") as f:
            texts.append(f.read())
    text = "\n\n".join(texts)
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    split = int(len(ids) * (1 - HELD_OUT))
    return ids[:split], ids[split:], vocab


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a 4x MLP."""

    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class CharTransformer(nn.Module):
    """A 2-layer, d=64 character language model. The output layer is tied to the embedding:
    every row of it gets a gradient every step (a row that never did would keep ~0 variance
    into 1-bit Adam's compression stage, where its compressed momentum would move it far)."""

    def __init__(self, vocab, d=64, layers=2, heads=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(BLOCK, d))
        nn.init.normal_(self.pos, std=0.02)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        mask = torch.triu(torch.full((BLOCK, BLOCK), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.embed(ids) + self.pos[:t]
        for block in self.blocks:
            x = block(x, self.mask[:t, :t])
        return self.ln(x) @ self.embed.weight.t()


def make_model(seed, vocab):
    torch.manual_seed(seed)  # every rank (and the DDP baseline) starts from the same weights
    return CharTransformer(vocab)


def parameter_count(model):
    return sum(p.numel() for p in model.parameters())


def windows(ids, starts):
    """(inputs, next-character targets) of the BLOCK-long windows at `starts`."""
    x = torch.stack([ids[s:s + BLOCK] for s in starts.tolist()])
    y = torch.stack([ids[s + 1:s + BLOCK + 1] for s in starts.tolist()])
    return x, y


def batch(ids, seed, step, rank, batch_size):
    """Rank `rank`'s windows at `step`, drawn from a generator seeded with (seed, step, rank):
    the same under either optimizer."""
    g = torch.Generator().manual_seed((seed * 1000003 + step) * 1009 + rank)
    return windows(ids, torch.randint(0, len(ids) - BLOCK - 1, (batch_size,), generator=g))


def loss_of(model, x, y):
    logits = model(x)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def held_out_loss(model, ids, count=128):
    """Mean cross-entropy (nats/char) on `count` evenly spaced held-out windows."""
    model.eval()
    starts = torch.linspace(0, len(ids) - BLOCK - 2, count).long()
    x, y = windows(ids, starts)
    loss = loss_of(model, x, y).item()
    model.train()
    return loss


def bits_per_char(nats):
    return nats / math.log(2)
