"""The kept forward calls (flashcore._call_cache) on CPU torch tensors: a
call served from the cache gives the answer of a full call on new data
(out= included), a signature differs with every shape, stride, dtype and
option, and what is never kept (varlen, empty tensors, unhashable options)
still works. The binding's Python path throughout (the C++ eager call, which
keeps nothing, is switched off: test_eager_call.py tests it). Skipped
without torch."""

import pytest

import flashcore
from flashcore import _call_cache

import fc_reference as ref

torch = pytest.importorskip("torch")
lib_np = ref.torch_to_lib
pytestmark = pytest.mark.usefixtures("python_eager_path")


def rand(shape, seed, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def check(out, lse, q, k, v, layout="bshd", dtype="f32", **opts):
    ro, rl = ref.attention(*(lib_np(x, layout) for x in (q, k, v)), **opts)
    ref.check(lib_np(out, layout), None if lse is None else lse.numpy(), ro,
              None if lse is None else rl, dtype)


def test_kept_calls_match_full_calls_on_new_data():
    _call_cache._kept.clear()
    calls = [  # (shapes, layout, options): each a signature of its own
        ([(2, 9, 4, 16), (2, 12, 2, 16)], "bshd", dict(causal=True)),
        ([(2, 4, 9, 16), (2, 2, 12, 16)], "bhsd", dict(window=(3, 1), softcap=2.0)),
        ([(1, 5, 2, 32), (1, 7, 2, 32)], "bshd", dict(scale=0.3, return_lse=True)),
    ]
    for seed in range(3):  # seed 0 fills the cache, 1 and 2 are served from it
        for i, (shapes, layout, opts) in enumerate(calls):
            q, k, v = rand(shapes[0], seed * 10 + i), rand(shapes[1], seed * 10 + i + 5), \
                rand(shapes[1], seed * 10 + i + 7)
            res = flashcore.attention(q, k, v, layout=layout, **opts)
            out, lse = res if opts.get("return_lse") else (res, None)
            assert out.shape == q.shape and (lse is None or lse.dtype == torch.float32)
            check(out, lse, q, k, v, layout, **{n: x for n, x in opts.items() if n != "return_lse"})
            assert flashcore.kernel_info.backend == "cpu"
        assert len(_call_cache._kept) == len(calls)


def test_each_difference_is_a_new_signature():
    _call_cache._kept.clear()
    q = rand((1, 8, 2, 16), 1)
    variants = [
        (q, {}), (q, dict(causal=True)), (q.half(), {}), (q[:, :6], {}),
        (rand((1, 2, 8, 16), 2).transpose(1, 2), {}),  # same shape, other strides
    ]
    for x, opts in variants:
        out = flashcore.attention(x, x, x, **opts)
        check(out, None, x, x, x, dtype="f16" if x.dtype == torch.float16 else "f32", **opts)
    assert len(_call_cache._kept) == len(variants)


def test_kept_calls_with_out():
    _call_cache._kept.clear()
    for seed in range(3):
        q = rand((1, 6, 2, 16), seed)
        out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
        assert flashcore.attention(q, q, q, out=out) is out
        check(out, None, q, q, q)
    assert len(_call_cache._kept) == 1
    # The same signature with out aliasing q: served from the cache, refused
    # by the library's own checks (which run on every call), q untouched.
    q0 = q.clone()
    with pytest.raises(flashcore.InvalidArgumentError, match="overlap"):
        flashcore.attention(q, q, q, out=q)
    assert torch.equal(q, q0)
    leaf = torch.zeros(q.shape, requires_grad=True)  # another signature: refused, not kept
    with torch.no_grad(), pytest.raises(flashcore.InvalidArgumentError, match="^out: a leaf tensor"):
        flashcore.attention(q, q, q, out=leaf)
    assert len(_call_cache._kept) == 1 and torch.all(leaf == 0)


def test_calls_that_are_never_kept():
    _call_cache._kept.clear()
    q = rand((1, 6, 2, 16), 3)
    check(flashcore.attention(q, q, q, window=[2, 0]), None, q, q, q, window=(2, 0))  # a list
    cu = torch.tensor([0, 6], dtype=torch.int32)
    o = flashcore.attention(q[0], q[0], q[0], cu_seqlens_q=cu, cu_seqlens_k=cu)
    check(o[None], None, q, q, q)
    assert flashcore.attention(q[:, :0], q, q).shape == (1, 0, 2, 16)
    assert not _call_cache._kept


def test_a_failed_call_is_not_kept():
    _call_cache._kept.clear()
    q, k = rand((1, 6, 4, 16), 4), rand((1, 6, 3, 16), 5)
    for _ in range(2):
        with pytest.raises(flashcore.InvalidArgumentError, match="heads_q 4 is not a multiple"):
            flashcore.attention(q, k, k)
    assert not _call_cache._kept
