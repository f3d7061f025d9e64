"""hadamard(): incoherent processing for FP8 attention. An orthonormal
rotation R of the head dimension leaves the scores unchanged, (q R)(k R)^T
= q k^T, but spreads a few large channels (outliers) over all of them, so
that one per-tensor FP8 scale loses less of everything else: rotate q and k
by the same R before quantising them (attention(hadamard(q), hadamard(k), v)
is attention(q, k, v) up to rounding).

R is the Walsh-Hadamard matrix scaled by 1/sqrt(n) (symmetric and its own
inverse), applied in blocks of n along the last axis: n = the head dim
where that is a power of two, else the largest power of two dividing it
(96: blocks of 32), or the caller's block. A fast transform: log2(n)
passes of sums and differences, in float32 (float64 for float64 input),
written back in the input's dtype; numpy arrays and torch tensors (CPU or
CUDA, on torch's current stream), no library call.
"""

import numpy as np

from . import _arrays
from .errors import InvalidArgumentError


def _block_for(d, block):
    if block is None:
        return d & -d  # the largest power of two dividing d
    if not isinstance(block, int) or isinstance(block, bool) or block < 1 or block & (block - 1) or d % block:
        raise InvalidArgumentError("hadamard: block must be a power of two dividing the last axis (%d), got %r"
                                   % (d, block))
    return block


def hadamard(x, *, block=None):
    """x (numpy array or torch tensor, floating, last axis the head dim)
    times the orthonormal Walsh-Hadamard matrix in blocks of `block`
    (default: the largest power of two dividing the head dim), a new
    array of x's kind, shape and dtype. Module docstring: why and when."""
    torch = _arrays._torch() if _arrays.is_torch(x) else None
    if torch is None and not isinstance(x, np.ndarray):
        raise InvalidArgumentError("hadamard: x must be a numpy array or a torch tensor, got %s" % type(x).__name__)
    floating = x.is_floating_point() if torch is not None else x.dtype.kind == "f" or x.dtype.name == "bfloat16"
    if not floating or x.ndim < 1 or x.shape[-1] < 1:
        raise InvalidArgumentError("hadamard: x must be floating with a last axis of at least 1, got %s %s"
                                   % (x.dtype, tuple(x.shape)))
    d = x.shape[-1]
    n = _block_for(d, block)
    wide = (torch.float64 if x.dtype == torch.float64 else torch.float32) if torch is not None else \
        (np.float64 if x.dtype == np.float64 else np.float32)
    y = x.to(wide) if torch is not None else x.astype(wide)
    lead = tuple(x.shape[:-1]) + (d // n,)
    h = 1
    while h < n:  # pairs h apart within blocks of 2h: (a + b, a - b)
        y = y.reshape(lead + (n // (2 * h), 2, h))
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2) if torch is not None else np.stack((a + b, a - b), axis=-2)
        h *= 2
    y = y.reshape(tuple(x.shape)) * (1.0 / np.sqrt(n))
    return y.to(x.dtype) if torch is not None else y.astype(x.dtype)
