"""Context parallelism over torch.distributed: ring_attention(), one
attention call over a sequence split across the ranks of a process group.

Each rank holds its slice of the sequence (q, k and v for the same tokens).
K/V slices travel around the ring (rank r sends to r + 1 and receives from
r - 1, the transfer of the next slice posted before the current one's
attention runs); each rank computes flashcore.attention of its queries on
every slice it is handed, with return_lse, and folds the partial results
in by merge_attention into a float32 accumulator in ring order. The
backward sends the K/V slices round again with float32 dK/dV accumulators
travelling beside them, each rank adding attention_backward's block
gradients (taken against the final out and lse, which makes the blocks
exact parts of the whole) until every accumulator is back at its owner.
A step's gradients go to a fresh buffer that is added to the arriving
accumulator only after the step's work, so both transfers run behind
compute (the accumulators' last hop, home, excepted).

Sequence split (`split`): 'contiguous', rank r holds the r-th run of
tokens, of any length (ranks may differ); 'zigzag' (causal load balance:
every rank the same work), the sequence in 2P chunks and rank r holds
chunks r and 2P - 1 - r, in that order, a slice of n tokens read as
ceil(n / 2) of the first and the rest of the second: any total length S,
cut so that the first S % 2P chunks have one token more than the others
(as the C API's fc_cp_attention_forward; an empty chunk takes no part).
A pair of chunks (query chunk a, key chunk b) is skipped when causal and
b > a, causal when b == a (a rank's own tokens: the usual alignment),
unmasked when b < a.

comm='all_gather' replaces the ring by one all_gather of K/V and one call
per query chunk (_ring_allgather.py).

Every rank passes tensors of one layout and dtype, the same options, and
shapes that differ at most in the token count (checked once per call by
an all_gather of the shapes and options on the host, over a gloo group
beside an NCCL one: a rank that differs makes every rank raise). Variable-length (packed) batches: q, k, v [total, H, D] and
cu_seqlens, each rank's slice of every sequence of the batch, split per
sequence as above (_ring_varlen.py). Not taken (UnsupportedError):
windows, paged caches, FP8. Deterministic: the
sums run in a fixed order, so with deterministic=True (the block
backward's) the results repeat bitwise.

The partial outputs and block gradients are rounded to the inputs' dtype
before they are summed in float32 (the library's forward and backward
write their dtype); against one call over the whole sequence that adds a
rounding per part.
"""

import collections
import struct
import types
import zlib

from . import _attention, _backward, _merge, _ring_allgather, _ring_varlen
from .errors import InvalidArgumentError, UnsupportedError

# shapes: per rank of the group, the (k shape, v shape) of its slice; cu:
# varlen, the rank's cu_seqlens tensor, then (after the shapes' check)
# every rank's as a list; else None
_Plan = collections.namedtuple("_Plan", "group rank size split causal scale softcap layout deterministic backend "
                                        "shapes cu comm")


def _torch():
    import torch
    return torch


def _dist():
    import torch.distributed as dist
    return dist


def _chunks(plan, rank):
    """The sequence chunks rank holds, in its local order."""
    if plan.split == "contiguous":
        return (rank,)
    return (rank, 2 * plan.size - 1 - rank)


def _seq_dim(plan):
    return 0 if plan.cu is not None else 2 if plan.layout == "bhsd" else 1


def _pieces(x, plan, dim=None):
    """x's local chunks (views along the sequence, or along dim), as
    _chunks orders them: zigzag, ceil(n / 2) tokens and the rest (which
    may be none)."""
    if len(_chunks(plan, 0)) == 1:
        return (x,)
    dim = _seq_dim(plan) if dim is None else dim
    return x.split(_chunk_rows(x.shape[dim], plan), dim=dim)


def _peer(plan, step):
    """The global rank of the group rank `step` places after this one."""
    return _dist().get_global_rank(plan.group, (plan.rank + step) % plan.size) if plan.group is not None \
        else (plan.rank + step) % plan.size


def _exchange(tensors, plan, src):
    """Post the ring's transfer of tensors (to rank + 1, from rank - 1),
    receiving the slice of group rank src in buffers of its shapes:
    (the received buffers, the requests to wait on)."""
    dist = _dist()
    recv = [_torch().empty(shape, dtype=x.dtype, device=x.device) for x, shape in zip(tensors, plan.shapes[src])]
    ops = [dist.P2POp(dist.isend, x, _peer(plan, 1), plan.group) for x in tensors]
    ops += [dist.P2POp(dist.irecv, x, _peer(plan, -1), plan.group) for x in recv]
    return recv, dist.batch_isend_irecv(ops)


def _wait(reqs):
    for r in reqs:
        r.wait()


def _pairs(plan, src, q_rows, k_rows):
    """(local query chunk, key chunk of rank src, causal) for every pair of
    the step that holds src's K/V that is not skipped (q_rows, k_rows: the
    chunks' token counts; an empty chunk takes no part). Both rings'."""
    for i, a in enumerate(_chunks(plan, plan.rank)):
        for j, b in enumerate(_chunks(plan, src)):
            if (plan.causal and b > a) or q_rows[i] == 0 or k_rows[j] == 0:
                continue
            yield i, j, plan.causal and b == a


def _rows(pieces, plan):
    """The token counts of a dense slice's chunks."""
    return [x.shape[_seq_dim(plan)] for x in pieces]


def _options(plan, causal, **varlen):
    """One call's options; a packed call's (varlen: its cu_seqlens and
    longest) take no layout."""
    o = dict(causal=causal, softcap=plan.softcap, scale=plan.scale, backend=plan.backend, **varlen)
    if plan.cu is None:
        o["layout"] = plan.layout
    return o


def _fold(acc, part, plan, out=None):
    """Merge one more (out, lse) into the accumulator (None at first: the
    part itself, which the next merge reads exactly) in float32, or, for a
    chunk's last part, into out (the result's rows, rounded once)."""
    if acc is None:
        return part
    return _merge.merge_attention([acc[0], part[0]], [acc[1], part[1]], out=out,
                                  out_dtype=None if out is not None else _torch().float32,
                                  return_lse=True, layout=plan.layout, backend=plan.backend)


def _parts_per_chunk(plan, q_rows, k_rows):
    """How many partial results each local query chunk receives over the
    ring (k_rows: per rank, its chunks' token counts)."""
    count = [0] * len(q_rows)
    for step in range(plan.size):
        src = (plan.rank - step) % plan.size
        for i, _, _ in _pairs(plan, src, q_rows, k_rows[src]):
            count[i] += 1
    return count


def _chunk_rows(n, plan):
    """The chunks' token counts of a slice of n tokens (as _pieces cuts it)."""
    return [n] if plan.split == "contiguous" else [n - n // 2, n // 2]


def _forward(q, k, v, plan):
    """This rank's out and lse. A query chunk's last partial result is
    merged (or, if its only one, written) straight into the output."""
    if plan.comm == "all_gather":
        return (_ring_allgather.forward_varlen(q, k, v, plan, _RING) if plan.cu is not None else
                _ring_allgather.forward(q, k, v, plan, _RING))
    if plan.cu is not None:
        return _ring_varlen.forward(q, k, v, plan, _RING)
    torch = _torch()
    qs = _pieces(q, plan)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    outs = _pieces(out, plan)
    q_rows = _rows(qs, plan)
    k_rows = [_chunk_rows(sh[0][_seq_dim(plan)], plan) for sh in plan.shapes]  # every rank's chunks
    left = _parts_per_chunk(plan, q_rows, k_rows)
    accs = [None] * len(qs)
    kv = (k.contiguous(), v.contiguous())
    for step in range(plan.size):
        src = (plan.rank - step) % plan.size
        nxt, reqs = _exchange(kv, plan, (src - 1) % plan.size) if step < plan.size - 1 else (None, [])
        ks, vs = _pieces(kv[0], plan), _pieces(kv[1], plan)
        for i, j, causal in _pairs(plan, src, q_rows, k_rows[src]):
            left[i] -= 1
            last = outs[i] if left[i] == 0 else None
            only = last if accs[i] is None else None
            part = _attention.attention(qs[i], ks[j], vs[j], return_lse=True, out=only, **_options(plan, causal))
            accs[i] = part if only is not None else _fold(accs[i], part, plan, last)
        _wait(reqs)
        kv = nxt
    if any(a is None and n for a, n in zip(accs, q_rows)):  # every token sees its own chunk
        raise RuntimeError("ring_attention: internal: a query chunk received no partial result")
    lse = torch.cat([a[1] if a else _no_lse(x, plan) for a, x in zip(accs, qs)], dim=-1)
    return out, lse


def _no_lse(q, plan):
    """The lse of a query chunk with no token (zigzag, an empty chunk)."""
    B, H = (q.shape[0], q.shape[2]) if plan.layout == "bshd" else q.shape[:2]
    return _torch().empty((B, H, 0), dtype=_torch().float32, device=q.device)


def _backward_ring(dout, q, k, v, out, lse, plan):
    if plan.comm == "all_gather":
        return (_ring_allgather.backward_varlen(dout, q, k, v, out, lse, plan, _RING) if plan.cu is not None else
                _ring_allgather.backward(dout, q, k, v, out, lse, plan, _RING))
    if plan.cu is not None:
        return _ring_varlen.backward(dout, q, k, v, out, lse, plan, _RING)
    torch = _torch()
    qs, dos, outs = _pieces(q, plan), _pieces(dout, plan), _pieces(out, plan)
    lses = [x.contiguous() for x in _pieces(lse, plan, dim=-1)]
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dqs = _pieces(dq, plan)
    kv = (k.contiguous(), v.contiguous())
    # acc: the float32 dK, dV of the slice held, arriving from rank - 1 (in
    # flight until acc_reqs are waited on); sent: the sums this rank passed on
    acc, acc_reqs, sent = None, [], None
    for step in range(plan.size):
        src = (plan.rank - step) % plan.size
        nxt, reqs = _exchange(kv, plan, (src - 1) % plan.size) if step < plan.size - 1 else (None, [])
        ks, vs = _pieces(kv[0], plan), _pieces(kv[1], plan)
        part = tuple(torch.zeros(x.shape, dtype=torch.float32, device=x.device) for x in kv)
        dks, dvs = _pieces(part[0], plan), _pieces(part[1], plan)
        for i, j, causal in _pairs(plan, src, _rows(qs, plan), _rows(ks, plan)):
            g = _backward.attention_backward(dos[i], qs[i], ks[j], vs[j], outs[i], lses[i],
                                             deterministic=plan.deterministic, **_options(plan, causal))
            dqs[i].add_(g[0])
            dks[j].add_(g[1])
            dvs[j].add_(g[2])
        acc, acc_reqs, sent = _pass_sums(acc, acc_reqs, part, plan, src)
        _wait(reqs)
        kv = nxt
    _wait(acc_reqs)
    return dq.to(q.dtype), acc[0].to(k.dtype), acc[1].to(v.dtype)


def _cu_problem(cu, q):
    """What is wrong with the rank's cu_seqlens (None: nothing): int32,
    1-D, on q's device, from 0 to q's tokens, not decreasing. Raised after
    the shapes' all_gather, on every rank, so that none waits."""
    torch = _torch()
    if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 2 or \
            cu.device != q.device:
        return "cu_seqlens must be a 1-D int32 tensor of batch + 1 >= 2 offsets on q's device"
    c = cu.tolist()
    if c[0] != 0 or c[-1] != q.shape[0] or any(b < a for a, b in zip(c, c[1:])):
        return "cu_seqlens %s must rise from 0 to q's %d tokens" % (c, q.shape[0])
    return None


def _pass_sums(acc, acc_reqs, part, plan, src):
    """A step's float32 dK/dV of the held slice (part) added to the sums
    that arrived with it (acc, in flight until acc_reqs are waited on: the
    earlier ranks', sent while this step ran) and passed on to rank + 1,
    which holds this slice next (after the last step: its owner); from
    rank - 1 come the next slice's (after the last step: this rank's own,
    back from its tour). Returns (acc, acc_reqs, sent): sent stays
    referenced until that transfer is waited on."""
    _wait(acc_reqs)
    if acc is not None:
        for x, y in zip(acc, part):
            x.add_(y)
        part = acc
    if plan.size == 1:
        return part, [], None
    return _exchange(part, plan, (src - 1) % plan.size) + (part,)


# what the varlen ring (_ring_varlen.py) and the all-gather variant
# (_ring_allgather.py) take from this one
_RING = types.SimpleNamespace(exchange=_exchange, wait=_wait, fold=_fold, pairs=_pairs, pass_sums=_pass_sums,
                              chunks=_chunks, chunk_rows=_chunk_rows, seq_dim=_seq_dim, pieces=_pieces, rows=_rows,
                              options=_options, no_lse=_no_lse)


def _gather_cu(cu, plan):
    """Every rank's cu_seqlens, as lists (one all_gather on the host, as
    the shapes'; each rank's was checked, and all have one length, by
    _gather_shapes, which read it to the host already)."""
    mine = cu.cpu()
    every = [_torch().empty_like(mine) for _ in range(plan.size)]
    _dist().all_gather(every, mine, group=_host_group(plan.group))
    return tuple(x.tolist() for x in every)


def _options_code(plan, q):
    """The options every rank must pass alike, for _gather_shapes'
    exchange: (name, int64) pairs (floats by their bits, scale None as -1,
    the dtype by its name's CRC: the same in every process)."""
    def bits(x):
        return -1 if x is None else struct.unpack("<q", struct.pack("<d", float(x)))[0]
    return (("split", ("contiguous", "zigzag").index(plan.split)), ("causal", int(plan.causal)),
            ("comm", ("p2p", "all_gather").index(plan.comm)), ("layout", ("bshd", "bhsd").index(plan.layout)),
            ("deterministic", int(plan.deterministic)), ("softcap", bits(plan.softcap)),
            ("scale", bits(plan.scale)), ("dtype", zlib.crc32(str(q.dtype).encode())))


# a gloo group over the ranks of each NCCL (device-only) group that
# exchanged shapes: made once per group, kept for the process's life
_HOST_GROUPS = {}


def _runs_on_host(group):
    """Whether `group` exchanges CPU tensors itself (a gloo backend)."""
    return "gloo" in str(_dist().get_backend(group))


def _host_group(group):
    """A group over `group`'s ranks that exchanges small host values with
    no device synchronisation: `group` itself where it runs gloo, else a
    gloo group over its ranks, made at the first call (every rank of
    `group` makes that call: ring_attention's contract; only they take
    part). Over NCCL the shapes' exchange read back from the device cost
    0.37 ms a call, a sync that stalled the stream (2 x H200, 16k tokens)."""
    if _runs_on_host(group):
        return group
    dist = _dist()
    key = dist.group.WORLD if group is None else group
    host = _HOST_GROUPS.get(key)
    if host is None:
        host = dist.new_group(ranks=dist.get_process_group_ranks(key), backend="gloo",
                              use_local_synchronization=True)
        _HOST_GROUPS[key] = host
    return host


def _check_options(codes, names):
    """Raise on every rank where one rank's options (codes, in names'
    order) differ from rank 0's."""
    for r, c in enumerate(codes):
        for name, x, y in zip(names, c, codes[0]):
            if x != y:
                raise InvalidArgumentError("ring_attention: rank %d passes another %s than rank 0: every rank must "
                                           "pass the same options and dtype" % (r, name))


def _gather_shapes(q, k, v, plan):
    """Every rank's (q, k, v) shapes (one all_gather, with the options of
    _options_code), checked: the ring's buffers take them. A rank's q, k and v hold
    the same tokens; ranks differ at most in their token count; every rank
    passes the same options. The raise is the same on every rank."""
    torch = _torch()
    dist = _dist()
    nd = q.dim()  # 4, or 3 (varlen: then the cu_seqlens' length too, one on every rank)
    problem = _cu_problem(plan.cu, q) if plan.cu is not None else None
    extra = [] if plan.cu is None else [0 if problem else plan.cu.numel(), 1 if problem else 0]
    opts = _options_code(plan, q)
    mine = torch.tensor([*q.shape, *k.shape, *v.shape, *extra, *(c for _, c in opts)], dtype=torch.int64)
    every = [torch.empty_like(mine) for _ in range(plan.size)]
    dist.all_gather(every, mine, group=_host_group(plan.group))  # on the host: no device sync
    rows = [x.tolist() for x in every]
    _check_options([x[len(x) - len(opts):] for x in rows], [name for name, _ in opts])
    shapes = [tuple(tuple(x[i:i + nd]) for i in (0, nd, 2 * nd)) + tuple(x[3 * nd:len(x) - len(opts)]) for x in rows]
    sd = _seq_dim(plan)

    def other(sh):
        return tuple(tuple(d for i, d in enumerate(t) if i != sd) for t in sh)

    for r, sh in enumerate(shapes):
        if extra and sh[4]:
            raise InvalidArgumentError("ring_attention: rank %d: %s" % (r, problem if r == plan.rank else
                                                                       "invalid cu_seqlens (its own error says why)"))
    for r, sh in enumerate(shapes):
        if extra and sh[3] != shapes[0][3]:
            raise InvalidArgumentError("ring_attention: rank %d passes cu_seqlens of %d offsets, rank 0 of %d: every "
                                       "rank holds a slice of every sequence of the batch" % (r, sh[3], shapes[0][3]))
        sh = sh[:3]
        lengths = {t[sd] for t in sh}
        if len(lengths) != 1 or (0 in lengths and not extra):
            raise InvalidArgumentError("ring_attention: rank %d holds q, k, v of shapes %s: each rank's q, k and "
                                       "v must hold the same tokens, at least one" % (r, sh))
        if other(sh) != other(shapes[0][:3]):
            raise InvalidArgumentError(
                "ring_attention: rank %d holds q, k, v of shapes %s, rank 0 of %s: every rank must hold the same "
                "batch, heads and head_dim" % (r, sh, shapes[0][:3]))
    return tuple(sh[1:3] for sh in shapes)


class _Ring:
    """The torch.autograd.Function (made at first use: torch is imported late)."""
    fn = None

    @classmethod
    def get(cls):
        if cls.fn is None:
            torch = _torch()

            class RingAttention(torch.autograd.Function):
                @staticmethod
                def forward(ctx, q, k, v, plan):
                    out, lse = _forward(q, k, v, plan)
                    ctx.save_for_backward(q, k, v, out, lse)
                    ctx.plan = plan
                    ctx.mark_non_differentiable(lse)
                    return out, lse

                @staticmethod
                def backward(ctx, dout, _dlse):
                    q, k, v, out, lse = ctx.saved_tensors
                    dq, dk, dv = _backward_ring(dout.contiguous(), q, k, v, out, lse, ctx.plan)
                    return dq, dk, dv, None

            cls.fn = RingAttention
        return cls.fn


def ring_attention(q, k, v, *, group=None, causal=False, scale=None, softcap=0.0, split="contiguous",
                   layout="bshd", deterministic=False, return_lse=False, backend="auto", cu_seqlens=None,
                   comm="p2p"):
    """Attention over a sequence split across the ranks of `group` (a
    torch.distributed process group, default the world; NCCL for CUDA
    tensors, gloo for CPU ones), called by every rank with its slice.

    q [B, S, Hq, D], k/v [B, S, Hkv, D] ('bshd'; 'bhsd': [B, H, S, D]):
    this rank's tokens, as `split` assigns them ('contiguous' or 'zigzag':
    module docstring). Returns this rank's out (q's shape and dtype), and
    its lse ([B, Hq, S] float32) with return_lse. Packed variable-length
    batches: q [total, Hq, D], k/v [total, Hkv, D] and cu_seqlens (int32,
    batch + 1 offsets, on q's device), the rank's slice of every sequence,
    each split as `split` says (module docstring); lse [Hq, total]; layout
    not used. Differentiable: with
    tensors that require grad, loss.backward() runs the backward ring (every
    rank must run it). causal: over the whole sequence. deterministic: the
    block backward's (results repeat bitwise). comm: 'p2p', the ring
    (K/V passed rank to rank, each transfer behind a step's compute), or
    'all_gather' (the whole K/V gathered once, one call per query chunk,
    no merge; dK/dV reduce-scattered: _ring_allgather.py).
    """
    dist = _dist()
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidArgumentError("ring_attention: torch.distributed is not initialised "
                                   "(torch.distributed.init_process_group first)")
    if split not in ("contiguous", "zigzag"):
        raise InvalidArgumentError("split: expected 'contiguous' or 'zigzag', got %r" % (split,))
    if layout not in ("bshd", "bhsd"):
        raise InvalidArgumentError("layout: expected 'bshd' or 'bhsd', got %r" % (layout,))
    if comm not in ("p2p", "all_gather"):
        raise InvalidArgumentError("comm: expected 'p2p' or 'all_gather', got %r" % (comm,))
    nd = 4 if cu_seqlens is None else 3
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, _torch().Tensor) or x.dim() != nd:
            raise UnsupportedError("ring_attention: %s must be a %d-D torch tensor (%s; no paged calls across "
                                   "ranks)" % (name, nd, "[total, H, D] with cu_seqlens" if nd == 3 else "dense"))
    plan = _Plan(group, dist.get_rank(group), dist.get_world_size(group), split, bool(causal), scale,
                 float(softcap or 0.0), layout, bool(deterministic), backend, None, cu_seqlens, comm)
    plan = plan._replace(shapes=_gather_shapes(q, k, v, plan))
    if cu_seqlens is not None:
        plan = plan._replace(cu=_gather_cu(cu_seqlens, plan))
    torch = _torch()
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        out, lse = _Ring.get().apply(q, k, v, plan)
    else:
        with torch.no_grad():
            out, lse = _forward(q, k, v, plan)
    return (out, lse) if return_lse else out
