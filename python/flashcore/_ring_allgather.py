"""flashcore.distributed's all-gather variant (comm='all_gather'): every
rank gathers the whole sequence's K/V in one collective, then makes one
call per local query chunk over the keys that chunk sees (causal: every
token up to the chunk's last, the mask bottom-right aligned; else all of
them). No partial results, no merge. The backward gathers K/V again, adds
each call's dK/dV into float32 sums over the whole sequence and
reduce-scatters them to the tokens' owners. Packed variable-length
batches the same way per sequence: the gathered slices are put in token
order sequence by sequence, and a local chunk's call is one varlen call
whose keys are each sequence's tokens up to that chunk's end (causal).

Against the ring (comm='p2p'): K/V travel once rather than P - 1 times
and a query chunk is one call rather than one per key chunk, which pays
on short rings and where few KV heads make K/V small; the price is the
whole sequence's K/V (and, in the backward, its float32 dK/dV) on every
rank, and transfers that do not overlap compute.
"""

import itertools

from . import _attention, _backward, _ring_varlen


def _torch():
    import torch
    return torch


def _all_gather(out, x, plan):
    """out [P, *x.shape] = every rank's x, x and out contiguous (flat for
    the collective: gloo takes no stacked form). The benchmark stubs this."""
    import torch.distributed as dist
    dist.all_gather_into_tensor(out.view(-1), x.view(-1), group=plan.group)


def _reduce_scatter(out, x, plan):
    """out = the sum over ranks of their x[rank] (x [P, *out.shape]; both
    contiguous). The benchmark stubs this."""
    import torch.distributed as dist
    dist.reduce_scatter_tensor(out.view(-1), x.view(-1), group=plan.group)


def _owner(c, P):
    """Chunk c of the whole sequence (token order): the rank holding it and
    its place among that rank's chunks (zigzag: rank r holds r, 2P-1-r)."""
    return (c, 0) if c < P else (2 * P - 1 - c, 1)


class _Layout:
    """The whole sequence's chunks in token order: per chunk, its owner,
    its row offset in the owner's slice, its rows and its first token."""

    def __init__(self, plan, ring):
        P, sd = plan.size, ring.seq_dim(plan)
        rows = [ring.chunk_rows(sh[0][sd], plan) for sh in plan.shapes]
        self.chunks, start = [], 0
        for c in range(P if plan.split == "contiguous" else 2 * P):
            owner, w = _owner(c, P)
            self.chunks.append((owner, sum(rows[owner][:w]), rows[owner][w], start))
            start += rows[owner][w]
        self.total = start
        self.padded = max(sum(r) for r in rows)  # the collectives' rows per rank


def _padded_shape(x, sd, padded):
    shape = list(x.shape)
    shape[sd] = padded
    return shape


def _every(x, padded, plan, sd):
    """Every rank's x, each padded to `padded` rows along sd: [P, ...]."""
    torch = _torch()
    mine = torch.zeros(_padded_shape(x, sd, padded), dtype=x.dtype, device=x.device)
    mine.narrow(sd, 0, x.shape[sd]).copy_(x)
    every = torch.empty([plan.size] + list(mine.shape), dtype=x.dtype, device=x.device)
    _all_gather(every, mine, plan)
    return every


def _gather(x, lay, plan, ring):
    """The whole sequence's x (K or V) in token order, from every rank's slice."""
    sd = ring.seq_dim(plan)
    every = _every(x, lay.padded, plan, sd)
    return _torch().cat([every[o].narrow(sd, off, n) for o, off, n, _ in lay.chunks], dim=sd)


def _scatter_sum(whole, lay, plan, ring, like):
    """This rank's rows of the sum over ranks of whole (float32, token
    order), in like's dtype."""
    torch = _torch()
    sd = ring.seq_dim(plan)
    by_owner = torch.zeros([plan.size] + _padded_shape(like, sd, lay.padded), dtype=torch.float32,
                           device=like.device)
    for o, off, n, start in lay.chunks:
        by_owner[o].narrow(sd, off, n).copy_(whole.narrow(sd, start, n))
    return _reduce_mine(by_owner, like, plan, sd)


def _reduce_mine(by_owner, like, plan, sd):
    """This rank's rows of the sum over ranks of by_owner ([P, padded...],
    float32), in like's dtype."""
    mine = _torch().empty(by_owner.shape[1:], dtype=by_owner.dtype, device=like.device)
    _reduce_scatter(mine, by_owner, plan)
    return mine.narrow(sd, 0, like.shape[sd]).to(like.dtype)


def _calls(plan, lay, ring, q_rows):
    """(local query chunk, keys it sees) for each chunk with rows."""
    for i, c in enumerate(ring.chunks(plan, plan.rank)):
        if q_rows[i]:
            _, _, n, start = lay.chunks[c]
            yield i, start + n if plan.causal else lay.total


def forward(q, k, v, plan, ring):
    """This rank's out (q's dtype) and lse [B, Hq, S] (float32)."""
    torch = _torch()
    sd = ring.seq_dim(plan)
    lay = _Layout(plan, ring)
    kg, vg = _gather(k, lay, plan, ring), _gather(v, lay, plan, ring)
    qs = ring.pieces(q, plan)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    outs = ring.pieces(out, plan)
    lses = [ring.no_lse(x, plan) for x in qs]
    for i, keys in _calls(plan, lay, ring, ring.rows(qs, plan)):
        _, lses[i] = _attention.attention(qs[i], kg.narrow(sd, 0, keys), vg.narrow(sd, 0, keys), return_lse=True,
                                          out=outs[i], **ring.options(plan, plan.causal))
    return out, torch.cat(lses, dim=-1)


def backward(dout, q, k, v, out, lse, plan, ring):
    """dq, dk, dv of this rank's slice (q's, k's, v's dtypes)."""
    torch = _torch()
    sd = ring.seq_dim(plan)
    lay = _Layout(plan, ring)
    kg, vg = _gather(k, lay, plan, ring), _gather(v, lay, plan, ring)
    dkg, dvg = (torch.zeros(x.shape, dtype=torch.float32, device=x.device) for x in (kg, vg))
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    qs, dos, outs, dqs = (ring.pieces(x, plan) for x in (q, dout, out, dq))
    lses = [x.contiguous() for x in ring.pieces(lse, plan, dim=-1)]
    for i, keys in _calls(plan, lay, ring, ring.rows(qs, plan)):
        g = _backward.attention_backward(dos[i], qs[i], kg.narrow(sd, 0, keys), vg.narrow(sd, 0, keys), outs[i],
                                         lses[i], dq=dqs[i], deterministic=plan.deterministic,
                                         **ring.options(plan, plan.causal))
        dkg.narrow(sd, 0, keys).add_(g[1])
        dvg.narrow(sd, 0, keys).add_(g[2])
    return dq, _scatter_sum(dkg, lay, plan, ring, k), _scatter_sum(dvg, lay, plan, ring, v)


# ---- packed variable-length batches ----------------------------------------

class _Packed:
    """The batch's sequences in token order over the ranks' gathered slices
    (plan.cu: every rank's cu_seqlens, as lists): `order`, the rows of the
    flattened gather ([P * padded]) that make them, sequence after
    sequence; and `calls`, per local chunk with rows: its rows of q, their
    cu_seqlens and longest, and the token-order rows of the keys it sees
    (causal: each sequence's tokens up to the chunk's end; else all of
    them), with theirs."""

    def __init__(self, plan, device):
        torch = _torch()
        P, zig, cus = plan.size, plan.split == "zigzag", plan.cu
        self.padded = max(c[-1] for c in cus)
        order, starts, ends = [], [], []  # ends[s][c]: where chunk c ends in sequence s
        self.total = 0
        for s in range(len(cus[0]) - 1):
            starts.append(self.total)
            ends.append([])
            n = 0
            for c in range(2 * P if zig else P):
                o, w = _owner(c, P)
                lo, hi = _ring_varlen._span(cus[o][s], cus[o][s + 1], zig, w)
                order.append(torch.arange(o * self.padded + lo, o * self.padded + hi, dtype=torch.int64))
                n += hi - lo
                ends[-1].append(n)
            self.total += n
        self.order = torch.cat(order).to(device)
        self.calls = []
        for w, (rows, cu_q, max_q) in enumerate(_ring_varlen._Chunks(cus[plan.rank], zig, device).parts):
            c = plan.rank if w == 0 else 2 * P - 1 - plan.rank
            seen = [e[c] if plan.causal else e[-1] for e in ends]
            keys = torch.cat([torch.arange(a, a + n, dtype=torch.int64) for a, n in zip(starts, seen)]).to(device)
            cu_k = torch.tensor([0, *itertools.accumulate(seen)], dtype=torch.int32, device=device)
            if rows.numel():
                self.calls.append((rows, dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                                              max_seqlen_k=max(seen)), keys))


def _gather_packed(x, pk, plan):
    """The batch's x (K or V) in token order, from every rank's slice."""
    every = _every(x, pk.padded, plan, 0)
    return every.view((-1,) + tuple(x.shape[1:])).index_select(0, pk.order)


def forward_varlen(q, k, v, plan, ring):
    """This rank's out [total, Hq, D] and lse [Hq, total] (float32)."""
    torch = _torch()
    pk = _Packed(plan, q.device)
    kg, vg = _gather_packed(k, pk, plan), _gather_packed(v, pk, plan)
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
    for rows, extra, keys in pk.calls:
        o, l = _attention.attention(q.index_select(0, rows), kg.index_select(0, keys), vg.index_select(0, keys),
                                    return_lse=True, **ring.options(plan, plan.causal, **extra))
        out.index_copy_(0, rows, o)
        lse.index_copy_(1, rows, l)
    return out, lse


def backward_varlen(dout, q, k, v, out, lse, plan, ring):
    """dq, dk, dv of this rank's packed slices (q's, k's, v's dtypes)."""
    torch = _torch()
    pk = _Packed(plan, q.device)
    kg, vg = _gather_packed(k, pk, plan), _gather_packed(v, pk, plan)
    dkg, dvg = (torch.zeros(x.shape, dtype=torch.float32, device=x.device) for x in (kg, vg))
    dq = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    for rows, extra, keys in pk.calls:
        g = _backward.attention_backward(dout.index_select(0, rows), q.index_select(0, rows),
                                         kg.index_select(0, keys), vg.index_select(0, keys),
                                         out.index_select(0, rows), lse.index_select(1, rows).contiguous(),
                                         deterministic=plan.deterministic,
                                         **ring.options(plan, plan.causal, **extra))
        dq.index_copy_(0, rows, g[0])
        dkg.index_add_(0, keys, g[1].float())  # each row once a call: the same bits every run
        dvg.index_add_(0, keys, g[2].float())
    return (dq,) + tuple(_scatter_packed(x, pk, plan, like) for x, like in ((dkg, k), (dvg, v)))


def _scatter_packed(whole, pk, plan, like):
    """This rank's rows of the sum over ranks of whole (float32, token order)."""
    torch = _torch()
    by_owner = torch.zeros((plan.size * pk.padded,) + tuple(like.shape[1:]), dtype=torch.float32,
                           device=like.device)
    by_owner.index_copy_(0, pk.order, whole)
    return _reduce_mine(by_owner.view((plan.size, pk.padded) + tuple(like.shape[1:])), like, plan, 0)
