"""flashcore.distributed's all-gather variant (comm='all_gather'): every
rank gathers the whole sequence's K/V in one collective, then makes one
call per local query chunk over the keys that chunk sees (causal: every
token up to the chunk's last, the mask bottom-right aligned; else all of
them). No partial results, no merge. The backward gathers K/V again, adds
each call's dK/dV into float32 sums over the whole sequence and
reduce-scatters them to the tokens' owners.

Against the ring (comm='p2p'): K/V travel once rather than P - 1 times
and a query chunk is one call rather than one per key chunk, which pays
on short rings and where few KV heads make K/V small; the price is the
whole sequence's K/V (and, in the backward, its float32 dK/dV) on every
rank, and transfers that do not overlap compute.
"""

from . import _attention, _backward


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


class _Layout:
    """The whole sequence's chunks in token order: per chunk, its owner,
    its row offset in the owner's slice, its rows and its first token."""

    def __init__(self, plan, ring):
        P, sd = plan.size, ring.seq_dim(plan)
        rows = [ring.chunk_rows(sh[0][sd], plan) for sh in plan.shapes]
        self.chunks, start = [], 0
        for c in range(P if plan.split == "contiguous" else 2 * P):
            owner, w = (c, 0) if c < P else (2 * P - 1 - c, 1)
            self.chunks.append((owner, sum(rows[owner][:w]), rows[owner][w], start))
            start += rows[owner][w]
        self.total = start
        self.padded = max(sum(r) for r in rows)  # the collectives' rows per rank

    def padded_shape(self, x, sd):
        shape = list(x.shape)
        shape[sd] = self.padded
        return shape


def _gather(x, lay, plan, ring):
    """The whole sequence's x (K or V) in token order, from every rank's slice."""
    torch = _torch()
    sd = ring.seq_dim(plan)
    mine = torch.zeros(lay.padded_shape(x, sd), dtype=x.dtype, device=x.device)
    mine.narrow(sd, 0, x.shape[sd]).copy_(x)
    every = torch.empty([plan.size] + list(mine.shape), dtype=x.dtype, device=x.device)
    _all_gather(every, mine, plan)
    return torch.cat([every[o].narrow(sd, off, n) for o, off, n, _ in lay.chunks], dim=sd)


def _scatter_sum(whole, lay, plan, ring, like):
    """This rank's rows of the sum over ranks of whole (float32, token
    order), in like's dtype."""
    torch = _torch()
    sd = ring.seq_dim(plan)
    shape = lay.padded_shape(like, sd)
    by_owner = torch.zeros([plan.size] + shape, dtype=torch.float32, device=like.device)
    for o, off, n, start in lay.chunks:
        by_owner[o].narrow(sd, off, n).copy_(whole.narrow(sd, start, n))
    mine = torch.empty(shape, dtype=torch.float32, device=like.device)
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
