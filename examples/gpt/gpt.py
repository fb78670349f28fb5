"""A decoder-only (GPT-style) language model and its data, shared by every run of
examples/gpt/train.py: the same corpus, windows, model and initial weights under each
optimizer.

Sizes (SIZES): "small" is the emulated-cluster model (byte-level, 10.8M parameters, sized so
that on 2 cores the exchange dominates DDP's step at 100 Mbit/s); "gpt2" is GPT-2 small's
shape (124M parameters: 12 layers, d=768, 12 heads, 1,024 tokens of context, vocabulary
50,304) for a GPU, on synthetic tokens; "1b" has 1.07B parameters in the same shape (22
layers, d=1,920, 512 tokens of context), for timing an optimizer step at that size
(tools/gpu/step_bench.py); "gpt2_host" has GPT-2 small's 148 tensors at 162K parameters, so
that an optimizer step's time is its fixed cost on the host (the same script).

The corpus is GCIDE, the Collaborative International Dictionary of English, from Debian's
dict-gcide (/usr/share/dictd/gcide.dict.dz, a gzip-compatible dictzip file, 40 MB of text),
read as bytes (vocabulary 256); the last 2% is held out.
"""
import gzip
import math
import os
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

GCIDE = "/usr/share/dictd/gcide.dict.dz"
HELD_OUT = 0.02


@dataclass(frozen=True)
class Size:
    layers: int
    d: int
    heads: int
    block: int  # tokens of context
    vocab: int


SIZES = {
    "tiny": Size(layers=2, d=64, heads=4, block=64, vocab=256),      # tests
    "small": Size(layers=6, d=384, heads=6, block=128, vocab=256),   # 10.8M, the cluster runs
    "gpt2_host": Size(layers=12, d=32, heads=4, block=32, vocab=256),  # GPT-2's 148 tensors, tiny
    "gpt2": Size(layers=12, d=768, heads=12, block=1024, vocab=50304),  # 124M, GPU
    "1b": Size(layers=22, d=1920, heads=16, block=512, vocab=50304),  # 1.07B, GPU (timing)
}


def load_corpus(path=GCIDE, limit_bytes=None):
    """(train, held-out): the corpus's bytes as int64 token ids, the last HELD_OUT held out.
    limit_bytes reads only the start (a quick run)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: apt-get install dict-gcide "
                                "(or run with --data synthetic)")
    with gzip.open(path, "rb") as f:
        data = f.read(limit_bytes) if limit_bytes else f.read()
    ids = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    split = int(len(ids) * (1 - HELD_OUT))
    return ids[:split], ids[split:]


def synthetic_corpus(vocab, tokens=1 << 22, seed=0):
    """Random tokens (for timing on a GPU: the model's cost does not depend on them)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (tokens,), generator=g)
    split = int(len(ids) * (1 - HELD_OUT))
    return ids[:split], ids[split:]


def batch(ids, block, seed, step, rank, batch_size):
    """Rank `rank`'s (inputs, next-token targets) at `step`: batch_size windows at offsets
    drawn from a generator seeded by (seed, step, rank), so every optimizer sees the same."""
    g = torch.Generator().manual_seed((seed * 1000003 + step) * 1009 + rank)
    starts = torch.randint(0, len(ids) - block - 1, (batch_size,), generator=g)
    x = torch.stack([ids[s:s + block] for s in starts.tolist()])
    y = torch.stack([ids[s + 1:s + block + 1] for s in starts.tolist()])
    return x, y


class CausalSelfAttention(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.heads = size.heads
        self.qkv = nn.Linear(size.d, 3 * size.d)
        self.proj = nn.Linear(size.d, size.d)
        mask = torch.triu(torch.full((size.block, size.block), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        sdpa = getattr(F, "scaled_dot_product_attention", None)  # PyTorch 2 (flash on GPUs)
        if sdpa is not None:
            y = sdpa(q, k, v, is_causal=True)
        else:  # PyTorch 1.13 (Debian's)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1]) + self.mask[:t, :t]
            y = att.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-norm: x + attention(LN(x)), then x + MLP(LN(x)) with a 4x GELU MLP."""

    def __init__(self, size):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(size.d), nn.LayerNorm(size.d)
        self.attn = CausalSelfAttention(size)
        self.mlp = nn.Sequential(nn.Linear(size.d, 4 * size.d), nn.GELU(),
                                 nn.Linear(4 * size.d, size.d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and learned position embeddings, pre-norm blocks, a final LayerNorm and an
    output layer tied to the token embedding (GPT-2's layout). Every parameter gets a
    gradient on every step."""

    def __init__(self, size):
        super().__init__()
        self.size = size
        self.embed = nn.Embedding(size.vocab, size.d)
        self.pos = nn.Parameter(torch.zeros(size.block, size.d))
        self.blocks = nn.ModuleList(Block(size) for _ in range(size.layers))
        self.ln = nn.LayerNorm(size.d)
        for name, p in self.named_parameters():  # GPT-2's initialisation
            if name.endswith("weight") and p.dim() == 2 or name in ("pos", "embed.weight"):
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        for block in self.blocks:  # residual projections scaled by depth
            for p in (block.attn.proj.weight, block.mlp[2].weight):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * size.layers))

    def forward(self, ids):
        x = self.embed(ids) + self.pos[:ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.embed.weight.t()


def make_model(size, seed):
    torch.manual_seed(seed)  # every rank, and every optimizer, starts from the same weights
    return GPT(size)


def loss_of(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))


@torch.no_grad()
def held_out_loss(model, ids, block, count=64, device="cpu"):
    """Mean cross-entropy (nats/token) on `count` evenly spaced held-out windows."""
    model.eval()
    starts = torch.linspace(0, len(ids) - block - 2, count).long().tolist()
    total = 0.0
    for i in range(0, count, 16):
        s = starts[i:i + 16]
        x = torch.stack([ids[j:j + block] for j in s]).to(device)
        y = torch.stack([ids[j + 1:j + block + 1] for j in s]).to(device)
        total += loss_of(model, x, y).item() * len(s)
    model.train()
    return total / count


def parameter_count(model):
    return sum(p.numel() for p in model.parameters())
