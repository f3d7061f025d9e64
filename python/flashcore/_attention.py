"""attention() and supported(): the forward call (fc_attention_forward /
fc_attention_supported). Its arguments are checked in _request, the call
runs through _context; torch tensors that autograd records, and calls that
torch.compile traces, go through the flashcore::attention_fwd op
(_torch_ops), whose backward is _backward. FP8 calls (_fp8: descales,
out_dtype, the amax outputs) always run directly.

While the torch ops' C++ kernels are in (_torch_ext, loaded by the first
eager call on torch tensors), an eager call is handed to their C++ eager
call (_eager) first: it runs the plain calls on torch tensors without this
module's Python, with the same checks, args and outputs, and answers None
for every other call (and every error), which runs here."""

from . import _arrays, _call_cache, _context, _fp8, _lib, _request


def _prepare(q, k, v, return_lse, out, common, fp8=None):
    args = _context.context().args()
    call = _request.start(args, q, k, v, **common)
    vq = call.views[0]
    vo = _request.output(out, "out", vq, "q", call.layout, _fp8.out_type(fp8, vq, out))
    vl = None
    if return_lse:
        vl = _arrays.empty(vq, _request.lse_shape(vq.shape, call.varlen), float32=True)
    _request.finish(call, args, [(vo, args.out, False), (vl, args.lse, True)])
    _fp8.fill(call, args, fp8)
    call.results = (vo.obj, vl.obj if vl is not None else None)
    return call


def _not_compiling():
    return False


_ops = None  # flashcore._torch_ops, once _torch_ops() has run
_compiling = _not_compiling  # torch.compiler.is_compiling, once _torch_ops() has run
_eager = None  # the C++ eager call, while _torch_ext's kernels are in (it sets this)


def _torch_ops():
    """flashcore._torch_ops, imported on first use (only a caller holding
    torch tensors gets here). torch.compile guards on _ops and _compiling:
    flashcore/__init__ calls this when torch was imported first, so no
    compiled call sees them change (else the first compiled call is
    compiled once more)."""
    global _ops, _compiling
    if _ops is None:
        from . import _torch_ops
        _ops = _torch_ops
        _compiling = _torch_ops.torch.compiler.is_compiling
    return _ops


def _forward(q, k, v, return_lse, out, cuda_path, common, torch_q=True, fp8=None):
    """The library's forward, untracked: (out, lse or None). torch_q: q is a
    torch tensor (its calls may be kept, _call_cache). fp8: attention()'s
    FP8 options (_fp8.options), given: (out, lse or None, amax or None),
    and the call is not kept (the kept struct has no descales)."""
    sig = _call_cache.key(q, k, v, return_lse, out, cuda_path, common) if torch_q and fp8 is None else None
    if sig is not None:
        res = _call_cache.run(sig, q, k, v, out, cuda_path, common)
        if res is not None:
            return res
    call = _prepare(q, k, v, return_lse, out, common, fp8)
    _context.run(_lib.load().fc_attention_forward, call, cuda_path)
    _call_cache.keep(sig, call, (q,), cuda_path)
    return call.results if fp8 is None else (*call.results, call.amax)


def attention(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, scale=None,
              cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
              return_lse=False, backend="auto", out=None, layout="bshd", cuda_path=None,
              deterministic=False, block_table=None, seqused_k=None, k_new=None, v_new=None,
              rotary_cos=None, rotary_sin=None, rotary_interleaved=False, q_descale=None, k_descale=None,
              v_descale=None, out_dtype=None, return_amax=False):
    """Attention forward: softmax(scale * q k^T + mask) v.

    q [B,Sq,Hq,D], k/v [B,Sk,Hkv,D] (layout='bshd', the library's order) or
    [B,H,S,D] (layout='bhsd', torch's order; strides are permuted, no copy);
    variable length: [total, H, D] with int32 cu_seqlens_q/k (batch+1 offsets).
    numpy arrays (host) or torch tensors (CPU or CUDA; CUDA work is queued on
    torch's current stream of q's device). Returns out (same kind, shape and
    layout as q; a new torch out in 'bhsd' is a view of [B,S,H,D] memory, as
    SDPA's), and lse ([B,Hq,Sq] float32; varlen [Hq,total_q]) when
    return_lse. cuda_path=80/90 forces one CUDA kernel family (tests, peers).

    Paged KV cache (dense q; forward only): block_table int32 [B, max_pages]
    of page indices, k/v pages [num_pages, page_size, Hkv, D] ('bhsd':
    [num_pages, Hkv, page_size, D]); key j of sequence b is row
    j % page_size of page block_table[b, j // page_size]. seqused_k int32
    [B]: keys in use per sequence (dense or paged k/v; None: all), to which
    causal and windows align. flashcore.attention_with_kvcache is the
    flash-attn signature of this.

    Appending to the cache (dense q; forward only): k_new, v_new
    [B, seqlen_new, Hkv, D] (in the call's layout, like k and v; q's kind,
    device and dtype) are written into k/v (dense or paged) at keys
    seqused_k[b] .. seqused_k[b] + seqlen_new - 1, then the attention runs
    over seqused_k[b] + seqlen_new keys. seqused_k (required) holds the
    lengths before the append and is not updated. rotary_cos, rotary_sin
    [seqlen_ro, rotary_dim / 2] (q's dtype; need k_new) rotate the first
    rotary_dim dims of k_new (key position seqused_k[b] + t) and of q
    (position seqused_k[b] + i when causal or windowed, else seqused_k[b];
    q itself is not modified); rotary_interleaved pairs dims (2i, 2i+1),
    else (i, i + rotary_dim / 2). k and v must be writable; under autograd
    or torch.compile the call is the op flashcore::attention_fwd_append,
    which declares them mutated.

    Differentiable and traceable: with torch tensors that require grad (and
    grad mode on), under torch.compile, or on the meta device, the call is
    the custom op flashcore::attention_fwd (_torch_ops), whose backward runs
    the library's (flashcore.attention_backward) with these options; lse is
    then not differentiable, out= is refused, cuda_path applies to the
    forward only, and deterministic=True asks for a bitwise-reproducible
    backward. A paged, seqused_k or appending call has no backward: its
    gradient raises UnsupportedError.

    FP8 (forward only; the CPU backends, and on CUDA an FP8 K/V cache
    under float16/bfloat16 q, head dims 64/128): q, k, v of one FP8 type (ml_dtypes.float8_e4m3fn / float8_e5m2
    numpy arrays, torch.float8_e4m3fn / torch.float8_e5m2 tensors), out in
    out_dtype (float32, float16 or bfloat16 of q's kind; default
    bfloat16, or out's dtype where out= is given); or an FP8 K/V cache: k
    and v FP8 of one type under float32/float16/bfloat16 q, out in q's
    dtype (out_dtype may only repeat it, on any non-FP8 q). The result is
    attention on the dequantised inputs x * x_descale: q_descale,
    k_descale, v_descale (FP8 tensors only) are None (1), a number (one
    value for all), or a float32 array/tensor of q's kind and device,
    0-d or [batch, heads_kv] (varlen: [num_seqs, heads_kv]) with any
    strides (0 broadcasts: np.broadcast_to, torch expand); query head h
    uses kv head h // (Hq // Hkv). return_amax=True (FP8 calls) adds a
    float32 [2] array/tensor on q's device: (the largest |out| written,
    the largest softmax probability = max over rows of 1 / rowsum), 0
    where nothing is written. FP8 calls never go through the custom op:
    while autograd records one, its out has a backward that raises
    UnsupportedError (so does attention_backward on FP8 tensors); under
    torch.compile it is a graph break.

    Returns out; (out, lse) with return_lse; (out, amax) with
    return_amax; (out, lse, amax) with both.

    The first eager call on torch tensors loads the torch ops' C++ kernels
    (built once per torch and Python build with the system C++ compiler,
    ~20 s; FLASHCORE_TORCH_EXT=0 keeps the Python path): from then on the
    plain eager calls run without the binding's Python, with the same
    results and errors.

    Raises a FlashCoreError subclass with the library's message on failure;
    a failed call has not written out.
    """
    # _compiling() first: torch.compile reads no _eager (it traces the op
    # below); the eager call answers None for a call it does not take
    if not _compiling() and _eager is not None:
        res = _eager(q, k, v, causal, window, softcap, scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                     max_seqlen_k, return_lse, backend, out, layout, cuda_path, deterministic, block_table,
                     seqused_k, k_new, v_new, rotary_cos, rotary_sin, rotary_interleaved, q_descale, k_descale,
                     v_descale, out_dtype, return_amax)
        if res is not None:
            return res
    torch_q = _arrays.is_torch(q)
    fp8 = None  # the plain call without a function call: this runs on every call
    if q_descale is not None or k_descale is not None or v_descale is not None or out_dtype is not None \
            or return_amax:
        fp8 = _fp8.options(q_descale, k_descale, v_descale, out_dtype, return_amax)
    eager_fp8 = False
    if torch_q:
        ops = _torch_ops()
        appended = (k_new, v_new, rotary_cos, rotary_sin) if k_new is not None or v_new is not None else ()
        # FP8 calls never take the ops (FP8 has no backward, and their schemas
        # carry no descales): they run eagerly below, where autograd gets a
        # backward that raises; FP8 options on any other call meet the checks
        # there (the library's for a descale), not the op's silence.
        if ops.routes(q, k, v, appended):
            eager_fp8 = ops.fp8(q, k, v)
            if not eager_fp8 and _fp8.plain(fp8, q):
                return ops.attention(q, k, v, causal=causal, window=window, softcap=softcap, scale=scale,
                                     cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                     max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                     return_lse=return_lse, backend=backend, out=out, layout=layout,
                                     cuda_path=cuda_path, deterministic=deterministic,
                                     block_table=block_table, seqused_k=seqused_k, k_new=k_new,
                                     v_new=v_new, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                                     rotary_interleaved=rotary_interleaved)
        else:
            ops.load_kernels()  # the C++ eager call, for the calls after this one
    common = _request.common(causal, window, softcap, scale, cu_seqlens_q, cu_seqlens_k,
                             max_seqlen_q, max_seqlen_k, backend, layout, block_table, seqused_k,
                             k_new, v_new, rotary_cos, rotary_sin, rotary_interleaved)
    if eager_fp8:
        res = ops.no_backward(lambda: _forward(q, k, v, return_lse, out, cuda_path, common, True, fp8), q, k, v)
    elif fp8 is None:  # the plain call
        res, lse = _forward(q, k, v, return_lse, out, cuda_path, common, torch_q)
        return (res, lse) if return_lse else res
    else:
        res = _forward(q, k, v, return_lse, out, cuda_path, common, torch_q, fp8)
    picked = (res[0],) + ((res[1],) if return_lse else ()) + ((res[2],) if return_amax else ())
    return picked if len(picked) > 1 else picked[0]  # out, then lse, then amax


def supported(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, scale=None,
              cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
              return_lse=False, backend="auto", out=None, layout="bshd", cuda_path=None,
              deterministic=False, block_table=None, seqused_k=None, k_new=None, v_new=None,
              rotary_cos=None, rotary_sin=None, rotary_interleaved=False, q_descale=None, k_descale=None,
              v_descale=None, out_dtype=None, return_amax=False):
    """Would attention() accept these arguments? Returns (True, kernel name)
    or (False, reason). Runs no attention, writes nothing the caller passed
    (not even the cache k_new would be appended to) and reads no tensor
    data (except CUDA cu_seqlens, block_table and seqused_k, which the
    library validates); it does allocate what the call would (the output,
    an amax buffer, a number descale's one-float tensor on q's device).
    Asks about the forward only (attention_backward_supported asks about
    the backward)."""
    common = _request.common(causal, window, softcap, scale, cu_seqlens_q, cu_seqlens_k,
                             max_seqlen_q, max_seqlen_k, backend, layout, block_table, seqused_k,
                             k_new, v_new, rotary_cos, rotary_sin, rotary_interleaved)
    fp8 = _fp8.options(q_descale, k_descale, v_descale, out_dtype, return_amax)
    return _context.ask(_lib.load().fc_attention_supported,
                        lambda: _prepare(q, k, v, return_lse, out, common, fp8), cuda_path)
