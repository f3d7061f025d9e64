#!/usr/bin/env python3
"""FlashCore as the attention implementation of a small decoder, chosen by
name the way Hugging Face models choose theirs (config.attn_implementation,
a registry of attention functions). The model is built from torch modules
alone (random weights, nothing downloaded): RMSNorm, rotary embeddings,
grouped-query attention with a KV cache, a SwiGLU MLP. It generates tokens
greedily with "sdpa" (torch's scaled_dot_product_attention) and with
"flashcore", and prints both token sequences and the largest logit
difference.

    PYTHONPATH=python FLASHCORE_LIBRARY=build/libflashcore.so python3 examples/torch_decoder.py
    ... --device cuda --dtype bfloat16 --compile        (on a GPU machine)
"""

import argparse
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import flashcore

ATTENTION_FUNCTIONS = {}


def register(name):
    """Add an attention function to the registry under name."""
    def add(fn):
        ATTENTION_FUNCTIONS[name] = fn
        return fn
    return add


@register("sdpa")
def sdpa_attention(q, k, v):
    """q [B, Hq, L, D] over the cache k, v [B, Hkv, S, D] (S >= L): the new
    queries are the last L positions. torch's is_causal is top-left aligned,
    so a prefill (L == S) uses it, a one-token decode step needs no mask, and
    anything else gets the bottom-right mask spelled out."""
    L, S = q.shape[2], k.shape[2]
    if L == 1:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    if L == S:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    mask = torch.ones(L, S, dtype=torch.bool, device=q.device).tril(S - L)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


@register("flashcore")
def flashcore_attention(q, k, v):
    """FlashCore's causal mask is bottom-right aligned: the same call for a
    prefill, a decode step or a chunk after a cache."""
    return flashcore.attention(q, k, v, layout="bhsd", causal=True)


@dataclass
class Config:
    vocab: int = 256
    dim: int = 128
    heads: int = 8
    kv_heads: int = 2
    layers: int = 2
    hidden: int = 256
    attn_implementation: str = "sdpa"


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotate(x, pos):
    """Rotary position embedding of x [B, H, L, D] at positions pos [L]."""
    d = x.shape[-1] // 2
    freq = 10000.0 ** (-torch.arange(d, device=x.device, dtype=torch.float32) / d)
    ang = pos.float()[:, None] * freq[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.h, self.kvh, self.d = cfg.heads, cfg.kv_heads, cfg.dim // cfg.heads
        self.q = torch.nn.Linear(cfg.dim, self.h * self.d, bias=False)
        self.kv = torch.nn.Linear(cfg.dim, 2 * self.kvh * self.d, bias=False)
        self.o = torch.nn.Linear(self.h * self.d, cfg.dim, bias=False)

    def forward(self, x, pos, cache):
        B, L, _ = x.shape
        q = self.q(x).view(B, L, self.h, self.d).transpose(1, 2)
        k, v = self.kv(x).view(B, L, 2, self.kvh, self.d).permute(2, 0, 3, 1, 4)
        q, k = rotate(q, pos), rotate(k, pos)
        if cache is not None:
            k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
        y = ATTENTION_FUNCTIONS[self.cfg.attn_implementation](q, k, v)
        return self.o(y.transpose(1, 2).reshape(B, L, -1)), (k, v)


class Block(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(cfg.dim), RMSNorm(cfg.dim)
        self.attn = Attention(cfg)
        self.up = torch.nn.Linear(cfg.dim, 2 * cfg.hidden, bias=False)
        self.down = torch.nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x, pos, cache):
        a, cache = self.attn(self.norm1(x), pos, cache)
        x = x + a
        gate, up = self.up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up), cache


class Decoder(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed = torch.nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = torch.nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim)
        self.head = torch.nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, ids, start, caches):
        """Logits [B, L, vocab] of the tokens ids [B, L] at positions
        start.., and the updated caches (one (k, v) per block)."""
        x = self.embed(ids)
        pos = torch.arange(start, start + ids.shape[1], device=ids.device)
        new = []
        for block, cache in zip(self.blocks, caches):
            x, cache = block(x, pos, cache)
            new.append(cache)
        return self.head(self.norm(x)), new


@torch.no_grad()
def generate(model, prompt, steps, step_fn=None):
    """Greedy decoding: (token ids [B, len(prompt) + steps], the logits of
    each generated token [B, steps, vocab])."""
    step_fn = model if step_fn is None else step_fn
    logits, caches = step_fn(prompt, 0, [None] * len(model.blocks))
    ids, out = prompt, []
    for _ in range(steps):
        out.append(logits[:, -1])
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat((ids, nxt), dim=1)
        logits, caches = step_fn(nxt, ids.shape[1] - 1, caches)
    return ids, torch.stack(out, dim=1)


def compare(device="cpu", dtype=torch.float32, batch=2, prompt_len=12, steps=16, compile=None,
            seed=0):
    """Generate with "sdpa" then "flashcore" on the same weights and prompt:
    (ids per implementation, logits per implementation). compile: None
    (eager) or a torch.compile backend ("inductor", "aot_eager", ...)."""
    torch.manual_seed(seed)
    model = Decoder(Config()).to(device, dtype).eval()
    prompt = torch.randint(0, model.cfg.vocab, (batch, prompt_len), device=device)
    ids, logits = {}, {}
    for name in ("sdpa", "flashcore"):
        model.cfg.attn_implementation = name
        step = torch.compile(model, fullgraph=True, dynamic=True, backend=compile) if compile else None
        ids[name], logits[name] = generate(model, prompt, steps, step)
    return ids, logits


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                    help="torch.compile(fullgraph=True) each step (default backend: inductor)")
    a = ap.parse_args()
    ids, logits = compare(a.device, getattr(torch, a.dtype), steps=a.steps, compile=a.compile)
    for name, x in ids.items():
        print("%-9s %s" % (name, x[0].tolist()))
    diff = (logits["sdpa"].float() - logits["flashcore"].float()).abs().max().item()
    print("same tokens: %s; max |logit difference| %.3g" % (torch.equal(ids["sdpa"], ids["flashcore"]), diff))


if __name__ == "__main__":
    main()
