"""attention() and supported(): argument checks, the per-thread context and
the calls into fc_attention_forward / fc_attention_supported."""

import collections
import ctypes
import threading

from . import _arrays, _lib, _limits
from .errors import InvalidArgumentError, NoDeviceError, UnsupportedError, error_for_status

KernelInfo = collections.namedtuple("KernelInfo", "backend name num_splits workspace_bytes")

_CUDA_PATHS = (0, 80, 90)

# The C API: "an fc_context may be used by one thread at a time". Each Python
# thread gets its own, created on first use and freed with the thread-local.
_tls = threading.local()


class _Context:
    def __init__(self, lib):
        self._lib = lib
        handle = ctypes.c_void_p()
        status = lib.fc_context_create(ctypes.byref(handle))
        if status != 0:
            raise error_for_status(status, "fc_context_create failed")
        self.handle = handle
        self.device = -1     # what the C context holds now (library defaults)
        self.cuda_path = 0
        self.num_threads = 0
        env = _lib.tuning_from_env()
        if env:
            self.set_tuning(**env)

    def last_error(self):
        msg = self._lib.fc_last_error(self.handle)
        return msg.decode("utf-8", "replace") if msg else ""

    def check(self, status):
        if status != 0:
            raise error_for_status(status, self.last_error())

    def set_device(self, device):
        if device != self.device:
            self.check(self._lib.fc_context_set_device(self.handle, device))
            self.device = device

    def set_cuda_path(self, path):
        if path != self.cuda_path:
            self.check(self._lib.fc_context_set_cuda_path(self.handle, path))
            self.cuda_path = path

    def set_num_threads(self, n):
        self.check(self._lib.fc_context_set_num_threads(self.handle, n))
        self.num_threads = n

    def set_tuning(self, **fields):
        """Set the experimental tuning hooks: the given fields, every other
        field at its default (fc_tuning_init)."""
        t = _lib.fc_tuning()
        self._lib.fc_tuning_init(ctypes.byref(t))
        for name, value in fields.items():
            if name not in _lib.TUNING_ENV:
                raise InvalidArgumentError("tuning: no field %r (fields: %s)"
                                           % (name, ", ".join(_lib.TUNING_ENV)))
            if name == "sm90_trace_file":
                value = value.encode() if isinstance(value, str) else value
            else:
                value = _limits.int32(value, "tuning %s" % name)
            setattr(t, name, value)
        self.check(self._lib.fc_context_set_tuning(self.handle, ctypes.byref(t)))

    def get_tuning(self):
        t = _lib.fc_tuning()
        self.check(self._lib.fc_context_get_tuning(self.handle, ctypes.byref(t)))
        out = {name: getattr(t, name) for name, _ in t._fields_}
        if out["sm90_trace_file"] is not None:
            out["sm90_trace_file"] = out["sm90_trace_file"].decode("utf-8", "replace")
        return out

    def __del__(self):
        try:
            self._lib.fc_context_free(self.handle)
        except Exception:  # interpreter shutdown: nothing useful to do
            pass


def context():
    """This thread's context (created on first use)."""
    ctx = getattr(_tls, "ctx", None)
    if ctx is None:
        ctx = _Context(_lib.load())
        _tls.ctx = ctx
    return ctx


def last_kernel_info():
    """KernelInfo of this thread's last successful attention() call, or None."""
    return getattr(_tls, "info", None)


def last_host_profile():
    """Host time of this thread's last successful attention() call inside the
    library, as a dict of microseconds: check_us, select_us, launch_us,
    total_us (fc_last_host_profile; zeros before the first call)."""
    ctx = context()
    prof = _lib.fc_host_profile()
    ctx.check(ctx._lib.fc_last_host_profile(ctx.handle, ctypes.byref(prof)))
    return {name: float(getattr(prof, name)) for name, _ in _lib.fc_host_profile._fields_}


def _kernel_info(info):
    return KernelInfo(_lib.BACKEND_NAMES.get(info.backend, str(info.backend)),
                      info.name.decode("utf-8", "replace"), int(info.num_splits),
                      int(info.workspace_bytes))


class _Call:
    """A fully checked request: the C args struct, the objects it points into
    (kept alive until the call returns) and the results to hand back."""

    __slots__ = ("args", "keep", "out", "lse", "device", "q")


def _check_names(layout, backend):
    if not isinstance(layout, str) or layout.lower() not in ("bshd", "bhsd"):
        raise InvalidArgumentError("layout: expected 'bshd' ([B,S,H,D]) or 'bhsd' ([B,H,S,D]), got %r"
                                   % (layout,))
    if not isinstance(backend, str) or backend.lower() not in _lib.BACKENDS:
        raise InvalidArgumentError("backend: expected one of %s, got %r"
                                   % (", ".join(sorted(_lib.BACKENDS)), backend))
    return layout.lower(), backend.lower()


def _fill_options(args, causal, window, softcap, scale):
    """The scalar options, range-checked before ctypes narrows them."""
    if window is None:
        window = (-1, -1)
    try:
        wl, wr = window
    except (TypeError, ValueError):
        raise InvalidArgumentError("window: expected (left, right) integers, -1 = unbounded, got %r"
                                   % (window,)) from None
    args.window_left = _limits.int32(wl, "window left")
    args.window_right = _limits.int32(wr, "window right")
    args.scale = 0.0 if scale is None else _limits.float32(scale, "scale", "1/sqrt(head_dim)")
    args.softcap = _limits.float32(softcap or 0.0, "softcap", "no cap")
    args.causal = 1 if causal else 0


def _check_operands(vq, vk, vv, varlen, layout, backend):
    want = 3 if varlen else 4
    what = "[total, heads, head_dim] (varlen)" if varlen else (
        "[batch, seqlen, heads, head_dim]" if layout == "bshd" else "[batch, heads, seqlen, head_dim]")
    for name, x in (("q", vq), ("k", vk), ("v", vv)):
        if len(x.shape) != want:
            raise InvalidArgumentError("%s: expected a %d-D tensor %s, got shape %s"
                                       % (name, want, what, x.user_shape))
        if x.kind != vq.kind:
            raise InvalidArgumentError("%s: is a %s object but q is a %s object" % (name, x.kind, vq.kind))
        if x.device != vq.device:
            raise InvalidArgumentError("%s: is on %s but q is on %s"
                                       % (name, x.device_str(), vq.device_str()))
        if x.dtype != vq.dtype:
            raise InvalidArgumentError("%s: dtype %s differs from q's %s"
                                       % (name, x.elem_dtype, vq.elem_dtype))
    on_cuda = vq.device[0] == "cuda"
    if on_cuda and backend in ("cpu", "cpu_reference"):
        raise InvalidArgumentError("backend=%r: q, k, v are CUDA tensors; the CPU backends read host memory"
                                   % backend)
    if not on_cuda and backend == "cuda":
        raise InvalidArgumentError("backend='cuda': q, k, v are in host memory; pass CUDA tensors")


def _out_view(vq, out, layout):
    if out is None:
        return _arrays.empty(vq, vq.user_shape, layout=layout)
    vo = _arrays.view(out, "out", layout, written=True)
    if vo.kind != vq.kind or vo.device != vq.device:
        raise InvalidArgumentError("out: is a %s object on %s but q is a %s object on %s"
                                   % (vo.kind, vo.device_str(), vq.kind, vq.device_str()))
    if vo.dtype != vq.dtype:
        raise InvalidArgumentError("out: dtype %s differs from q's %s" % (vo.elem_dtype, vq.elem_dtype))
    if vo.user_shape != vq.user_shape:
        raise InvalidArgumentError("out: shape %s differs from q's %s" % (vo.user_shape, vq.user_shape))
    return vo


def _no_query_rows(vq, vk, vv, vo, vl):
    """A dense call whose q has no row (batch or seqlen_q 0): the library's
    dense tensors have every dimension >= 1, so it goes in as a varlen call of
    one empty sequence, which the library checks in full (heads, head_dim,
    options, outputs) and answers without work. Only what the varlen form
    drops is checked here."""
    if vk.shape[0] != vq.shape[0]:
        raise InvalidArgumentError("k: batch %d differs from q's %d" % (vk.shape[0], vq.shape[0]))
    if vv.shape != vk.shape:
        raise InvalidArgumentError("v: shape %s differs from k's %s" % (vv.user_shape, vk.user_shape))
    views = [_arrays.no_rows(x) for x in (vq, vk, vv, vo)]
    return views + [_arrays.no_rows(vl, lse=True) if vl is not None else None]


def _fill_varlen(args, call, vq, vk, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    kq, pq, nq, mq = _arrays.seqlens(cu_seqlens_q, "cu_seqlens_q", vq, vq.shape[0])
    kk, pk, nk, mk = _arrays.seqlens(cu_seqlens_k, "cu_seqlens_k", vq, vk.shape[0])
    if nq != nk:
        raise InvalidArgumentError("cu_seqlens_q has %d entries but cu_seqlens_k has %d "
                                   "(both are batch+1)" % (nq, nk))
    call.keep += [kq, kk]
    if max_seqlen_q is None:
        max_seqlen_q = mq if mq is not None else _arrays.device_seqlens_max(kq, "cu_seqlens_q", vq.shape[0])
    if max_seqlen_k is None:
        max_seqlen_k = mk if mk is not None else _arrays.device_seqlens_max(kk, "cu_seqlens_k", vk.shape[0])
    args.cu_seqlens_q, args.cu_seqlens_k = pq, pk
    args.num_seqs = _limits.int32(nq - 1, "cu_seqlens_q entries - 1 (batch)")
    args.max_seqlen_q = _limits.int32(max_seqlen_q, "max_seqlen_q")
    args.max_seqlen_k = _limits.int32(max_seqlen_k, "max_seqlen_k")


def _prepare(q, k, v, causal, window, softcap, scale, cu_seqlens_q, cu_seqlens_k,
             max_seqlen_q, max_seqlen_k, return_lse, backend, out, layout, lib):
    layout, backend = _check_names(layout, backend)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise InvalidArgumentError("cu_seqlens_q and cu_seqlens_k: give both or neither")
    if varlen and layout != "bshd":
        raise InvalidArgumentError("layout: variable-length tensors are [total, heads, head_dim]; "
                                   "layout='bhsd' applies to 4-D tensors only")
    args = _lib.new_args(lib)
    _fill_options(args, causal, window, softcap, scale)
    args.backend = _lib.BACKENDS[backend]

    vq = _arrays.view(q, "q", layout)
    vk = _arrays.view(k, "k", layout)
    vv = _arrays.view(v, "v", layout)
    _check_operands(vq, vk, vv, varlen, layout, backend)
    vo = _out_view(vq, out, layout)
    vl = None
    if return_lse:
        if varlen:
            lse_shape = (vq.shape[1], vq.shape[0])              # [heads_q, total_q]
        else:
            lse_shape = (vq.shape[0], vq.shape[2], vq.shape[1])  # [batch, heads_q, seqlen_q]
        vl = _arrays.empty(vq, lse_shape, float32=True)

    call = _Call()
    call.keep = [vq, vk, vv, vo, vl]
    call.device = vq.device
    call.q = vq
    call.out = vo.obj
    call.lse = vl.obj if vl is not None else None
    if not varlen and (vq.shape[0] == 0 or vq.shape[1] == 0):
        vq, vk, vv, vo, vl = _no_query_rows(vq, vk, vv, vo, vl)
        _fill_varlen(args, call, vq, vk, [0, 0], [0, 0], 0, 0)
    elif varlen:
        _fill_varlen(args, call, vq, vk, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    vq.fill(args.q)
    vk.fill(args.k)
    vv.fill(args.v)
    vo.fill(args.out)
    if vl is not None:
        vl.fill(args.lse)
    call.args = args
    return call


def _setup_context(ctx, call, cuda_path):
    path = 0 if cuda_path is None else cuda_path
    if path not in _CUDA_PATHS:
        raise InvalidArgumentError("cuda_path: expected None/0 (automatic), 80 or 90, got %r" % (cuda_path,))
    ctx.set_cuda_path(path)
    ctx.set_device(call.device[1] if call.device[0] == "cuda" else -1)


def _stream(call):
    if call.device[0] != "cuda":
        return None
    torch = _arrays._torch()
    return torch.cuda.current_stream(torch.device("cuda", call.device[1])).cuda_stream


def attention(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, scale=None,
              cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
              return_lse=False, backend="auto", out=None, layout="bshd", cuda_path=None):
    """Attention forward: softmax(scale * q k^T + mask) v.

    q [B,Sq,Hq,D], k/v [B,Sk,Hkv,D] (layout='bshd', the library's order) or
    [B,H,S,D] (layout='bhsd', torch's order; strides are permuted, no copy);
    variable length: [total, H, D] with int32 cu_seqlens_q/k (batch+1 offsets).
    numpy arrays (host) or torch tensors (CPU or CUDA; CUDA work is queued on
    torch's current stream of q's device). Returns out (same kind, shape and
    layout as q), and lse ([B,Hq,Sq] float32; varlen [Hq,total_q]) when
    return_lse. cuda_path=80/90 forces one CUDA kernel family (tests, peers).
    Raises a FlashCoreError subclass with the library's message on failure;
    a failed call has not written out.
    """
    lib = _lib.load()
    ctx = context()
    call = _prepare(q, k, v, causal, window, softcap, scale, cu_seqlens_q, cu_seqlens_k,
                    max_seqlen_q, max_seqlen_k, return_lse, backend, out, layout, lib)
    _setup_context(ctx, call, cuda_path)
    info = _lib.fc_kernel_info()
    status = lib.fc_attention_forward(ctx.handle, ctypes.byref(call.args), _stream(call),
                                      ctypes.byref(info))
    ctx.check(status)
    _tls.info = _kernel_info(info)
    if return_lse:
        return call.out, call.lse
    return call.out


def supported(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, scale=None,
              cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
              return_lse=False, backend="auto", out=None, layout="bshd", cuda_path=None):
    """Would attention() accept these arguments? Returns (True, kernel name)
    or (False, reason). Launches nothing and reads no tensor data (except
    CUDA cu_seqlens, which the library validates)."""
    lib = _lib.load()
    ctx = context()
    try:
        call = _prepare(q, k, v, causal, window, softcap, scale, cu_seqlens_q, cu_seqlens_k,
                        max_seqlen_q, max_seqlen_k, return_lse, backend, out, layout, lib)
        _setup_context(ctx, call, cuda_path)
    except (InvalidArgumentError, UnsupportedError, NoDeviceError) as e:
        return False, str(e)
    info = _lib.fc_kernel_info()
    status = lib.fc_attention_supported(ctx.handle, ctypes.byref(call.args), ctypes.byref(info))
    if status != 0:
        return False, ctx.last_error()
    return True, info.name.decode("utf-8", "replace")
