"""FlashCore as torch operators: flashcore::attention_fwd and
flashcore::attention_bwd (torch.library custom ops), their fake
implementations (shapes, dtypes, the lse shape: what torch.compile and meta
tensors need) and autograd (register_autograd), so a model that calls
flashcore compiles with fullgraph=True and loss.backward() runs the
library's backward. attention_fwd also takes a paged KV cache (block_table,
seqused_k: flashcore.attention_with_kvcache), whose gradient raises.

A call that appends to the cache (k_new, v_new, the rotary tables) writes
k and v, which attention_fwd declares read-only: it is the op
flashcore::attention_fwd_append instead, whose schema marks k and v
mutated (Tensor(a!), Tensor(b!)), so autograd bumps their versions and
torch.compile functionalizes the write (it is never a reordered or dropped
side effect). A separate op because a schema cannot mutate conditionally:
attention_fwd marked mutating would make every compiled read of a cache
copy it. torch allows no autograd formula on a mutating op, and
flash-attn's append has no gradient either: while autograd records, the
op runs inside _AppendNoBackward, whose backward raises UnsupportedError
(as a paged call's does), and a cache that itself requires grad is
refused (its history would not see the write).

FP8 calls (FP8 q, k or v) take neither op: they have no backward and
the schemas carry no descales. flashcore.attention runs them eagerly
(no_backward: while autograd records one, its out's backward raises
UnsupportedError), and attention_fwd refuses FP8 tensors.

Imported only where torch already is (flashcore/__init__ when torch was
imported first, else the first call that needs it), so importing flashcore
never imports torch. The ops pass tensors as they are (any strides, no
copy) and run on torch's current CUDA stream, like flashcore.attention.

The kernels here (_forward_op, _backward_op) are the Python path. The
first call of one loads C++ kernels for attention_fwd and attention_bwd
(_torch_ext: CPU, CUDA, and the autograd step), which hand what they do
not take, and every error, back to these functions through the private
ops _attention_fwd_py and _attention_bwd_py. _setup_context and
_backward_rule are the autograd formula of the calls the C++ kernels leave
to it (eager training on plain tensors records its C++ copy instead).
"""

import collections

import torch

from . import _arrays, _attention, _backward, _request, _torch_ext
from .errors import InvalidArgumentError, UnsupportedError

# The options both ops take, after their tensors. scale 0 = 1/sqrt(head_dim);
# max_seqlen -1 = found from the offsets; cuda_path 0 = automatic.
_OPTIONS = ("Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, "
            "float scale, float softcap, bool causal, int window_left, int window_right, "
            "bool bhsd, str backend, int cuda_path, bool deterministic")
Options = collections.namedtuple("Options", [p.split()[-1] for p in _OPTIONS.split(",")])
# The forward's last arguments, the paged cache (_request.PAGED); defaulted
# so that a call with Options alone is the dense one.
_PAGED = "Tensor? block_table=None, Tensor? seqused_k=None"
# attention_fwd_append's, after the paged cache (_request.APPEND, then
# rotary_interleaved). Optional, so that what eager mode refuses (v_new
# without k_new, rotary without k_new) is refused with the same error.
_APPEND = ("Tensor? k_new, Tensor? v_new, Tensor? rotary_cos, Tensor? rotary_sin, "
           "bool rotary_interleaved")
_N = len(Options._fields)

# Inductor must hand the ops the strides eager mode would: the library reads
# any layout but wants the last dimension contiguous.
_TAGS = (torch.Tag.needs_exact_strides,) if hasattr(torch.Tag, "needs_exact_strides") else ()


def _common(o, tail=None):
    """Options o as the binding's keyword arguments: the forward's, with
    tail (the ops' arguments after the options: block_table, seqused_k,
    then attention_fwd_append's k_new, v_new, rotary_cos, rotary_sin,
    rotary_interleaved), or else attention_backward's."""
    c = _request.common(o.causal, (o.window_left, o.window_right), o.softcap, o.scale or None, o.cu_seqlens_q,
                        o.cu_seqlens_k, None if o.max_seqlen_q < 0 else o.max_seqlen_q,
                        None if o.max_seqlen_k < 0 else o.max_seqlen_k, o.backend, "bhsd" if o.bhsd else "bshd",
                        *(tail or ()))
    if tail is None:
        for name in _request.FORWARD:
            del c[name]
    return c


def _lse_shape(q, varlen, bhsd):
    """lse's shape for the caller's q (_request.lse_shape)."""
    return _request.lse_shape((q.shape[0], q.shape[2], q.shape[1], q.shape[3]) if bhsd else q.shape, varlen)


def _forward_op(q, k, v, *opts):
    """Both forward ops' body: the append step's tensors, when present,
    are part of the tail _common passes on."""
    if not _torch_ext.tried:
        _torch_ext.load()  # C++ kernels for the calls after this one
    if fp8(q, k, v):  # flashcore.attention never brings them here (its out would not be the fake's)
        raise UnsupportedError("flashcore::attention_fwd: FP8 tensors are not taken by the ops (forward only, "
                               "no descales): call flashcore.attention eagerly")
    o = Options(*opts[:_N])
    return _attention._forward(q, k, v, True, None, o.cuda_path or None, _common(o, opts[_N:]))


_FWD_SCHEMA = "(Tensor q, Tensor k, Tensor v, %s, %s) -> (Tensor, Tensor)" % (_OPTIONS, _PAGED)
_BWD_SCHEMA = ("(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, %s)"
               " -> (Tensor, Tensor, Tensor)" % _OPTIONS)
_fwd = torch.library.custom_op("flashcore::attention_fwd", _forward_op, mutates_args=(), tags=_TAGS,
                               schema=_FWD_SCHEMA)


@_fwd.register_fake
def _fwd_fake(q, k, v, *opts):
    # out and lse follow q alone: paged k/v hold pages, not sequences
    o = Options(*opts[:_N])
    lse = q.new_empty(_lse_shape(q, o.cu_seqlens_q is not None, o.bhsd), dtype=torch.float32)
    return _arrays.new_output(q, q.shape, o.bhsd), lse


_fwd_append = torch.library.custom_op("flashcore::attention_fwd_append", _forward_op, mutates_args=("k", "v"),
                                      tags=_TAGS,
                                      schema="(Tensor q, Tensor(a!) k, Tensor(b!) v, %s, Tensor? block_table, "
                                             "Tensor? seqused_k, %s) -> (Tensor, Tensor)" % (_OPTIONS, _APPEND))
_fwd_append.register_fake(_fwd_fake)  # the cache's writes change no shape


class _AppendNoBackward(torch.autograd.Function):
    """attention_fwd_append for a call that autograd records: its outputs
    get a backward that raises (the op may have no autograd formula)."""

    @staticmethod
    def forward(ctx, *args):
        out, lse = torch.ops.flashcore.attention_fwd_append(*args)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        raise UnsupportedError(
            "backward of a call that appends to a KV cache (k_new/v_new: flashcore.attention_with_kvcache): "
            "not implemented, as in flash-attn; call it under torch.no_grad() or torch.inference_mode()")


def _backward_op(dout, q, k, v, out, lse, *opts):
    if not _torch_ext.tried:
        _torch_ext.load()
    o = Options(*opts)
    # cuda_path is the forward's: the backward picks its own kernel family.
    return _backward.attention_backward(dout, q, k, v, out, lse, deterministic=o.deterministic,
                                        **_common(o))


_bwd = torch.library.custom_op("flashcore::attention_bwd", _backward_op, mutates_args=(), tags=_TAGS,
                               schema=_BWD_SCHEMA)


@_bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, *opts):
    bhsd = Options(*opts).bhsd
    return tuple(_arrays.new_output(x, x.shape, bhsd) for x in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k = inputs[:5]
    out, lse = output
    ctx.paged = any(x is not None for x in inputs[3 + _N:])
    if not ctx.paged:  # a paged call has no backward: nothing to keep for one
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.opts = inputs[5:3 + _N]
    ctx.mark_non_differentiable(lse)


def _backward_rule(ctx, dout, _dlse):
    if ctx.paged:
        raise UnsupportedError(
            "backward of a paged KV cache or seqused_k call (flashcore.attention_with_kvcache): "
            "not implemented, as in flash-attn; call it under torch.no_grad() or "
            "torch.inference_mode(), or use dense k, v without seqused_k for training")
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    # out.sum().backward() hands a broadcast dout (stride 0 everywhere); the
    # library reads any strides but a contiguous last dimension.
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dq, dk, dv = torch.ops.flashcore.attention_bwd(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.opts)
    return (dq, dk, dv) + (None,) * (_N + 2)


def _no_double_backward(ctx, *grads):
    raise UnsupportedError("double backward: the gradients of flashcore attention's gradients "
                           "(create_graph=True, then backward again) are not implemented")


_fwd.register_autograd(_backward_rule, setup_context=_setup_context)
_bwd.register_autograd(_no_double_backward, setup_context=lambda ctx, inputs, output: None)

# The Python kernels again, as ops of the same schemas that the C++ kernels
# (_torch_ext) hand what they do not take and every call the library
# refuses: the results and errors of the Python path, by construction.
# Never traced (they run inside a kernel, below autograd).
_py = torch.library.Library("flashcore", "FRAGMENT")
_py.define("_attention_fwd_py" + _FWD_SCHEMA)
_py.impl("_attention_fwd_py", _forward_op, "CompositeExplicitAutograd")
_py.define("_attention_bwd_py" + _BWD_SCHEMA)
_py.impl("_attention_bwd_py", _backward_op, "CompositeExplicitAutograd")


def load_kernels():
    """Load the C++ kernels (_torch_ext; once a process): the ops' and
    flashcore.attention's eager call, for the calls after this one."""
    if not _torch_ext.tried:
        _torch_ext.load()


def routes(q, k, v, appended=()):
    """Does a call on q, k, v (and the append step's tensors, appended:
    k_new, v_new, rotary_cos, rotary_sin) go through an op: torch tensors
    that autograd records, a call being traced by torch.compile, or tensors
    with no data (meta, fake) whose shapes only the fake implementation can
    give."""
    if torch.compiler.is_compiling() or q.is_meta:
        return True
    if not torch.is_grad_enabled():
        return False
    # k or v may be of another type (numpy): the direct path names that error
    return (q.requires_grad or getattr(k, "requires_grad", False) or getattr(v, "requires_grad", False)
            or (bool(appended) and any(getattr(x, "requires_grad", False) for x in appended)))


_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))


def fp8(q, k, v):
    """Is q, k or v an FP8 tensor (an FP8 call, or an FP8 K/V cache)?"""
    return any(getattr(x, "dtype", None) in _FP8 for x in (q, k, v))


class _Fp8NoBackward(torch.autograd.Function):
    """An FP8 call (run eagerly: it takes no op) that autograd records: its
    out gets a backward that raises."""

    @staticmethod
    def forward(ctx, run, *inputs):
        return run()

    @staticmethod
    def backward(ctx, dout):
        raise UnsupportedError(
            "backward of an FP8 call (FP8 q, k or v): FP8 attention is forward-only; call it under "
            "torch.no_grad() or torch.inference_mode(), or with float32/float16/bfloat16 tensors for training")


def no_backward(run, q, k, v):
    """run() (an eager FP8 call: (out, lse or None, ...)), whose out gets a
    backward that raises UnsupportedError while autograd records q, k or
    v (else run() as it is)."""
    if not (torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in (q, k, v))):
        return run()
    res = []
    out = _Fp8NoBackward.apply(lambda: res.extend(run()) or res[0], q, k, v)
    return (out, *res[1:])


def _tensor(x):
    """An optional integer argument (offsets, block table, key counts) as the
    op's Tensor? (lists and numpy arrays are converted)."""
    return x if x is None or isinstance(x, torch.Tensor) else torch.as_tensor(x)


def _float_tensor(x, name):
    """An appended tensor (k_new, v_new, a rotary table) for the op: a torch
    tensor, as the direct call requires (it is never converted)."""
    if x is not None and not isinstance(x, torch.Tensor):
        raise InvalidArgumentError("%s: a %s.%s, but q is a torch tensor: pass a torch tensor on q's device"
                                   % (name, type(x).__module__, type(x).__name__))
    return x


def attention(q, k, v, *, causal, window, softcap, scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
              max_seqlen_k, return_lse, backend, out, layout, cuda_path, deterministic, block_table,
              seqused_k, k_new=None, v_new=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=False):
    """flashcore.attention through flashcore::attention_fwd, or
    flashcore::attention_fwd_append when it appends (see routes())."""
    if out is not None:
        raise InvalidArgumentError(
            "out: not supported when q, k or v require grad or under torch.compile (the op "
            "returns a new output); pass no out, or call eagerly under torch.no_grad()")
    layout, backend = _request.check_names(layout, backend)
    wl, wr = _request.window_pair(window)
    args = (q, k, v, _tensor(cu_seqlens_q), _tensor(cu_seqlens_k),
            -1 if max_seqlen_q is None else max_seqlen_q, -1 if max_seqlen_k is None else max_seqlen_k,
            0.0 if scale is None else float(scale), float(softcap or 0.0), bool(causal), wl, wr,
            layout == "bhsd", backend, cuda_path or 0, bool(deterministic), _tensor(block_table),
            _tensor(seqused_k))
    append = (k_new, v_new, rotary_cos, rotary_sin)
    op = torch.ops.flashcore.attention_fwd
    if any(x is not None for x in append):
        args += (*(_float_tensor(x, n) for x, n in zip(append, _request.APPEND)), bool(rotary_interleaved))
        op = torch.ops.flashcore.attention_fwd_append
        if torch.is_grad_enabled():
            for x, name in ((k, "k"), (v, "v")):
                if getattr(x, "requires_grad", False):
                    raise InvalidArgumentError(
                        "%s: requires grad, but k_new/v_new are written into it in place, which its autograd "
                        "history would not see; append to a cache that does not require grad (detach it), or "
                        "call under torch.no_grad()" % name)
            if any(getattr(x, "requires_grad", False) for x in (q,) + append):
                op = _AppendNoBackward.apply
    res, lse = op(*args)
    return (res, lse) if return_lse else res
