"""The binding on the CPU with numpy: results against the float64 reference
(fc_reference.py), both layouts, lse, varlen, out=, errors with the library's
messages, version, threads. Runs anywhere the library builds (no GPU, no
torch needed)."""

import os
import re
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest

import flashcore
from flashcore import _lib
from flashcore.errors import STATUS_NAMES, error_for_status

import fc_reference as ref

try:
    import ml_dtypes
except ImportError:  # bf16 numpy arrays need ml_dtypes
    ml_dtypes = None

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "include" / "flashcore.h"

DTYPES = ["f32", "f16", pytest.param("bf16", marks=pytest.mark.skipif(
    ml_dtypes is None, reason="ml_dtypes not installed (numpy has no bfloat16)"))]


def np_dtype(name):
    return {"f32": np.float32, "f16": np.float16}.get(name) or ml_dtypes.bfloat16


def randn(rng, shape, dtype):
    # Never zeros: random N(0,1), rounded to the dtype (the reference reads the rounded values).
    return rng.standard_normal(shape).astype(np_dtype(dtype))


def to_lib(x, layout):
    """A [B,H,S,D] array viewed in the library's [B,S,H,D] order."""
    return x.transpose(0, 2, 1, 3) if layout == "bhsd" else x


def make_qkv(rng, B, Sq, Sk, Hq, Hkv, D, dtype, layout):
    if layout == "bhsd":
        shapes = [(B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D)]
    else:
        shapes = [(B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D)]
    return [randn(rng, s, dtype) for s in shapes]


# name, B, Sq, Sk, Hq, Hkv, D, options
CASES = [
    ("plain", 2, 33, 47, 4, 4, 64, {}),
    ("causal-sq<sk", 1, 17, 40, 4, 2, 32, dict(causal=True)),
    ("causal-sq>sk-empty-rows", 1, 40, 17, 2, 2, 32, dict(causal=True)),
    ("window", 2, 30, 30, 2, 1, 64, dict(window=(5, 3))),
    ("softcap-scale", 1, 20, 25, 4, 1, 128, dict(softcap=5.0, scale=0.3)),
    ("gqa-causal-window", 1, 50, 64, 8, 2, 64, dict(causal=True, window=(10, -1))),
    ("d256", 1, 9, 13, 2, 2, 256, {}),
]


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_dense_matches_reference(case, dtype, layout):
    name, B, Sq, Sk, Hq, Hkv, D, opts = case
    rng = np.random.default_rng(zlib.crc32(("%s/%s/%s" % (name, dtype, layout)).encode()))
    q, k, v = make_qkv(rng, B, Sq, Sk, Hq, Hkv, D, dtype, layout)
    out, lse = flashcore.attention(q, k, v, layout=layout, return_lse=True, **opts)
    assert isinstance(out, np.ndarray) and out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (B, Hq, Sq) and lse.dtype == np.float32
    r_out, r_lse = ref.attention(to_lib(q, layout), to_lib(k, layout), to_lib(v, layout), **opts)
    ref.check(to_lib(out, layout), lse, r_out, r_lse, dtype)
    info = flashcore.kernel_info
    assert info.backend == "cpu" and info.name


def test_last_host_profile():
    rng = np.random.default_rng(11)
    q, k, v = make_qkv(rng, 1, 16, 24, 2, 2, 32, "f32", "bshd")
    flashcore.attention(q, k, v, causal=True)
    prof = flashcore.last_host_profile()
    assert set(prof) == {"check_us", "select_us", "launch_us", "total_us"}
    assert all(prof[k] >= 0 for k in prof) and prof["launch_us"] > 0
    parts = prof["check_us"] + prof["select_us"] + prof["launch_us"]
    assert abs(prof["total_us"] - parts) <= 1e-6 * prof["total_us"] + 1e-3
    with pytest.raises(flashcore.InvalidArgumentError):
        flashcore.attention(q, k, v, window=(-2, 0))
    assert flashcore.last_host_profile() == prof  # a failed call leaves it


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_cpu_reference_backend(dtype):
    rng = np.random.default_rng(7)
    q, k, v = make_qkv(rng, 1, 12, 20, 4, 2, 32, dtype, "bshd")
    out, lse = flashcore.attention(q, k, v, causal=True, backend="cpu_reference", return_lse=True)
    assert flashcore.kernel_info.backend == "cpu_reference"
    r_out, r_lse = ref.attention(q, k, v, causal=True)
    ref.check(out, lse, r_out, r_lse, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen(dtype):
    rng = np.random.default_rng(11)
    lens_q = [5, 0, 17, 1, 9]
    lens_k = [8, 3, 17, 0, 30]  # an empty k sequence: its rows see no key
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int64)  # int64 is converted
    cu_k = [0] + list(np.cumsum(lens_k))                               # a list works too
    Hq, Hkv, D = 4, 2, 64
    q = randn(rng, (int(cu_q[-1]), Hq, D), dtype)
    k = randn(rng, (cu_k[-1], Hkv, D), dtype)
    v = randn(rng, (cu_k[-1], Hkv, D), dtype)
    out, lse = flashcore.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True,
                                   return_lse=True)
    assert out.shape == q.shape and lse.shape == (Hq, q.shape[0])
    r_out, r_lse = ref.attention_varlen(q, k, v, list(cu_q), cu_k, causal=True)
    ref.check(out, lse, r_out, r_lse, dtype)


def test_varlen_explicit_max_seqlen_too_small_is_the_librarys_error():
    rng = np.random.default_rng(3)
    q = randn(rng, (10, 2, 32), "f32")
    k = randn(rng, (10, 2, 32), "f32")
    with pytest.raises(flashcore.InvalidArgumentError, match="max_seqlen"):
        flashcore.attention(q, k, k, cu_seqlens_q=[0, 10], cu_seqlens_k=[0, 10], max_seqlen_q=4,
                            max_seqlen_k=10)


def test_strided_inputs_and_out_argument():
    rng = np.random.default_rng(5)
    # Heads padded: a slice of a wider array (non-contiguous, last dim contiguous).
    big = randn(rng, (2, 24, 6, 80), "f32")
    q = big[:, :, 1:5, 8:72]
    k = randn(rng, (2, 30, 4, 64), "f32")[:, ::1]
    v = np.ascontiguousarray(randn(rng, (2, 4, 30, 64), "f32").transpose(0, 2, 1, 3))
    out = np.full(q.shape, np.nan, dtype=np.float32)
    res = flashcore.attention(q, k, v, out=out)
    assert res is out
    r_out, _ = ref.attention(q, k, v)
    ref.check(out, None, r_out, None, "f32")
    # out may itself be strided
    wide = np.full((2, 24, 4, 128), np.nan, dtype=np.float32)
    flashcore.attention(q, k, v, out=wide[:, :, :, :64])
    ref.check(wide[:, :, :, :64], None, r_out, None, "f32")
    assert np.all(np.isnan(wide[:, :, :, 64:])), "wrote outside out"


def test_library_errors_carry_the_librarys_message():
    rng = np.random.default_rng(1)
    q = randn(rng, (1, 8, 4, 64), "f32")
    k_d = randn(rng, (1, 8, 4, 32), "f32")
    out = np.full(q.shape, 7.0, dtype=np.float32)
    with pytest.raises(flashcore.InvalidArgumentError) as e:
        flashcore.attention(q, k_d, k_d, out=out)
    assert e.value.status == 1 and e.value.status_name == "FC_ERR_INVALID_ARGUMENT"
    assert "k head_dim 32 differs from q head_dim 64" in str(e.value)
    assert np.all(out == 7.0), "a failed call wrote out"

    k3 = randn(rng, (1, 8, 3, 64), "f32")
    with pytest.raises(flashcore.InvalidArgumentError, match=r"heads_q 4 is not a multiple of heads_kv 3"):
        flashcore.attention(q, k3, k3)
    k = randn(rng, (1, 8, 4, 64), "f32")
    with pytest.raises(flashcore.InvalidArgumentError, match="softcap"):
        flashcore.attention(q, k, k, softcap=-1.0)
    with pytest.raises(flashcore.InvalidArgumentError, match="window"):
        flashcore.attention(q, k, k, window=(-2, 0))
    with pytest.raises(flashcore.InvalidArgumentError, match="contradictory"):
        flashcore.attention(q, k, k, causal=True, window=(-1, 4))
    with pytest.raises(flashcore.InvalidArgumentError, match="out overlaps q"):
        flashcore.attention(q, k, k, out=q)
    # Errors are also ValueErrors, and FlashCoreErrors.
    with pytest.raises(ValueError):
        flashcore.attention(q, k3, k3)
    with pytest.raises(flashcore.FlashCoreError):
        flashcore.attention(q, k3, k3)


def test_binding_checks_before_calling():
    rng = np.random.default_rng(2)
    q = randn(rng, (1, 8, 4, 64), "f32")
    k = randn(rng, (1, 8, 4, 64), "f32")
    cases = [
        (dict(q=q.astype(np.int32)), "dtype int32 is not supported"),
        (dict(k=k.astype(np.float16)), "k: dtype float16 differs from q's float32"),
        (dict(q=np.asfortranarray(q)), "last dimension (head_dim) must be contiguous"),
        (dict(q=q[..., ::-1]), "negative strides"),
        (dict(q=q[0]), "expected a 4-D tensor"),
        (dict(q=[[1.0]]), "expected a numpy array or a torch tensor"),
        (dict(out=np.empty((1, 8, 4, 32), np.float32)), "out: shape"),
        (dict(out=np.empty(q.shape, np.float16)), "out: dtype"),
        (dict(backend="cuda"), "q, k, v are in host memory"),
        (dict(backend="gpu"), "backend: expected one of"),
        (dict(layout="sbhd"), "layout: expected"),
        (dict(window=5), "window: expected (left, right)"),
        (dict(cu_seqlens_q=[0, 8]), "give both or neither"),
        (dict(cuda_path=70), "cuda_path"),
    ]
    for kw, msg in cases:
        args = dict(q=q, k=k, v=k)
        args.update(kw)
        qq, kk, vv = args.pop("q"), args.pop("k"), args.pop("v")
        with pytest.raises(flashcore.InvalidArgumentError) as e:
            flashcore.attention(qq, kk, vv, **args)
        assert msg in str(e.value), (kw, str(e.value))
        assert e.value.status == 1


def test_supported():
    rng = np.random.default_rng(4)
    q = randn(rng, (1, 8, 4, 64), "f16")
    k = randn(rng, (1, 8, 2, 64), "f16")
    ok, name = flashcore.supported(q, k, k, causal=True)
    assert ok and name
    ok, why = flashcore.supported(q, k[..., :32], k[..., :32])
    assert not ok and "head_dim" in why
    ok, why = flashcore.supported(q, k, k, backend="cuda")
    assert not ok and "host memory" in why
    ok, why = flashcore.supported(q.astype(np.int32), k, k)
    assert not ok and "int32" in why
    ok, why = flashcore.supported(q.astype(np.float64), k.astype(np.float64), k.astype(np.float64),
                                  backend="cpu")
    assert not ok and "f64" in why


def test_version_matches_library_header_and_metadata():
    v = flashcore.__version__
    lib = _lib.load()
    assert v == lib.fc_version_string().decode()
    major, minor, patch = (int(x) for x in v.split(".")[:3])
    assert flashcore.version_number() == major * 10000 + minor * 100 + patch
    assert v in flashcore.build_info()
    if HEADER.is_file():
        m = re.search(r'#define\s+FLASHCORE_VERSION_STRING\s+"([^"]+)"', HEADER.read_text())
        assert m and m.group(1) == v
    from importlib.metadata import PackageNotFoundError, distribution
    try:
        dist = distribution("flashcore")
    except PackageNotFoundError:
        return  # running from the source tree, nothing installed
    installed = Path(dist.locate_file("flashcore/__init__.py")).resolve()
    if installed == Path(flashcore.__file__).resolve():  # metadata of the package under test
        assert dist.version == v


def _c_fields(struct_name):
    text = HEADER.read_text()
    body = re.search(r"typedef struct %s \{(.*?)\} %s;" % (struct_name, struct_name), text, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    names = []
    for decl in body.split(";"):
        decl = decl.strip()
        if not decl:
            continue
        # "fc_tensor q, k, v, out, lse" / "const float *q_descale, *k_descale" / "char name[96]"
        head, _, rest = decl.partition(",")
        first = re.findall(r"\**\s*(\w+)\s*(?:\[\d+\])?$", head)[0]
        names.append(first)
        for extra in rest.split(",") if rest else []:
            names.append(re.sub(r"[\s*]|\[\d+\]", "", extra))
    return names


@pytest.mark.skipif(not HEADER.is_file(), reason="not in a source checkout")
@pytest.mark.parametrize("struct", ["fc_tensor", "fc_attention_args", "fc_attention_backward_args",
                                    "fc_kernel_info", "fc_host_profile"])
def test_ctypes_structs_mirror_the_header(struct):
    py = [f[0] for f in getattr(_lib, struct)._fields_]
    assert py == _c_fields(struct), "update flashcore/_lib.py to match include/flashcore.h"


def test_args_init_defaults():
    a = _lib.new_args(_lib.load())
    assert (a.window_left, a.window_right, a.backend, a.scale, a.num_seqs) == (-1, -1, 0, 0.0, 0)
    assert not a.q.data and not a.cu_seqlens_q


def test_status_mapping():
    classes = {1: flashcore.InvalidArgumentError, 2: flashcore.UnsupportedError,
               3: flashcore.OutOfMemoryError, 4: flashcore.CudaError, 5: flashcore.NoDeviceError,
               6: flashcore.InternalError, 99: flashcore.InternalError}
    for st, cls in classes.items():
        e = error_for_status(st, "why")
        assert type(e) is cls and isinstance(e, flashcore.FlashCoreError)
        assert e.status == st and str(e) == "why"
    lib = _lib.load()
    for st, name in STATUS_NAMES.items():
        assert lib.fc_status_string(st).decode().startswith(name)


def test_no_cuda_in_this_build_is_reported_not_raised():
    if flashcore.cuda_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(flashcore.NoDeviceError) as e:
        flashcore.device_info()
    assert e.value.status == 5 and str(e.value)


def test_one_context_per_thread_and_concurrent_calls():
    rng = np.random.default_rng(9)
    q, k, v = make_qkv(rng, 1, 64, 64, 4, 4, 64, "f32", "bshd")
    r_out, _ = ref.attention(q, k, v, causal=True)
    results, contexts, errors = {}, {}, []
    alive = threading.Barrier(4)  # a finished thread frees its context: its address may be reused

    def work(i):
        try:
            flashcore.set_num_threads(1 + i % 2)
            for _ in range(3):
                results[i] = flashcore.attention(q, k, v, causal=True)
            contexts[i] = flashcore._context.context().handle.value
        except Exception as e:  # reported below: threads cannot raise into pytest
            errors.append(e)
        alive.wait(timeout=60)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(set(contexts.values())) == 4
    for out in results.values():
        ref.check(out, None, r_out, None, "f32")


def test_set_num_threads_rejects_negative_with_library_message():
    with pytest.raises(flashcore.InvalidArgumentError, match="num_threads -1"):
        flashcore.set_num_threads(-1)
    flashcore.set_num_threads(0)


def test_missing_library_is_a_clear_error():
    env = dict(os.environ, FLASHCORE_LIBRARY="/nonexistent/libflashcore.so")
    code = ("import flashcore\n"
            "try:\n    flashcore.__version__\n"
            "except flashcore.LibraryNotFoundError as e:\n    print('ERR', e)\n")
    pkg_parent = str(Path(flashcore.__file__).resolve().parents[1])
    env["PYTHONPATH"] = pkg_parent + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert "ERR libflashcore could not be loaded" in res.stdout, res.stdout + res.stderr
    assert "/nonexistent/libflashcore.so (not found)" in res.stdout


def test_torch_cpu_tensors_if_torch_is_installed():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 24, 64, generator=g, dtype=torch.bfloat16)   # BHSD
    k = torch.randn(2, 2, 30, 64, generator=g, dtype=torch.bfloat16)
    v = torch.randn(2, 2, 30, 64, generator=g, dtype=torch.bfloat16)
    out, lse = flashcore.attention(q, k, v, causal=True, layout="bhsd", return_lse=True)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == torch.bfloat16
    f = lambda t: t.float().numpy().transpose(0, 2, 1, 3)  # noqa: E731
    r_out, r_lse = ref.attention(f(q), f(k), f(v), causal=True)
    ref.check(f(out), lse.numpy(), r_out, r_lse, "bf16")
