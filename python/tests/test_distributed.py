"""flashcore.distributed.ring_attention on CPU processes over gloo: each
rank's out, lse and gradients equal the slice of one flashcore.attention
call over the whole sequence (and its autograd gradients), for both comms
(the ring and the all-gather variant), both splits, causal or not, GQA, bshd and bhsd, f32 and bf16, ranks of unequal
lengths, zigzag totals that 2P does not divide (down to an empty chunk),
packed variable-length batches (sequences shorter than 2P, of one token);
deterministic reruns repeat bitwise; bad calls raise on every rank; the
shapes' exchange through the gloo group NCCL groups get (forced).
Skipped without torch or torch.distributed's gloo backend.

On a machine with GPUs, FC_TEST_RING_BACKEND=nccl runs the same checks
over NCCL, rank r on cuda:r, for the rank counts in FC_TEST_RING_SIZES
(default 2,3): every case's dtype becomes bfloat16 and its head_dim at
least 64 (what the CUDA paths take); the reference stays one float32
call on the CPU."""

import os
import socket
import sys

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed without gloo", allow_module_level=True)
mp = pytest.importorskip("torch.multiprocessing")
BACKEND = os.environ.get("FC_TEST_RING_BACKEND", "gloo")
GPU = BACKEND == "nccl"
SIZES = [int(n) for n in os.environ.get("FC_TEST_RING_SIZES", "2,3").split(",")]

# name, B, Hq, Hkv, S, D, dtype, causal, split, layout, softcap. S: the
# tokens per rank (rank r: S + r when the name says uneven); zigzag: the
# whole sequence has S * size tokens, less `odd-N`'s N, cut into 2 * size
# chunks (the first total % (2 * size) one token longer)
CASES = [
    ("f32-causal-uneven", 1, 2, 1, 3, 16, "float32", True, "contiguous", "bshd", 0.0),
    ("f32-causal-gqa-contiguous", 2, 4, 2, 6, 16, "float32", True, "contiguous", "bshd", 0.0),
    ("f32-causal-zigzag-bhsd", 1, 2, 2, 8, 32, "float32", True, "zigzag", "bhsd", 0.0),
    ("f32-full-softcap", 1, 3, 1, 5, 8, "float32", False, "contiguous", "bshd", 4.0),
    ("bf16-causal-zigzag-gqa", 2, 4, 1, 10, 64, "bfloat16", True, "zigzag", "bshd", 0.0),
    ("f32-causal-zigzag-odd-1", 1, 2, 1, 6, 16, "float32", True, "zigzag", "bshd", 0.0),
    ("f32-full-zigzag-odd-1", 1, 2, 2, 5, 16, "float32", False, "zigzag", "bhsd", 0.0),
    ("f32-causal-zigzag-short-odd-1", 1, 2, 1, 2, 16, "float32", True, "zigzag", "bshd", 0.0),  # 2P - 1 tokens
]
# |got - want| <= atol + rtol |want| against one call over the whole
# sequence: f32 differs by the summation order; bf16 partial outputs and
# block gradients are each rounded to bf16 once before their float32 sum
# (module docstring), so two bf16 roundings of the magnitude
TOL = {"float32": (2e-5, 2e-5), "bfloat16": (3e-2, 2e-2)}


def _lift(dtype, d):
    """A case's dtype and head_dim where it runs: on the GPU, bfloat16 and
    a head_dim of at least 64."""
    return ("bfloat16", max(d, 64)) if GPU else (dtype, d)


def _dev(rank):
    return torch.device("cuda", rank) if GPU else torch.device("cpu")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _zigzag_chunks(case, size):
    """The zigzag cases' (start, length) of each of the 2 * size chunks."""
    total = case[4] * size - (int(case[0].split("odd-")[1]) if "odd-" in case[0] else 0)
    lens = [total // (2 * size) + (c < total % (2 * size)) for c in range(2 * size)]
    return [(sum(lens[:c]), lens[c]) for c in range(2 * size)]


def _lengths(case, size):
    """Every rank's token count."""
    if case[8] == "zigzag":
        ch = _zigzag_chunks(case, size)
        return [ch[r][1] + ch[2 * size - 1 - r][1] for r in range(size)]
    return [case[4] + (r if "uneven" in case[0] else 0) for r in range(size)]


def _global(case, size):
    """The whole sequence's q, k, v, dout (float32, [B, S_total, H, D]),
    the same on every rank."""
    _, B, Hq, Hkv, S, D, dtype, *_ = case
    D = _lift(dtype, D)[1]
    g = torch.Generator().manual_seed(7)
    total = sum(_lengths(case, size))
    return [torch.randn(B, total, h, D, generator=g) for h in (Hq, Hkv, Hkv, Hq)]


def _index(case, size, rank):
    """The global token indices rank holds, in its local order."""
    S, split = case[4], case[8]
    if split == "contiguous":
        start = sum(_lengths(case, size)[:rank])
        return list(range(start, start + _lengths(case, size)[rank]))
    ch = _zigzag_chunks(case, size)
    return [t for c in (rank, 2 * size - 1 - rank) for t in range(ch[c][0], ch[c][0] + ch[c][1])]


def _check_case(case, size, rank, comm):
    import flashcore
    from flashcore import distributed as fd
    name, *_, dtype, causal, split, layout, softcap = case
    dtype = _lift(dtype, 0)[0]
    dt, dev = getattr(torch, dtype), _dev(rank)
    q, k, v, dout = _global(case, size)
    # the reference: one call over the whole sequence, in float32 from the same (rounded) inputs
    qr, kr, vr = (x.to(dt).float().clone().requires_grad_() for x in (q, k, v))
    want, want_lse = flashcore.attention(qr, kr, vr, causal=causal, softcap=softcap, return_lse=True)
    want.backward(dout)
    idx = _index(case, size, rank)
    mine = [x[:, idx].to(dev, dt) for x in (q, k, v, dout)]
    if layout == "bhsd":
        mine = [x.transpose(1, 2) for x in mine]
    ql, kl, vl = (x.clone().requires_grad_() for x in mine[:3])
    out, lse = fd.ring_attention(ql, kl, vl, causal=causal, softcap=softcap, split=split, layout=layout,
                                 return_lse=True, comm=comm)
    out.backward(mine[3])
    atol, rtol = TOL[dtype]

    def same(got, ref, what):
        if layout == "bhsd" and got.dim() == 4:
            got = got.transpose(1, 2)
        got = got.float().cpu()
        err = (got - ref).abs() - rtol * ref.abs()
        assert err.max().item() <= atol, "%s %s rank %d: %s off by %.3g" % (name, comm, rank, what, err.max().item())

    same(out, want.detach()[:, idx], "out")
    torch.testing.assert_close(lse.cpu(), want_lse[:, :, idx], atol=atol, rtol=rtol)
    for x, ref, what in ((ql, qr, "dq"), (kl, kr, "dk"), (vl, vr, "dv")):
        assert x.grad.dtype == dt and x.grad.shape == x.shape
        same(x.grad, ref.grad[:, idx], what)
    # deterministic reruns: the same bits
    runs = []
    for _ in range(2):
        a, b, c = (x.clone().requires_grad_() for x in mine[:3])
        o = fd.ring_attention(a, b, c, causal=causal, softcap=softcap, split=split, layout=layout,
                              deterministic=True, comm=comm)
        o.backward(mine[3])
        runs.append([o.detach(), a.grad, b.grad, c.grad])
    for x, y in zip(*runs):
        assert torch.equal(x, y), "%s %s rank %d: deterministic reruns differ" % (name, comm, rank)


# packed variable-length batches: the sequences' whole lengths (one
# shorter than 2P, one of a single token), and the cases: name, dtype,
# causal, split
VARLEN_SEQS = [11, 1, 16, 3]
VARLEN_CASES = [
    ("varlen-f32-causal-zigzag", "float32", True, "zigzag"),
    ("varlen-f32-full-contiguous", "float32", False, "contiguous"),
    ("varlen-bf16-causal-contiguous", "bfloat16", True, "contiguous"),
]


def _varlen_index(size, rank, split):
    """The global tokens rank holds, in its local order, and its cu_seqlens."""
    idx, cu, start = [], [0], 0
    for n in VARLEN_SEQS:
        parts = 2 * size if split == "zigzag" else size
        lens = [n // parts + (c < n % parts) for c in range(parts)]
        offs = [start + sum(lens[:c]) for c in range(parts)]
        mine = (rank, 2 * size - 1 - rank) if split == "zigzag" else (rank,)
        for c in mine:
            idx.extend(range(offs[c], offs[c] + lens[c]))
        cu.append(len(idx))
        start += n
    return idx, torch.tensor(cu, dtype=torch.int32)


def _check_varlen(case, size, rank, comm):
    import flashcore
    from flashcore import distributed as fd
    name, dtype, causal, split = case
    dtype, D = _lift(dtype, 16)
    dt, dev = getattr(torch, dtype), _dev(rank)
    total, H, Hkv = sum(VARLEN_SEQS), 4, 2
    g = torch.Generator().manual_seed(11)
    q, dout = (torch.randn(total, H, D, generator=g).to(dt) for _ in range(2))
    k, v = (torch.randn(total, Hkv, D, generator=g).to(dt) for _ in range(2))
    cu = torch.tensor([0] + [sum(VARLEN_SEQS[:i + 1]) for i in range(len(VARLEN_SEQS))], dtype=torch.int32)
    opts = dict(causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(VARLEN_SEQS),
                max_seqlen_k=max(VARLEN_SEQS))
    want, want_lse = flashcore.attention(q, k, v, return_lse=True, **opts)
    wq, wk, wv = flashcore.attention_backward(dout, q, k, v, want, want_lse, **opts)
    idx, cu_local = _varlen_index(size, rank, split)
    cu_local = cu_local.to(dev)
    ql, kl, vl = (x[idx].to(dev).requires_grad_() for x in (q, k, v))
    out, lse = fd.ring_attention(ql, kl, vl, causal=causal, split=split, cu_seqlens=cu_local, return_lse=True,
                                 comm=comm)
    out.backward(dout[idx].to(dev))
    atol, rtol = TOL[dtype]
    for got, ref, what in ((out, want, "out"), (lse, want_lse[:, idx], "lse"), (ql.grad, wq, "dq"),
                           (kl.grad, wk, "dk"), (vl.grad, wv, "dv")):
        ref = ref if what == "lse" else ref[idx]
        err = (got.float().cpu() - ref.float()).abs() - rtol * ref.float().abs()
        assert err.max().item() <= atol, "%s %s rank %d: %s off by %.3g" % (name, comm, rank, what, err.max().item())
    runs = []
    for _ in range(2):
        a, b, c = (x[idx].to(dev).requires_grad_() for x in (q, k, v))
        o = fd.ring_attention(a, b, c, causal=causal, split=split, cu_seqlens=cu_local, deterministic=True,
                              comm=comm)
        o.backward(dout[idx].to(dev))
        runs.append([o.detach(), a.grad, b.grad, c.grad])
    for x, y in zip(*runs):
        assert torch.equal(x, y), "%s %s rank %d: deterministic reruns differ" % (name, comm, rank)


def _worker(rank, size, port, cases, errors):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if GPU:
        torch.cuda.set_device(rank)
    dist.init_process_group(BACKEND, init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=size)
    try:
        import flashcore
        from flashcore import distributed as fd
        for case in cases:
            for comm in ("p2p", "all_gather"):
                _check_case(case, size, rank, comm)
        for case in VARLEN_CASES:
            for comm in ("p2p", "all_gather"):
                _check_varlen(case, size, rank, comm)
        dt, d = _lift("float32", 8)
        opt = dict(device=_dev(rank), dtype=getattr(torch, dt))
        # one rank's cu_seqlens do not end at its tokens: every rank raises
        q = torch.randn(4, 2, d, **opt)
        cu = torch.tensor([0, 3 if rank == 1 else 4], dtype=torch.int32, device=opt["device"])
        with pytest.raises(flashcore.InvalidArgumentError, match="rank 1"):
            fd.ring_attention(q, q, q, cu_seqlens=cu)
        # ranks disagree on the heads, or one rank's k holds other tokens
        # than its q: every rank raises (none hangs)
        q = torch.randn(1, 4, 2 + rank, d, **opt)
        with pytest.raises(flashcore.InvalidArgumentError, match="same batch, heads and head_dim"):
            fd.ring_attention(q, q, q, split="zigzag")
        q, k = torch.randn(1, 4, 2, d, **opt), torch.randn(1, 5 if rank == 1 else 4, 2, d, **opt)
        with pytest.raises(flashcore.InvalidArgumentError, match="the same tokens"):
            fd.ring_attention(q, k, k)
        # ranks disagree on an option: every rank raises (none hangs or
        # computes another attention)
        q = torch.randn(1, 4, 2, d, **opt)
        for name, kw in (("causal", dict(causal=rank == 1)), ("comm", dict(comm="all_gather" if rank else "p2p")),
                         ("softcap", dict(softcap=2.0 if rank else 0.0)), ("scale", dict(scale=0.5 if rank else None)),
                         ("split", dict(split="zigzag" if rank else "contiguous"))):
            with pytest.raises(flashcore.InvalidArgumentError, match="another %s than rank 0" % name):
                fd.ring_attention(q, q, q, **kw)
        q = q.to(torch.float16) if rank else q
        with pytest.raises(flashcore.InvalidArgumentError, match="another dtype than rank 0"):
            fd.ring_attention(q, q, q)
        # a group that runs no gloo (NCCL): the shapes and cu_seqlens go
        # through a gloo group made over its ranks once (forced here on
        # gloo, the host path NCCL calls take), with the same checks
        fd._runs_on_host = lambda group: False
        _check_case(cases[0], size, rank, "p2p")
        _check_varlen(VARLEN_CASES[0], size, rank, "all_gather")
        host = fd._HOST_GROUPS[dist.group.WORLD]
        assert host is not dist.group.WORLD and dist.get_world_size(host) == size and len(fd._HOST_GROUPS) == 1
        q = torch.randn(1, 4, 2 + rank, d, **opt)
        with pytest.raises(flashcore.InvalidArgumentError, match="same batch, heads and head_dim"):
            fd.ring_attention(q, q, q)
        assert fd._HOST_GROUPS[dist.group.WORLD] is host
    except BaseException as e:  # noqa: B902 (reported to the parent, which fails the test)
        errors.put("rank %d: %s: %s" % (rank, type(e).__name__, e))
        dist.destroy_process_group()
        raise
    _exit_after(dist)


def _exit_after(d):
    """Leave a rank whose checks all passed without the interpreter's
    finalisation: there gloo's worker threads can still hold finished
    send/recv work whose tensors need the GIL, and about one spawned rank
    in three aborted ('terminate called without an active exception')
    after every check had passed."""
    d.barrier()
    d.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.mark.parametrize("size", SIZES)
def test_ring_attention_equals_one_call(size):
    if GPU and torch.cuda.device_count() < size:
        pytest.skip("%d ranks need %d GPUs" % (size, size))
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    # CPU ranks: the other sizes run the contiguous and odd-length cases (the suite's time)
    cases = CASES if size == 2 or GPU else [c for c in CASES if c[8] == "contiguous" or "odd-" in c[0]]
    try:
        mp.start_processes(_worker, args=(size, _free_port(), cases, errors), nprocs=size, start_method="spawn")
    except Exception as e:  # a rank raised: its message
        msgs = []
        while not errors.empty():
            msgs.append(errors.get())
        pytest.fail("; ".join(msgs) or str(e))


def test_not_initialised():
    import flashcore
    from flashcore import distributed as fd
    if dist.is_initialized():
        pytest.skip("a process group is already initialised")
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(flashcore.InvalidArgumentError, match="not initialised"):
        fd.ring_attention(q, q, q)
