"""The ring of flashcore.distributed over packed variable-length batches:
each rank holds, for every sequence of the batch, its slice of that
sequence (q, k, v [total, H, D] and int32 cu_seqlens of the rank's
per-sequence slices, the same count of sequences on every rank). The split
is per sequence, as the dense ring's: 'contiguous' (a rank's run of each
sequence) or 'zigzag' (chunks r and 2P - 1 - r of each sequence, a slice
of n tokens read as ceil(n / 2) and the rest; any lengths, empty slices
and chunks included). A pair of chunks is one varlen call over every
sequence at once (the sequences' chunk rows gathered into one packed
batch), its results scattered back; the mask rules, the fp32 merge and
the travelling fp32 dK/dV sums are the dense ring's (distributed.py).
"""

from . import _attention, _backward


def _torch():
    import torch
    return torch


def _span(a, e, zigzag, w):
    """Rows [lo, hi) of chunk w of a sequence's slice [a, e)."""
    if not zigzag:
        return a, e
    mid = a + (e - a) - (e - a) // 2
    return (a, mid) if w == 0 else (mid, e)


class _Chunks:
    """A slice's chunks: per chunk w, the rows it gathers (int64 index),
    its cu_seqlens (int32) and longest sequence."""

    def __init__(self, cu, zigzag, device):
        torch = _torch()
        starts, ends = cu[:-1], cu[1:]
        parts = []
        for w in range(2 if zigzag else 1):
            spans = [_span(a, e, zigzag, w) for a, e in zip(starts, ends)]
            rows = [torch.arange(lo, hi, dtype=torch.int64) for lo, hi in spans]
            offs = [0]
            for lo, hi in spans:
                offs.append(offs[-1] + hi - lo)
            parts.append((torch.cat(rows).to(device) if rows else torch.zeros(0, dtype=torch.int64, device=device),
                          torch.tensor(offs, dtype=torch.int32, device=device),
                          max((hi - lo for lo, hi in spans), default=0)))
        self.parts = parts

    def rows(self):
        return [p[0].numel() for p in self.parts]


def _call_args(plan, ring, mine, theirs, i, j, causal):
    _, ci, mi = mine.parts[i]
    _, cj, mj = theirs.parts[j]
    return ring.options(plan, causal, cu_seqlens_q=ci, cu_seqlens_k=cj, max_seqlen_q=mi, max_seqlen_k=mj)


def _every_rank(plan, device):
    """Every rank's chunks, from the cu_seqlens all ranks hold (plan.cu:
    per rank, a list, gathered once per call: no device read per step)."""
    return [_Chunks(c, plan.split == "zigzag", device) for c in plan.cu]


def forward(q, k, v, plan, ring):
    """This rank's out [total, Hq, D] and lse [Hq, total] (float32)."""
    torch = _torch()
    chunks = _every_rank(plan, q.device)
    mine = chunks[plan.rank]
    qs = [q.index_select(0, p[0]) for p in mine.parts]
    accs = [None] * len(qs)
    held = (k.contiguous(), v.contiguous())
    for step in range(plan.size):
        src = (plan.rank - step) % plan.size
        nxt, reqs = ring.exchange(held, plan, (src - 1) % plan.size) if step < plan.size - 1 else (None, [])
        theirs = chunks[src]
        for i, j, causal in ring.pairs(plan, src, mine.rows(), theirs.rows()):
            idx = theirs.parts[j][0]
            part = _attention.attention(qs[i], held[0].index_select(0, idx), held[1].index_select(0, idx),
                                        return_lse=True, **_call_args(plan, ring, mine, theirs, i, j, causal))
            accs[i] = ring.fold(accs[i], part, plan)
        ring.wait(reqs)
        held = nxt
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
    for (idx, _, _), acc in zip(mine.parts, accs):
        if acc is not None:
            out.index_copy_(0, idx, acc[0].to(q.dtype))
            lse.index_copy_(1, idx, acc[1])
    return out, lse


def backward(dout, q, k, v, out, lse, plan, ring):
    """dq, dk, dv of this rank's slice (q's, k's, v's dtypes)."""
    torch = _torch()
    chunks = _every_rank(plan, q.device)
    mine = chunks[plan.rank]
    sel = [(q.index_select(0, p[0]), dout.index_select(0, p[0]), out.index_select(0, p[0]),
            lse.index_select(1, p[0]).contiguous()) for p in mine.parts]
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    held = (k.contiguous(), v.contiguous())
    acc, acc_reqs, sent = None, [], None
    for step in range(plan.size):
        src = (plan.rank - step) % plan.size
        nxt, reqs = ring.exchange(held, plan, (src - 1) % plan.size) if step < plan.size - 1 else (None, [])
        theirs = chunks[src]
        part = tuple(torch.zeros(x.shape, dtype=torch.float32, device=x.device) for x in held)
        for i, j, causal in ring.pairs(plan, src, mine.rows(), theirs.rows()):
            idx = theirs.parts[j][0]
            qi, doi, oi, li = sel[i]
            g = _backward.attention_backward(doi, qi, held[0].index_select(0, idx), held[1].index_select(0, idx),
                                             oi, li, deterministic=plan.deterministic,
                                             **_call_args(plan, ring, mine, theirs, i, j, causal))
            dq.index_add_(0, mine.parts[i][0], g[0].float())  # each row once: the same bits every run
            part[0].index_add_(0, idx, g[1].float())
            part[1].index_add_(0, idx, g[2].float())
        acc, acc_reqs, sent = ring.pass_sums(acc, acc_reqs, part, plan, src)
        ring.wait(reqs)
        held = nxt
    ring.wait(acc_reqs)
    return dq.to(q.dtype), acc[0].to(k.dtype), acc[1].to(v.dtype)
